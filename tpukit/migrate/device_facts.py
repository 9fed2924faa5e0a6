"""Facts about the script's device, shared by every device rule: which names hold the
device in the current scope, what the target's device is (as the device rule TPU101 maps
it), and whether the current code runs when a package module is imported.

The traversal feeds them through `visit_<Node>`/`leave_<Node>` methods, dispatched by node
type as rules' hooks are (the engine knows no device rule); a rule reads them.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from tpukit.migrate.import_time import import_time_functions
from tpukit.migrate.names import Names
from tpukit.migrate.nodes import dotted, is_cuda_device_string
from tpukit.rules import load_rules

DEVICE_CALLS = {
    "torch.device",
    "torch_xla.device",
    "torch_xla.core.xla_model.xla_device",
    "torch.accelerator.current_accelerator",
}
# The calls that ask whether the CUDA device (or an accelerator) is there.
AVAILABILITY = frozenset({"torch.cuda.is_available", "torch.accelerator.is_available"})


def is_availability_test(ctx, expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Call) and ctx.qualify(expr.func) in AVAILABILITY


def is_accelerator_value(ctx, expr: cst.BaseExpression) -> bool:
    """A CUDA/accelerator device, as a string or a device object."""
    if is_cuda_device_string(expr):
        return True
    if isinstance(expr, cst.Call):
        name = ctx.qualify(expr.func)
        if name == "torch.accelerator.current_accelerator":
            return True
        if name == "torch.device" and expr.args:
            return is_cuda_device_string(expr.args[0].value)
    return False


def is_device_value(ctx, expr: cst.BaseExpression) -> bool:
    """Does `expr` evaluate to the script's device (for `.cuda()` -> `.to(device)`)?"""
    if isinstance(expr, cst.Call):
        return ctx.qualify(expr.func) in DEVICE_CALLS or dotted(expr.func) == "torch_xla.device"
    if isinstance(expr, cst.IfExp):
        return is_accelerator_value(ctx, expr.body) or is_device_value(ctx, expr.body)
    return False


def _is_none(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


class DeviceFacts:
    def __init__(self, target: str, path: str, source: str, names: Names, need_import) -> None:
        self.names = names
        self.source = source
        self._need_import = need_import  # the edit sink's: the device module, when named
        # Names bound to the script's device, innermost scope last, in the order bound.
        self.scopes: list[dict[str, None]] = [{}]
        self.values = None  # the file's Values (analysis/values.py), set by the context
        self._branch_blocks: set[int] = set()  # id() of if/else/loop bodies: scopes of their own
        self._elifs: set[int] = set()
        self._bound_in: dict[int, dict] = {}  # id(body or elif) -> device names it bound
        # The target's device, as the device rule (TPU101) maps it: an object, what `.to()`
        # and `device=` take when the script has no device variable, and the type string.
        device = load_rules()["TPU101"].target(target)
        self.device_object_in_code: str = device["replace"]
        self._device_move: str = device.get("move_to", self.device_object_in_code)
        # What names the device without starting the runtime (`torch.device("xla")`), for
        # code a package module runs when it is imported.
        self._device_at_import: str = device.get("at_import", self.device_object_in_code)
        self.device_type: str = device["device_type"]
        self.device_module: str = device["imports"][0]
        # A module of a package runs its top level, its defaults and decorators when it is
        # imported: the XLA runtime must not start there (a script's top level is its program).
        name = Path(path).name if path else ""
        self.package_module = bool(path) and (
            name == "__init__.py" or (Path(path).parent / "__init__.py").is_file())
        self.header_depth = 0  # inside parameters (defaults) and decorators of `functions`
        self.module: cst.Module | None = None  # the file, for the functions run at import
        self._import_time: dict[str, str] | None = None

    # -- what a rule reads ------------------------------------------------------------
    def at_import_time(self) -> bool:
        """Does the current code run when this package module is imported (its top level, or
        a module-level function its top level calls)?"""
        return self.import_time_reason() is not None

    def import_time_reason(self) -> str | None:
        """Why the current code runs when this package module is imported, or None: "" for
        its top level (defaults and decorators included), else which function and why."""
        if not self.package_module:
            return None
        functions = self.names.functions
        if len(functions) == self.header_depth:
            return ""
        if len(functions) - self.header_depth != 1 or self.module is None:
            return None
        if self._import_time is None:
            self._import_time = import_time_functions(self.module)
        outer = functions[0]
        return self._import_time.get(outer.name.value) if isinstance(outer, cst.FunctionDef) \
            and any(s is outer for s in self.module.body) else None

    @property
    def device_object(self) -> str:
        """The target's device, as the device rule (TPU101) maps it."""
        if self.at_import_time():
            self._need_import(self.device_module)
            return self._device_at_import
        return self.device_object_in_code

    @property
    def device_move(self) -> str:
        """What `.to()` and `device=` take when the script has no device variable."""
        return self.device_object if self.at_import_time() else self._device_move

    def in_scope(self) -> str | None:
        """The device variable in scope (the innermost scope's first bound), if any."""
        for scope in reversed(self.scopes):
            if scope:
                return next(iter(scope))
        return None

    def bind(self, name: str) -> None:
        self.scopes[-1][name] = None

    def _holds_device(self, value: cst.BaseExpression) -> bool:
        """A device object: made by a device call, or carried to here by the dataflow (a
        choice between device strings, a device a function returns). A bare string stays a
        string (`.to(device)` would get it as written either way)."""
        if is_device_value(self.names, value):
            return True
        if isinstance(value, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString,
                              cst.IfExp)) or self.values is None:
            return False
        kinds = self.values.kinds(value)
        return "device" in kinds and "string" not in kinds

    # -- what the traversal tells -----------------------------------------------------
    def visit_Assign(self, node: cst.Assign) -> None:
        if self._holds_device(node.value):
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    self.bind(target.target.value)

    def visit_FunctionDef(self, node: cst.FunctionDef | cst.Lambda) -> None:
        params = node.params.posonly_params + node.params.params + node.params.kwonly_params
        # A parameter that holds a device, by what its callers give it, its default, its
        # annotation or what the function does with it; `device=None` is no device:
        # `.cuda(device)` there means the current one. A CUDA string default that nothing uses
        # as a device stays as written (TPU101 ports only one that is used): `.to(device)`
        # would move to CUDA.
        self.scopes.append({p.name.value: None for p in params if not _is_none(p.default)
                            and self.values is not None
                            and "device" in self.values.parameter_kinds(node, p)
                            and not self._unported_default(p)})

    visit_Lambda = visit_FunctionDef

    def _unported_default(self, param: cst.Param) -> bool:
        return (param.default is not None and is_cuda_device_string(param.default)
                and not self.values.used_as_device_string(param.name))

    def leave_FunctionDef(self, node) -> None:
        self.scopes.pop()

    leave_Lambda = leave_FunctionDef

    def visit_Param(self, node) -> None:
        self.header_depth += 1  # evaluated where the def is, not when it is called

    visit_Decorator = visit_Param

    def leave_Param(self, node) -> None:
        self.header_depth -= 1

    leave_Decorator = leave_Param

    # A device name bound inside an if/else branch or a loop body is in scope there only; after
    # an `if` whose every branch (an `else` included) binds it, it is in scope again. The
    # ImageNet example binds `device` in an `elif` and its `else` branch has none.
    def visit_If(self, node: cst.If | cst.For | cst.While) -> None:
        self._branch_blocks.add(id(node.body))
        if isinstance(node.orelse, cst.Else):
            self._branch_blocks.add(id(node.orelse.body))
        elif isinstance(node, cst.If) and isinstance(node.orelse, cst.If):
            self._elifs.add(id(node.orelse))

    visit_For = visit_While = visit_If

    def visit_IndentedBlock(self, block: cst.BaseSuite) -> None:
        if id(block) in self._branch_blocks:
            self.scopes.append({})

    visit_SimpleStatementSuite = visit_IndentedBlock

    def leave_IndentedBlock(self, block: cst.BaseSuite) -> None:
        if id(block) in self._branch_blocks:
            self._branch_blocks.discard(id(block))
            self._bound_in[id(block)] = self.scopes.pop()

    leave_SimpleStatementSuite = leave_IndentedBlock

    def leave_For(self, node: cst.For | cst.While) -> None:
        """A loop body may not run: what it bound stays in it."""
        self._bound_in.pop(id(node.body), None)
        if isinstance(node.orelse, cst.Else):
            self._bound_in.pop(id(node.orelse.body), None)

    leave_While = leave_For

    def leave_If(self, node: cst.If) -> None:
        """The names every branch of this if/elif/else chain binds, bound after it."""
        bound = self._bound_in.pop(id(node.body), {})
        if isinstance(node.orelse, cst.Else):
            other = self._bound_in.pop(id(node.orelse.body), {})
        elif isinstance(node.orelse, cst.If):
            other = self._bound_in.pop(id(node.orelse), {})
        else:
            other = {}
        bound = {name: None for name in bound if name in other}
        if id(node) in self._elifs:
            self._elifs.discard(id(node))
            self._bound_in[id(node)] = bound  # for the `if` this is the elif of
        else:
            self.scopes[-1].update(bound)
