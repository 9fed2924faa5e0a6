"""Devices: CUDA device objects and strings, `.cuda()`, `.is_cuda`, device-type checks.

Two worlds, kept apart so the migrated script keeps its types:
- a device *object* (`torch.device("cuda")`, `"cuda" if torch.cuda.is_available() else "cpu"`,
  `device="cuda"` arguments, `.to("cuda")`) becomes the XLA device, `torch_xla.device()`
  (or the script's own device variable when one is in scope);
- a device *string* the script keeps as a string (`device = 'cuda'` config values, argparse
  defaults, `device_type == 'cuda'`, `'cuda' in device`) becomes `'xla'`, which torch accepts
  everywhere a device string goes once torch_xla is imported.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate.context import (
    dotted,
    find_keyword,
    is_cpu_device,
    is_cuda_device_string,
    string_value,
    with_string,
)
from tpukit.migrate.device_facts import (  # noqa: F401 - device facts; rules import them here
    DEVICE_CALLS,
    is_accelerator_value,
    is_device_value,
)
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.values import destination as _option_destination
from tpukit.migrate.nodes import walk
from tpukit.migrate.transforms.base import Transform, transform

AVAILABILITY = {"torch.cuda.is_available", "torch.accelerator.is_available"}
def is_availability_test(ctx, expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Call) and ctx.qualify(expr.func) in AVAILABILITY


def holds_a_device_string(ctx, expr: cst.BaseExpression) -> bool:
    """Can the variable `expr` reads (a name, an attribute, `str(device)`) hold a device
    string such as "cuda"? Decided by where its value goes, not by its name: not when it is a
    process group's backend, nor the name of an attribute (`getattr(torch, device)` reads
    `torch.cuda`)."""
    if isinstance(expr, cst.Call) and dotted(expr.func) == "str" and len(expr.args) == 1:
        expr = expr.args[0].value  # 'cuda' in str(device)
    if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
        return False  # `"cuda" == "cuda"` compares two constants
    values = ctx.values
    return not (values.uses_of(K.BACKEND, expr) or K.BACKEND in values.kinds(expr)
                or values.used_as_attribute_name(expr))


def _texts_around_a_device(parts) -> bool:
    """f"{'cuda' if c else 'cpu'}" and f"{...}:{rank}" name a device; the text of
    f"{...}_time_total" (a profiler sort key) says it is a name of something else."""
    return all(p.value in ("", ":") for p in parts if isinstance(p, cst.FormattedStringText))


def device_string(ctx, expr: cst.BaseExpression) -> cst.BaseExpression:
    """The target's device type ('xla', 'tpu') in place of a CUDA device string."""
    if isinstance(expr, cst.SimpleString):
        return with_string(expr, ctx.device_type)
    return ctx.expr(f'"{ctx.device_type}"')


def need_device_module(ctx) -> None:
    """Device strings work once the target's module is imported (`torch_xla`, `torch_tpu`)."""
    ctx.need_import(ctx.device_module)


@transform("TPU101")
class CudaDevice(Transform):
    reads_device_facts = True

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.not_devices: set[int] = set()  # id() of expressions that build a non-device name
        self.choices: set[int] = set()  # id() of the CUDA-or-CPU choices visit_IfExp said
        self._returned: dict[int, cst.CSTNode] = {}  # id(IfExp returned) -> its function
        self._keywords: dict[int, str] = {}  # id(IfExp given by keyword or dict key) -> the key
        self.argparse_defaults: set[int] = set()  # id() of `add_argument(default=...)` values

    def _to_xla_device(self, node: cst.CSTNode):
        message = self.say("object", code=self.ctx.short(node))
        device = self.ctx.device_object
        if self.ctx.at_import_time() and device != self.ctx.device_object_in_code:
            message += self.say("object_at_import", device=device)
        return self.fix_or_report(node, message, lambda: self.ctx.expr(device))

    def _string_to_xla(self, node: cst.BaseExpression, context: str):
        """`context`: where the string stands, a message (`self.say("in_setting")`)."""
        def build():
            need_device_module(self.ctx)
            return device_string(self.ctx, node)

        return self.fix_or_report(
            node, self.say("string", code=self.ctx.short(node), context=context), build)

    def visit_Call(self, node: cst.Call):
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument":
            default = find_keyword(node, "default")
            if default is not None:
                self.argparse_defaults.add(id(default.value))
        if self.ctx.qualify(node.func) != "torch.device" or not node.args:
            return None
        first = node.args[0].value
        whole = is_cuda_device_string(first) or (
            isinstance(first, cst.IfExp)
            and is_availability_test(self.ctx, first.test)
            and is_accelerator_value(self.ctx, first.body)
            and is_cpu_device(first.orelse)
        )
        if whole and isinstance(first, cst.IfExp) and self._library_choice(node):
            return None
        return self._to_xla_device(node) if whole else None

    def _library_choice(self, node: cst.CSTNode) -> bool:
        """`"cuda" if torch.cuda.is_available() else "cpu"` in library code: the CPU on a
        TPU host, as before (transformers' SageMaker arguments put the Trainer on XLA)."""
        return self.library_leaves(node, "cuda_or_cpu", lambda: self.say(
            "library_choice", code=self.ctx.short(node)))

    def visit_IfExp(self, node: cst.IfExp):
        if (
            is_availability_test(self.ctx, node.test)
            and is_accelerator_value(self.ctx, node.body)
            and is_cpu_device(node.orelse)
        ):
            self.choices.add(id(node))  # said here, whole: leave_IfExp leaves its parts
            if self._library_choice(node):
                return None
            kept = self._kept_as_string(node)
            return self._to_xla_device(node) if kept is None else self._string_choice(node, kept)
        return None

    # -- a device choice of strings that the script reads as a string ---------------------
    # `device = "cuda" if torch.cuda.is_available() else "cpu"` holds a string. Where the file
    # compares it as one (`if device == "cuda":`, which becomes `== "xla"`), it must stay a
    # string: `torch_xla.device() == "xla"` is False and the guarded code never runs.
    def _read_back_as(self, node: cst.IfExp) -> list[cst.BaseExpression]:
        """The variables a choice is read back as: what it is assigned to, and what the
        calls of a function that returns it are assigned to."""
        values = self.ctx.values
        found = list(values.assigned_to(node))
        function = self._returned.get(id(node))
        if isinstance(function, cst.FunctionDef):
            found += values.callers_targets(function)
        return found

    def visit_Return(self, node: cst.Return):
        if isinstance(node.value, cst.IfExp) and self.ctx.functions:
            self._returned[id(node.value)] = self.ctx.functions[-1]

    def visit_Arg(self, node: cst.Arg):
        if node.keyword is not None and isinstance(node.value, cst.IfExp):
            self._keywords[id(node.value)] = node.keyword.value

    def visit_DictElement(self, node: cst.DictElement):
        key = string_value(node.key)
        if key is not None and isinstance(node.value, cst.IfExp):
            self._keywords[id(node.value)] = key  # `{"device": ...}`, read as `cfg["device"]`

    def _kept_as_string(self, node: cst.IfExp) -> str | None:
        """Why this choice of device strings stays a string, or None when it may become the
        device object: an argparse default (what the command line gives is a string too), or
        a variable it is read back as that the file uses as a string."""
        if not isinstance(node.body, (cst.SimpleString, cst.FormattedString)):
            return None  # `torch.device("cuda") if ... else ...`: an object already
        if id(node) in self.argparse_defaults:
            return self.say("kept_default")
        values = self.ctx.values
        used = next((t for t in self._read_back_as(node) if values.used_as_string(t)), None)
        if used is not None:
            return self.say("kept_used", name=self.ctx.short(used))
        keyword = self._keywords.get(id(node))
        if keyword is not None and values.key_used_as_string(keyword):
            # `Config(device=...)` read back as `config.device`, `{"device": ...}` as
            # `cfg["device"]`, and compared as a string
            return self.say("kept_used", name=keyword)
        return None

    def _string_choice(self, node: cst.IfExp, why: str):
        def build():
            need_device_module(self.ctx)
            return device_string(self.ctx, node.body)

        return self.fix_or_report(
            node, self.say("kept_string", code=self.ctx.short(node), why=why), build)

    def visit_FormattedString(self, node: cst.FormattedString):
        if not _texts_around_a_device(node.parts):
            self.not_devices.update(id(p.expression) for p in node.parts
                                    if isinstance(p, cst.FormattedStringExpression))

    def visit_BinaryOperation(self, node: cst.BinaryOperation):
        # ("cuda" if c else "cpu") + "_time_total": a name built from it, not a device
        if isinstance(node.operator, cst.Add):
            for side, other in ((node.left, node.right), (node.right, node.left)):
                text = string_value(other)
                if text is not None and text not in ("", ":") and not text.startswith(":"):
                    self.not_devices.add(id(side))

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp):
        # `"cuda" if use_cuda else "cpu"`: the user's condition stays, the type becomes xla.
        if id(original) in self.not_devices or id(original) in self.choices:
            return None
        if isinstance(original.body, cst.SimpleString) and is_cuda_device_string(original.body):
            new_body = self._string_to_xla(original.body, self.say("in_choice"))
            if new_body is not None:
                return updated.with_changes(body=new_body)
        return None

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        ctx = self.ctx
        args = list(updated.args)
        changed = False
        is_to = isinstance(original.func, cst.Attribute) and original.func.attr.value == "to"
        is_add_argument = (
            isinstance(original.func, cst.Attribute) and original.func.attr.value == "add_argument"
        )
        for i, (old, new) in enumerate(zip(original.args, updated.args)):
            keyword = old.keyword.value if old.keyword else None
            if not is_cuda_device_string(old.value):
                continue
            replacement = None
            if keyword == "device" or (is_to and i == 0 and keyword is None):
                replacement = self.fix_or_report(
                    old.value, self.say("argument", code=ctx.short(old.value)), ctx.device_expr)
            elif is_add_argument and keyword == "default" and self._option_holds_device(original):
                replacement = self._string_to_xla(old.value, self.say("in_default"))
            if replacement is not None:
                args[i] = new.with_changes(value=replacement)
                changed = True
        return updated.with_changes(args=args) if changed else None

    def _option_holds_device(self, call: cst.Call) -> bool:
        """An argparse option whose default is a CUDA device string holds a device string,
        unless the program gives it where a backend goes, or reads it as an attribute name."""
        dest = _option_destination(call)
        if dest is None or self.ctx.values.option_is_not_a_device(dest):
            return False
        uses = self.ctx.values.option_uses(dest)
        return K.DEVICE in uses or self.ctx.values.option_used_as_string(dest)

    def _assigned_string(self, targets, original_value, updated):
        if not isinstance(original_value, (cst.SimpleString, cst.FormattedString)):
            return None
        if not is_cuda_device_string(original_value):
            return None
        if not all(holds_a_device_string(self.ctx, t) for t in targets) or not any(
                self.ctx.values.used_as_device_string(t) for t in targets):
            return None  # not a device's name, or not used as one
        if self._names_a_module(original_value, targets):
            return None
        new_value = self._string_to_xla(original_value, self.say("in_setting"))
        return None if new_value is None else updated.with_changes(value=new_value)

    def _names_a_module(self, value: cst.BaseExpression, targets) -> bool:
        """`device = "cuda"` read by `getattr(torch, device)`: the string names torch.cuda;
        'xla' would name nothing. Left as it is, for a person."""
        used = [t for t in targets if self.ctx.values.used_as_attribute_name(t)]
        if used:
            self.ctx.report(self.rule, value, self.say(
                "attribute_name", name=self.ctx.short(used[0]), value=self.ctx.code(value)),
                applied=False, fix=FixKind.NONE)
        return bool(used)

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        return self._assigned_string([t.target for t in original.targets], original.value, updated)

    def leave_AnnAssign(self, original: cst.AnnAssign, updated: cst.AnnAssign):
        if original.value is None:
            return None
        return self._assigned_string([original.target], original.value, updated)

    def leave_Param(self, original: cst.Param, updated: cst.Param):
        if original.default is None or not is_cuda_device_string(original.default):
            return None
        if not holds_a_device_string(self.ctx, original.name) or not \
                self.ctx.values.used_as_device_string(original.name):
            return None
        if self._names_a_module(original.default, [original.name]):
            return None
        new_default = self._string_to_xla(original.default, self.say("in_parameter"))
        return None if new_default is None else updated.with_changes(default=new_default)


# Tensor.cuda(device=None, non_blocking=False, memory_format=...) and Module.cuda(device=None)
_CUDA_METHOD_KEYWORDS = frozenset({"device", "non_blocking", "memory_format"})


def _torch_cuda_signature(call: cst.Call) -> bool:
    """Whether `x.cuda(...)`'s arguments fit torch's `.cuda` (Tensor's or Module's): at most
    device and non_blocking by position, no other keyword, no device given twice; a splat
    could hold anything torch takes."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    return (len(positional) <= 2 and keywords <= _CUDA_METHOD_KEYWORDS
            and not (positional and "device" in keywords)
            and not (len(positional) == 2 and "non_blocking" in keywords))


@transform("TPU102")
class CudaMethod(Transform):
    reads_device_facts = True

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        func = original.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "cuda":
            return None
        receiver = self.ctx.qualify(func.value)
        if receiver is not None and receiver.split(".")[0] in ("torch", "torch_xla"):
            return None  # a module attribute, not Tensor/Module.cuda()
        own = self._own_cuda(func.value)
        if own is None and not _torch_cuda_signature(original):
            # transformers' quantized cache: `self.quantizer.cuda(qtensor, meta=meta,
            # device=...)` is HQQ's own method; as `.to(device, meta=meta)` it lost qtensor
            message = self.say("method", code=self.ctx.short(original))
            self.ctx.report(self.rule, original, message + self.say("other_signature"),
                            applied=False, fix=FixKind.NONE)
            return None
        if own is not None:
            message = self.say("method", code=self.ctx.short(original))
            self.ctx.report(self.rule, original, message + self.say(
                "own_method", receiver=self.ctx.code(func.value), cls=own[0], module=own[1]),
                applied=False, fix=FixKind.NONE)
            return None

        def build():
            kept = [
                a
                for a in updated.args
                if a.keyword is not None and a.keyword.value not in ("device",)
            ]
            device = cst.Arg(self.ctx.device_expr())
            args = [device, *kept]
            args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
            return updated.with_changes(
                func=updated.func.with_changes(attr=cst.Name("to")), args=args
            )

        return self.fix_or_report(original, self.say("method", code=self.ctx.short(original)),
                                  build)

    def _own_cuda(self, receiver: cst.BaseExpression) -> tuple[str, str] | None:
        """(class, its module) when the enclosing function tests the receiver with
        `isinstance(receiver, C)` and C comes from a package other than torch: that class's
        `.cuda` may be its own method, not torch's (hqq's `HQQLinear.cuda(device)` moves to any
        device, CPU included, and transformers' `to()` calls it so), and `.to(xla)` would not
        do what it does. A class of this file or a relative import is taken for a Module."""
        name = dotted(receiver)
        if name is None:
            return None
        for cls in _isinstance_classes(self.ctx, name):
            root, _, rest = cls.partition(".")
            full = self.ctx.aliases.get(root)  # `HQQLinear` -> hqq.core.quantize.HQQLinear
            if full is not None and full.split(".")[0] not in ("torch", "torchvision"):
                # the module it comes from: hqq.core.quantize; `bnb.nn.X` -> bitsandbytes
                return cls, full if rest else full.rpartition(".")[0] or full
        return None


class _IsCudaChecks(cst.CSTVisitor):
    """The `.is_cuda` attributes in an expression."""

    def __init__(self) -> None:
        self.found: list[cst.Attribute] = []

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "is_cuda":
            self.found.append(node)


def _names_a_device(expr: cst.BaseExpression) -> bool:
    return is_cuda_device_string(expr) or string_value(expr) in ("cpu", "meta", "xla", "mps")


@transform("TPU103")
class IsCuda(Transform):
    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.choices: dict[int, tuple[str, str]] = {}  # id(`.is_cuda`) -> the two strings it picks

    def visit_IfExp(self, node: cst.IfExp) -> None:
        # `driver = "gels" if a.is_cuda else "gelsd"` (torch._numpy's lstsq): the check picks a
        # CUDA kernel or driver by name, not a device; on TPU the non-CUDA choice is the one
        # that exists, and the check, False there, already makes it.
        body, orelse = string_value(node.body), string_value(node.orelse)
        if body is None or orelse is None or _names_a_device(node.body) or _names_a_device(node.orelse):
            return
        checks = _IsCudaChecks()
        node.test.visit(checks)
        for attribute in checks.found:
            self.choices[id(attribute)] = (body, orelse)

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        if original.attr.value != "is_cuda" or self.ctx.qualify(original.value):
            return None
        if self.ctx.code(original) in self.ctx.values.attribute_targets:
            return None  # `self.is_cuda = ...`: the object's own flag, not Tensor.is_cuda
        choice = self.choices.pop(id(original), None)
        if choice is not None:
            self.ctx.report(self.rule, original, self.say(
                "choice", code=self.ctx.short(original), a=choice[0], b=choice[1]),
                applied=False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        if self.library_keeps_cuda_check(original, original):
            return None

        def build():
            if "attribute" in self.mapping:  # `.is_xla`
                return updated.with_changes(attr=cst.Name(self.mapping["attribute"]))
            # No `is_<device>` property: `x.device.type == "tpu"` (binds tighter than not/and/or).
            return self.ctx.expr(self.mapping["expression"].format(self.ctx.code(updated.value)))

        replacement = self.fix_or_report(
            original, self.say("check", code=self.ctx.short(original)), build)
        if replacement is not None:
            self.ctx.add_guard(replacement, original)
        return replacement


@transform("TPU104")
class DeviceTypeComparison(Transform):
    _OPERATORS = (cst.Equal, cst.NotEqual, cst.In, cst.NotIn)

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.assigned: list[list[cst.BaseExpression]] = []
        self.fused_args = 0  # inside a `fused=` argument

    def visit_Assign(self, node: cst.Assign):
        self.assigned.append([t.target for t in node.targets])

    def leave_Assign(self, original, updated):
        self.assigned.pop()
        return None

    def visit_Arg(self, node: cst.Arg):
        if node.keyword is not None and node.keyword.value == "fused":
            self.fused_args += 1

    def leave_Arg(self, original, updated):
        if original.keyword is not None and original.keyword.value == "fused":
            self.fused_args -= 1
        return None

    def _picks_fused_kernels(self) -> bool:
        """`use_fused = device_type == 'cuda'` given as `fused=use_fused`: fused optimizers are
        CUDA kernels, which XLA does not have (it fuses the update itself): the check must
        stay False."""
        return bool(self.fused_args) or any(
            self.ctx.values.given_as(t, "fused") for targets in self.assigned for t in targets)

    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison):
        if self._picks_fused_kernels():
            return None
        left_old, left_new = original.left, updated.left
        new_left = left_new
        targets = list(updated.comparisons)
        changed = False
        for i, (old, new) in enumerate(zip(original.comparisons, updated.comparisons)):
            if not isinstance(old.operator, self._OPERATORS):
                left_old = old.comparator
                continue
            pairs = ((left_old, old.comparator, "left"), (old.comparator, left_old, "right"))
            for literal, other, side in pairs:
                if string_value(literal) != "cuda" or not holds_a_device_string(self.ctx, other):
                    continue  # a backend, or an attribute name that keeps its "cuda"
                if self.library_keeps_cuda_check(literal, original):
                    continue
                replacement = self.fix_or_report(
                    literal, self.say("comparison", code=self.ctx.short(original)),
                    lambda lit=literal: self._xla(lit))
                if replacement is not None:
                    changed = True
                    self.ctx.add_guard(replacement, literal, negated=isinstance(
                        old.operator, (cst.NotEqual, cst.NotIn)), shown=original)
                    if side == "left" and i == 0:
                        new_left = replacement
                    elif side == "right":
                        targets[i] = new.with_changes(comparator=replacement)
            left_old = old.comparator
        if not changed:
            return None
        return updated.with_changes(left=new_left, comparisons=targets)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        # `device.startswith("cuda")` (build-nanogpt's device_type): a comparison by method
        func = original.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "startswith"
                and len(original.args) == 1 and holds_a_device_string(self.ctx, func.value)):
            return None
        literal = original.args[0].value
        if string_value(literal) not in ("cuda", "cuda:"):
            return None
        if self.library_keeps_cuda_check(literal, original):
            return None
        replacement = self.fix_or_report(
            literal, self.say("comparison", code=self.ctx.short(original)),
            lambda: self._xla(literal))
        if replacement is None:
            return None
        self.ctx.add_guard(replacement, literal, shown=original)
        return updated.with_changes(args=[updated.args[0].with_changes(value=replacement)])

    def _xla(self, literal):
        need_device_module(self.ctx)
        return device_string(self.ctx, literal)


_FORKS_RNG = ("torch.random.fork_rng",)
# The calls that seed the device's generator already: a file that makes one needs no other.
_SEEDS_DEVICE = frozenset({"torch.cuda.manual_seed", "torch.cuda.manual_seed_all",
                           "torch_xla.manual_seed", "torch_xla.core.xla_model.set_rng_state",
                           "torch.cuda.set_rng_state", "torch.cuda.set_rng_state_all",
                           "torch.set_rng_state"})


@transform("TPU118")
class SeedXla(Transform):
    """`torch.manual_seed(s)` as a statement: `torch_xla.manual_seed(s)` after it, since the XLA
    device's generator is not torch's (unless the file seeds the XLA device already)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        # id() of the statements inside a `with torch.random.fork_rng(...)` (a set, not a
        # stack: a `with` another rule plans gets no leave hooks)
        self.in_fork: set[int] = set()

    def visit_With(self, node: cst.With) -> None:
        if any(isinstance(item.item, cst.Call) and self.ctx.qualify(item.item.func) in _FORKS_RNG
               for item in node.items):
            self.in_fork.update(id(n) for n in walk(node.body)
                                if isinstance(n, cst.SimpleStatementLine))

    def leave_SimpleStatementLine(self, original, updated):
        if len(original.body) != 1 or not isinstance(original.body[0], cst.Expr):
            return None
        call = original.body[0].value
        if not (isinstance(call, cst.Call) and call.args
                and self.ctx.qualify(call.func) == "torch.manual_seed"):
            return None
        if self.ctx.memo("seeds_xla", lambda: self.ctx.values.calls_any(_SEEDS_DEVICE)):
            return None
        if id(original) in self.in_fork:
            # peft's incremental PCA: fork_rng restores torch's generators when the block
            # ends, not the XLA device's: a seed added there would stay for the whole run
            self.ctx.report(self.rule, original, self.say("in_fork", code=self.ctx.short(call)),
                            False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        workers = self.ctx.values.worker_init_functions()
        if any(id(f) in workers for f in self.ctx.functions):
            return None  # a DataLoader worker's init: the XLA runtime must not start there
        if self.ctx.in_launcher():
            # SimSiam's main(): seeds, then `mp.spawn` (torch_xla.launch), which refuses to
            # start once the runtime is initialised ("Runtime is already initialized")
            self.ctx.report(self.rule, original, self.say("launcher", code=self.ctx.short(call)),
                            False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        if self.ctx.owner_leaves("TPU118", "seed"):
            # transformers' serving seeds each request, on whatever device its model is: a
            # CPU server on a TPU host started the XLA runtime (and claimed the TPU) there
            self.ctx.report(self.rule, original, self.say("library", code=self.ctx.short(call)),
                            False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        seed = updated.body[0].value.args[0].value

        def build():
            line = cst.SimpleStatementLine([cst.Expr(cst.Call(
                func=self.ctx.expr("torch_xla.manual_seed"), args=[cst.Arg(seed)]))])
            return cst.FlattenSentinel([updated, line])

        return self.fix_or_report(original, self.say("seed", code=self.ctx.short(call)), build)


def _isinstance_classes(ctx, name: str) -> list[str]:
    """The classes `isinstance(NAME, C)` tests in the enclosing function (or module) test
    `name` against, as written (`HQQLinear`, `bnb.nn.Linear4bit`): from its code, not its
    comments."""
    scope = ctx.functions[-1] if ctx.functions else ctx.module

    def compute() -> list[tuple[str, str]]:
        found = []
        for node in walk(scope):
            if isinstance(node, cst.Call) and dotted(node.func) == "isinstance" \
                    and len(node.args) == 2:
                tested = dotted(node.args[0].value)
                types = node.args[1].value
                elements = [e.value for e in types.elements] if isinstance(
                    types, (cst.Tuple, cst.List)) else [types]
                found += [(tested, dotted(e)) for e in elements if dotted(e)]
        return found

    return [cls for tested, cls in ctx.memo(("isinstance_tests", id(scope)), compute)
            if tested == name]
