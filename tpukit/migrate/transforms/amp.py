"""Mixed precision: fp16 autocast becomes bf16 autocast on XLA; GradScaler goes away.

TPUs compute in bfloat16, which has float32's exponent range: gradients do not underflow,
so loss scaling is not needed, and every GradScaler call has a plain equivalent.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.context import (
    dotted,
    find_keyword,
    keyword_arg,
    string_value,
    with_commas,
)
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.values import Assigned
from tpukit.migrate.nodes import first, walk
from tpukit.migrate.transforms.base import StatementPlan, Transform, transform

CUDA_AUTOCAST = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
DEVICE_AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}
GRAD_SCALERS = {
    "torch.cuda.amp.GradScaler",
    "torch.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
}
FP16 = {"torch.float16", "torch.half"}
SCALER_METHODS = ("scale", "step", "update", "unscale_", "state_dict", "load_state_dict",
                  "get_scale", "is_enabled")
_CLASS = re.compile(r"^class\s+(\w+)", re.M)
# A file that ties weights has this text (a sound prefilter; class_ties decides, on the tree).
_TIE = re.compile(r"\w\.[\w.]*weight\s*=\s*\(?\s*\w+\.[\w.]*weight")


@transform("TPU201")
class Autocast(Transform):
    """`torch.cuda.amp.autocast(...)`, `torch.autocast("cuda", ...)`, `torch.amp.autocast(
    device_type="cuda", dtype=torch.float16)` -> `torch.autocast("xla", dtype=torch.bfloat16)`,
    as a `with` item, a decorator or a value held in a variable; `enabled=` is kept."""

    claims = frozenset(CUDA_AUTOCAST)

    def _is_fp16(self, expr: cst.BaseExpression | None) -> bool:
        return expr is not None and self.ctx.qualify(expr) in FP16

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        """`amp_dtype = torch.float16`, later `torch.autocast(..., dtype=amp_dtype)` (timm's
        train.py, through functools.partial): the dtype autocast computes in, bfloat16 on TPU."""
        if not self._is_fp16(original.value) or not any(
                self.ctx.values.uses_of(K.AUTOCAST_DTYPE, t.target) for t in original.targets):
            return None
        if self.ctx.owner_leaves("TPU201", "float16_dtype"):
            return None  # a library's choice for its CUDA path
        return self.fix_or_report(
            original.value, self.say("float16_held", code=self.ctx.short(original)),
            lambda: updated.with_changes(
                value=cst.parse_expression(f"{self.ctx.torch_name()}.bfloat16")))

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        name = self.ctx.qualify(original.func)
        if name in CUDA_AUTOCAST:
            enabled = find_keyword(updated, "enabled")
            if enabled is None and updated.args and updated.args[0].keyword is None:
                enabled = keyword_arg("enabled", updated.args[0].value)
            kept = [a for a in updated.args if a.keyword and a.keyword.value == "cache_enabled"]
            return self._rewrite(original, updated, [enabled, *kept])
        if name not in DEVICE_AUTOCAST:
            return None
        device = find_keyword(original, "device_type")
        positional = [a for a in original.args if a.keyword is None]
        device_expr = device.value if device else (positional[0].value if positional else None)
        dtype = find_keyword(original, "dtype")
        if device_expr is None:
            return None
        literal = string_value(device_expr)
        if literal == "cuda":
            # device and dtype are replaced; enabled=/cache_enabled= are kept.
            kept = [a for a in updated.args
                    if a.keyword and a.keyword.value not in ("device_type", "dtype")]
            return self._rewrite(original, updated, kept)
        if literal is None and self._is_fp16(dtype.value if dtype else None):
            if self.ctx.owner_leaves("TPU201", "float16_autocast"):
                # accelerate's mixed-precision context: `state.device.type`, the CPU of a
                # MULTI_CPU run, whose fp16 autocast would have become bfloat16 there
                self.ctx.report(self.rule, original, self.say(
                    "float16_library", code=self.ctx.short(original)),
                    applied=False, fix=FixKind.NONE)
                return None
            # device_type held in a variable (already 'xla' after TPU101/TPU104): fix the dtype.
            return self.fix_or_report(
                original, self.say("float16", code=self.ctx.short(original)),
                lambda: updated.with_changes(args=[
                    a.with_changes(value=cst.parse_expression(f"{self.ctx.torch_name()}.bfloat16"))
                    if a.keyword and a.keyword.value == "dtype" else a
                    for a in updated.args
                ]),
            )
        return None

    def _rewrite(self, original: cst.Call, updated: cst.Call, kept: list):
        torch = self.ctx.torch_name()

        def build():
            for module in self.mapping.get("imports", ()):  # the module that registers the device
                self.ctx.need_import(module)
            args = [cst.Arg(cst.parse_expression(f'"{self.mapping["device_type"]}"')),
                    keyword_arg("dtype", cst.parse_expression(f"{torch}.bfloat16"))]
            args += [a for a in kept if a is not None]
            return updated.with_changes(
                func=cst.parse_expression(f"{torch}.autocast"), args=with_commas(args)
            )

        return self.fix_or_report(original, self.say("autocast", code=self.ctx.short(original)),
                                  build)


@transform("TPU202")
class HalfPrecision(Transform):
    """`.half()` and float16 casts of models and inputs: bfloat16 on TPU. Applied in a training
    script (it calls `.backward()`), as fp16 AMP becomes bf16 autocast there; elsewhere (a
    library, an export script) a finding, applied with --unsafe-fixes: a float16 there may be
    the format of a file it writes."""

    def fix_or_report(self, node, message, build, fix=None):
        if self.ctx.package_module or ".backward(" not in self.ctx.source:
            if not (self.ctx.unsafe_fixes and not self.ctx.cuda_only):
                message += self.say("not_training")
            return super().fix_or_report(node, message, build, fix=FixKind.UNSAFE)
        return super().fix_or_report(node, message + self.say("training"), build)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        func = original.func
        if isinstance(func, cst.Attribute) and func.attr.value == "half" and not original.args:
            if self.ctx.qualify(func.value):
                return None
            return self.fix_or_report(
                original, self.say("half", code=self.ctx.short(original)),
                lambda: updated.with_changes(func=updated.func.with_changes(attr=cst.Name("bfloat16"))),
            )
        if isinstance(func, cst.Attribute) and func.attr.value in ("to", "type"):
            for i, (old, new) in enumerate(zip(original.args, updated.args)):
                if self.ctx.qualify(old.value) in FP16 and (old.keyword is None or old.keyword.value == "dtype"):
                    replacement = self.fix_or_report(
                        old.value, self.say("cast", code=self.ctx.short(original)),
                        lambda: cst.parse_expression(f"{self.ctx.torch_name()}.bfloat16"),
                    )
                    if replacement is None:
                        return None
                    args = list(updated.args)
                    args[i] = new.with_changes(value=replacement)
                    return updated.with_changes(args=args)
        return None


def _scaler_variables(ctx) -> tuple[set, set]:
    """The variables (values.symbol) a GradScaler is assigned to, and those of them assigned
    under an `if` whose test reads torch.float16 (an fp16 chosen elsewhere)."""
    finder = _ScalerAssignments(ctx)
    ctx.module.visit(finder)
    return finder.symbols, finder.fp16_only


class _ScalerAssignments(cst.CSTVisitor):
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.tests: list[cst.BaseExpression] = []  # the tests of the enclosing ifs
        self.symbols: set = set()
        self.fp16_only: set = set()

    def visit_If(self, node: cst.If) -> None:
        self.tests.append(node.test)

    def leave_If(self, node: cst.If) -> None:
        self.tests.pop()

    def _assigned(self, value, targets) -> None:
        values = self.ctx.values
        if not (isinstance(value, cst.Call) and values.qualified(value.func) in GRAD_SCALERS):
            return
        under_fp16 = any(first(test, lambda n: isinstance(n, (cst.Name, cst.Attribute))
                               and values.qualified(n) in FP16) for test in self.tests)
        for target in targets:
            symbol = self.ctx.values.symbol(target)
            if symbol is not None:
                self.symbols.add(symbol)
                if under_fp16:
                    self.fp16_only.add(symbol)

    def visit_Assign(self, node: cst.Assign) -> None:
        self._assigned(node.value, [t.target for t in node.targets])

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._assigned(node.value, [node.target])


class _SymbolUses(cst.CSTVisitor):
    """Counts the reads of one variable other than `v.<scaler method>(...)` and the
    assignments that bind it (a docstring or comment that names it is no read)."""

    def __init__(self, values, symbol) -> None:
        self.values = values
        self.symbol = symbol
        self.other = 0

    def _is_it(self, expr) -> bool:
        return self.values.symbol(expr) == self.symbol

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if self._is_it(node):  # `self.scaler`
            self.other += 1
            return False
        if node.attr.value in SCALER_METHODS and self._is_it(node.value):
            return False  # `scaler.step(...)`: a method of the scaler
        node.value.visit(self)  # the attribute's own name is no variable
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if self._is_it(node):
            self.other += 1

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return not (isinstance(node.target, (cst.Name, cst.Attribute)) and self._is_it(node.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> bool:
        if isinstance(node.target, (cst.Name, cst.Attribute)) and self._is_it(node.target):
            if node.value is not None:
                node.value.visit(self)
            return False
        return True

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # a keyword's name is no variable
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        if node.default is not None:
            node.default.visit(self)
        return False

    def visit_ImportAlias(self, node) -> bool:
        return False


def _enters_autocast(ctx) -> bool:
    """Does this file enter an autocast (torch.autocast, torch.cuda.amp.autocast, ...)?"""
    return bool(first(ctx.module, lambda n: isinstance(n, cst.Call) and ctx.qualify(n.func)
                      in CUDA_AUTOCAST | DEVICE_AUTOCAST))


@transform("TPU203")
class GradScaler(Transform):
    """GradScaler removed: scale(loss) -> loss, step(opt) -> opt.step(), update()/unscale_()
    removed, its state_dict left out of checkpoints, whatever the scaler is called."""

    claims = frozenset(GRAD_SCALERS)

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        # The variables a GradScaler is assigned to (by dataflow: a name's scope, a `self`
        # attribute's class), and those assigned under a test that reads torch.float16.
        self.symbols, self.fp16_only = _scaler_variables(ctx)
        # The scaler goes with an fp16 autocast that TPU201 makes bf16. One made only for an
        # fp16 chosen elsewhere (deepspeed's ZeRO: `if get_autocast_dtype() == torch.float16:
        # self.scaler = GradScaler(...)`, in a file that enters no autocast) serves an fp16
        # that stays fp16: it stays too.

    def fix_or_report(self, node, message, build, fix=None):
        # lightning's MixedPrecision plugin: its scaler serves the fp16 autocast of the device
        # the library picks (CUDA, or the CPU of a TPU host), which stays fp16: without the
        # scaler that training ran unscaled (gradients underflow)
        if self.library_leaves(node, "scaler", lambda: message + self.say("library")):
            return None
        return super().fix_or_report(node, message, build, fix)

    def _kept(self, symbol) -> bool:
        return symbol in self.fp16_only and not self.ctx.memo(
            "enters_autocast", lambda: _enters_autocast(self.ctx))

    def _is_scaler(self, expr: cst.BaseExpression) -> bool:
        symbol = self.ctx.values.symbol(expr)
        if symbol is not None and symbol in self.symbols:
            return not self._kept(symbol)
        # a scaler given to a function (`def train(model, scaler)`, called with one)
        return self.ctx.values.is_kind(expr, K.SCALER) and not any(
            self._kept(s) for s in self.symbols)

    def _method(self, call: cst.BaseExpression) -> str | None:
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
            if call.func.attr.value in SCALER_METHODS and self._is_scaler(call.func.value):
                return call.func.attr.value
        return None

    def _used_beyond_methods(self, symbol) -> bool:
        """Is the scaler's variable read other than as the receiver of its methods (passed
        to a function, returned, tested)?"""
        uses = _SymbolUses(self.ctx.values, symbol)
        self.ctx.module.visit(uses)
        return uses.other > 0

    def _constructor(self, node, targets):
        value = node.value
        if not (isinstance(value, cst.Call) and self.ctx.qualify(value.func) in GRAD_SCALERS):
            return None
        symbols = [self.ctx.values.symbol(t) for t in targets]
        text = self.ctx.short(node)
        if any(self._kept(s) for s in symbols):
            self.ctx.report(self.rule, node, self.say("scaler_unpaired", code=text),
                            applied=False, fix=FixKind.NONE)
            return None
        if any(self._used_beyond_methods(s) for s in symbols if s is not None):
            # Still passed around (`train(model, scaler)`): keep the name, as None.
            return self.fix_or_report(
                node, self.say("scaler_none", code=text),
                lambda: StatementPlan([node.with_changes(value=cst.Name("None"))]),
            )
        return self.fix_or_report(
            node, self.say("scaler_removed", code=text),
            lambda: StatementPlan([], f'removed "{text}": bf16 needs no loss scaling'),
        )

    def visit_Assign(self, node: cst.Assign):
        return self._constructor(node, [t.target for t in node.targets])

    def visit_AnnAssign(self, node: cst.AnnAssign):
        return self._constructor(node, [node.target]) if node.value is not None else None

    def visit_Expr(self, node: cst.Expr):
        method = self._method(node.value)
        if method in ("update", "unscale_", "load_state_dict"):
            text = self.ctx.short(node.value)
            why = {
                "update": self.say("why_update"),
                "unscale_": self.say("why_unscale"),
                "load_state_dict": self.say("why_load_state_dict"),
            }[method]
            return self.fix_or_report(
                node.value, self.say("method_removed", code=text, why=why),
                lambda: StatementPlan([], f'removed "{text}": {why} (bf16)'),
            )
        return None

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        method = self._method(original)
        if method == "scale" and updated.args:
            return self.fix_or_report(
                original, self.say("scale", code=self.ctx.short(original)),
                lambda: updated.args[0].value,
            )
        if method == "step" and updated.args:
            optimizer = updated.args[0].value
            # scaler.step(opt, *args, **kwargs) passes the rest to opt.step: kept.
            rest = with_commas(list(updated.args[1:]))
            return self.fix_or_report(
                original, self.say("step", code=self.ctx.short(original)),
                lambda: cst.Call(func=cst.Attribute(value=optimizer, attr=cst.Name("step")),
                                 args=rest),
            )
        if method == "get_scale":
            return self.fix_or_report(original, self.say("get_scale"), lambda: cst.Float("1.0"))
        return None

    def leave_Dict(self, original: cst.Dict, updated: cst.Dict):
        # {"model": ..., "scaler": scaler.state_dict()}: the checkpoint keeps everything else.
        drop = [i for i, e in enumerate(original.elements)
                if isinstance(e, cst.DictElement) and self._method(e.value) == "state_dict"]
        if not drop:
            return None
        def build():
            kept = [e for i, e in enumerate(updated.elements) if i not in drop]
            if kept and drop[-1] == len(original.elements) - 1:
                # The new last element takes the old last one's comma (and its layout).
                kept[-1] = kept[-1].with_changes(comma=updated.elements[-1].comma)
            return updated.with_changes(elements=kept)

        return self.fix_or_report(
            original.elements[drop[0]],
            self.say("state_dict", code=self.ctx.short(original.elements[drop[0]])), build)


@transform("TPU204")
class FusedOptimizer(Transform):
    """`torch.optim.AdamW(..., fused=True)`: fused optimizers are CUDA kernels; XLA compiles
    the whole update into the step graph anyway."""

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        name = self.ctx.qualify(original.func) or ""
        if not name.startswith("torch.optim."):
            return None
        fused = next((i for i, a in enumerate(original.args) if a.keyword and a.keyword.value == "fused"), None)
        if fused is None or isinstance(original.args[fused].value, cst.Name) and original.args[fused].value.value in ("False", "None"):
            return None

        def build():
            args = [a for i, a in enumerate(updated.args) if i != fused]
            if args and fused == len(updated.args) - 1:
                args[-1] = args[-1].with_changes(comma=updated.args[-1].comma)
            return updated.with_changes(args=args)

        return self.fix_or_report(
            original.args[fused], self.say("fused", code=self.ctx.short(original.args[fused])),
            build)


    # Optimizer arguments gathered first (transformers' Trainer: `optimizer_kwargs = {"lr":
    # ...}`, `optimizer_kwargs.update({"fused": True})`, then `optimizer_cls(params,
    # **optimizer_kwargs)`): "fused" -> False. A variable holds optimizer arguments by what it
    # holds (a dict with an optimizer's keywords) or where it goes (`**` into an optimizer).
    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.optimizer_dicts: set[int] = set()  # id() of dicts that hold optimizer arguments
        self.holders = ctx.memo("optimizer_argument_variables", lambda: _argument_holders(ctx))

    def _holds_arguments(self, expr: cst.BaseExpression) -> bool:
        symbol = self.ctx.values.symbol(expr)
        return symbol is not None and symbol in self.holders

    def visit_Call(self, node: cst.Call):
        func = node.func
        if (isinstance(func, cst.Attribute) and func.attr.value in ("update", "setdefault")
                and self._holds_arguments(func.value)):
            self.optimizer_dicts.update(id(a.value) for a in node.args)

    def visit_Assign(self, node: cst.Assign):
        if any(self._holds_arguments(t.target) for t in node.targets):
            self.optimizer_dicts.add(id(node.value))

    def _fused_on(self, value: cst.BaseExpression) -> bool:
        return not (isinstance(value, cst.Name) and value.value in ("False", "None"))

    def _turn_off(self, node: cst.CSTNode, code: str, build):
        return self.fix_or_report(node, self.say("fused_argument", code=code), build)

    def leave_Dict(self, original: cst.Dict, updated: cst.Dict):
        keys = {string_value(e.key): i for i, e in enumerate(original.elements)
                if isinstance(e, cst.DictElement)}
        at = keys.get("fused")
        if at is None or not self._fused_on(original.elements[at].value):
            return None
        if id(original) not in self.optimizer_dicts and not keys.keys() & OPTIMIZER_KEYS:
            return None
        element = original.elements[at]
        elements = list(updated.elements)
        elements[at] = elements[at].with_changes(value=cst.Name("False"))
        return self._turn_off(element, self.ctx.short(element),
                              lambda: updated.with_changes(elements=elements))

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        # optimizer_kwargs["fused"] = True
        target = original.targets[0].target if len(original.targets) == 1 else None
        if not (isinstance(target, cst.Subscript) and len(target.slice) == 1
                and isinstance(target.slice[0].slice, cst.Index)
                and string_value(target.slice[0].slice.value) == "fused"
                and self._holds_arguments(target.value)
                and self._fused_on(original.value)):
            return None
        return self._turn_off(original, self.ctx.short(original),
                              lambda: updated.with_changes(value=cst.Name("False")))


OPTIMIZER_KEYS = {"lr", "betas", "eps", "weight_decay", "momentum", "amsgrad", "foreach"}


def _optimizer_keys(value: cst.BaseExpression | None) -> bool:
    """A dict display or `dict(...)` call with one of torch.optim's keyword arguments."""
    if isinstance(value, cst.Dict):
        return any(isinstance(e, cst.DictElement) and string_value(e.key) in OPTIMIZER_KEYS
                   for e in value.elements)
    return isinstance(value, cst.Call) and dotted(value.func) == "dict" and any(
        a.keyword is not None and a.keyword.value in OPTIMIZER_KEYS for a in value.args)


def _argument_holders(ctx) -> set:
    """The variables (values.symbol) that hold an optimizer's keyword arguments: assigned a
    dict with an optimizer keyword, or given as `**kwargs` to an optimizer's constructor."""
    values = ctx.values
    holders = set()
    for node in walk(ctx.module):
        if isinstance(node, (cst.Assign, cst.AnnAssign)) and _optimizer_keys(node.value):
            targets = ([t.target for t in node.targets] if isinstance(node, cst.Assign)
                       else [node.target])
            holders.update(values.symbol(t) for t in targets)
        elif isinstance(node, cst.Call) and any(a.star == "**" for a in node.args) and (
                any(c.startswith("torch.optim.") for c in _callees(values, node.func))
                or K.OPTIMIZER in values.kinds(node)):
            holders.update(values.symbol(a.value) for a in node.args if a.star == "**")
    holders.discard(None)
    return holders


def _callees(values, func: cst.BaseExpression, depth: int = 0) -> set[str]:
    """The qualified names a call's function may be: an import, or a variable assigned one
    (`optimizer_cls = AdamW`, in one branch or another)."""
    qualified = values.qualified(func)
    if qualified is not None:
        return {qualified}
    if not isinstance(func, cst.Name) or depth > 3:
        return set()
    return {name for b in values.bindings(func) if isinstance(b, Assigned) and not b.path
            for name in _callees(values, b.value, depth + 1)}


@transform("TPU205")
class TiedWeights(Transform):
    """`self.a.weight = self.b.weight` ties two modules' weights. Moving a module to an XLA
    device creates new Parameter objects (XLA tensors cannot share a CPU tensor's storage),
    which unties them: the migrated model trains two separate matrices. The tie is repeated
    right after the model is moved."""

    def statement_triggers(self, source: str) -> set[str]:
        # Classes that tie weights, here or in a module this file imports from beside it:
        # statements that build or move their instances matter.
        names = set(self.ties)
        for match in _CLASS.finditer(source):
            body = source[match.end(): source.find("\nclass ", match.end()) % (len(source) + 1)]
            if _TIE.search(body):
                names.add(match.group(1))
        for name in list(names):  # and the variables that hold instances: `model.to(device)`
            names.update(re.findall(rf"(\w+)\s*=\s*{re.escape(name)}\b", source))
        return super().statement_triggers(source) | names

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        # class -> [(a.weight, b.weight)]; classes imported from local modules first
        self.ties: dict[str, list[tuple[str, str]]] = imported_ties(ctx.module, ctx.path)
        self.models: dict[str, str] = {}  # variable -> class
        self.pending: dict[cst.CSTNode, str] = {}  # line that moves a model -> variable

    def visit_ClassDef(self, node: cst.ClassDef):
        ties = class_ties(node)
        if ties:
            self.ties[node.name.value] = ties

    def _tied_class(self, call: cst.BaseExpression) -> str | None:
        """`GPT(cfg)` or `GPT.from_pretrained(...)`: the tied class it builds."""
        if not isinstance(call, cst.Call):
            return None
        name = dotted(call.func)
        if name in self.ties:
            return name
        owner = name.rpartition(".")[0] if name else ""
        return owner if owner in self.ties else None

    def _moved_model(self, expr) -> str | None:
        """`model.to(...)`/`model.cuda()` or `GPT(cfg).to(...)`: the variable or class moved."""
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("to", "cuda"):
            inner = expr.func.value
            if isinstance(inner, cst.Name) and inner.value in self.models:
                return inner.value
            return self._tied_class(inner)
        return None

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine):
        for small in node.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
                target = small.targets[0].target.value
                value = small.value
                built = self._tied_class(value)
                if built is not None:
                    self.models[target] = built
                moved = self._moved_model(value)
                if moved is not None:
                    self.models[target] = self.models.get(moved, moved)
                    self.pending[node] = target
            elif isinstance(small, cst.Expr):
                moved = self._moved_model(small.value)
                if moved in self.models:
                    self.pending[node] = moved

    def leave_SimpleStatementLine(self, original, updated):
        variable = self.pending.pop(original, None)
        if variable is None:
            return None
        ties = [
            (a, b) for a, b in self.ties[self.models[variable]]
            if not re.search(rf"^\s*{variable}\.{re.escape(a)}\s*=\s*{variable}\.{re.escape(b)}\b",
                             self.ctx.source, re.M)  # tied again already (migrated, hand port)
        ]
        if not ties:
            return None
        lines = [
            cst.parse_statement(f"{variable}.{a} = {variable}.{b}\n") for a, b in ties
        ]
        return self.fix_or_report(
            original,
            self.say("tie", code=self.ctx.short(original), ties=", ".join(a for a, _ in ties)),
            lambda: cst.FlattenSentinel([updated, *lines]),
        )


def class_ties(node: cst.ClassDef) -> list[tuple[str, str]]:
    """The `self.a.weight = self.b.weight` ties in a class's __init__ (its first parameter,
    whatever it is called), as ("a.weight", "b.weight")."""
    ties = []
    for me, stmt in _init_statements(node):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                left, right = dotted(small.targets[0].target), dotted(small.value)
                if (left and right and left.startswith(me) and right.startswith(me)
                        and left.endswith(".weight") and right.endswith(".weight")):
                    ties.append((left[len(me):], right[len(me):]))
    return ties


def imported_ties(module: cst.Module, path: str) -> dict[str, list[tuple[str, str]]]:
    """Tied classes this file imports from a module beside it, by the name they have here:
    nanoGPT's train.py does `from model import GPT` and model.py ties the embedding. Only
    files next to `path` (or in its package, for relative imports) are read, and only parsed
    when their text has a tie."""
    if not path:
        return {}
    here = Path(path).resolve().parent
    found: dict[str, list[tuple[str, str]]] = {}
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.ImportFrom) and small.module is not None:
                ties = _module_ties(here, len(small.relative), dotted(small.module) or "")
                if ties and not isinstance(small.names, cst.ImportStar):
                    for alias in small.names:
                        name = alias.name.value if isinstance(alias.name, cst.Name) else None
                        bound = (alias.asname.name.value if alias.asname is not None
                                 and isinstance(alias.asname.name, cst.Name) else name)
                        if name in ties:
                            found[bound] = ties[name]
            elif isinstance(small, cst.Import):
                for alias in small.names:
                    module_name = dotted(alias.name) or ""
                    bound = (dotted(alias.asname.name) if alias.asname is not None
                             else module_name)
                    for cls, ties in _module_ties(here, 0, module_name).items():
                        found[f"{bound}.{cls}"] = ties
    return found


def _module_ties(here: Path, level: int, module: str) -> dict[str, list[tuple[str, str]]]:
    if not module:
        return {}
    if level:  # from .model import GPT: the package of this file, `level - 1` up
        if level - 2 >= len(here.parents):
            return {}
        bases = [here.parents[level - 2] if level > 1 else here]
    else:  # the script's directory (sys.path[0]), and the roots of the packages it is in
        bases = [here]
        while (bases[-1] / "__init__.py").is_file():
            bases.append(bases[-1].parent)
    relative = Path(*module.split("."))
    candidates = [c for base in bases
                  for c in (base / relative.with_suffix(".py"), base / relative / "__init__.py")]
    for candidate in candidates:
        if candidate.is_file():
            return _file_ties(str(candidate))
    return {}


@functools.lru_cache(maxsize=256)  # a directory's files import the same model module
def _file_ties(path: str) -> dict[str, list[tuple[str, str]]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    if not _TIE.search(text):
        return {}
    try:
        parsed = cst.parse_module(text)
    except cst.ParserSyntaxError:
        return {}
    return {stmt.name.value: ties for stmt in parsed.body
            if isinstance(stmt, cst.ClassDef) and (ties := class_ties(stmt))}


def _init_statements(node: cst.ClassDef):
    for stmt in node.body.body if isinstance(node.body, cst.IndentedBlock) else ():
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "__init__":
            params = [*stmt.params.posonly_params, *stmt.params.params]
            body = stmt.body
            if params and isinstance(body, cst.IndentedBlock):
                yield from ((params[0].name.value + ".", s) for s in body.body)
