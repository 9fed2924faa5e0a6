"""TPU204 fused-optimizer: `fused=True` optimizers are CUDA kernels: removed.

Its messages and tables: rules/TPU204-fused-optimizer.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.bindings import Assigned
from tpukit.migrate.context import dotted, string_value
from tpukit.migrate.nodes import walk
from tpukit.migrate.transforms.base import Transform, transform


OPTIMIZER_KEYS = {"lr", "betas", "eps", "weight_decay", "momentum", "amsgrad", "foreach"}


def _optimizer_keys(value: cst.BaseExpression | None) -> bool:
    """A dict display or `dict(...)` call with one of torch.optim's keyword arguments."""
    if isinstance(value, cst.Dict):
        return any(isinstance(e, cst.DictElement) and string_value(e.key) in OPTIMIZER_KEYS
                   for e in value.elements)
    return isinstance(value, cst.Call) and dotted(value.func) == "dict" and any(
        a.keyword is not None and a.keyword.value in OPTIMIZER_KEYS for a in value.args)


def _fused_key(value: cst.BaseExpression) -> bool:
    """A dict display with a "fused" key."""
    return isinstance(value, cst.Dict) and any(
        isinstance(e, cst.DictElement) and string_value(e.key) == "fused" for e in value.elements)


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


@transform("TPU204")
class FusedOptimizer(Transform):
    """`torch.optim.AdamW(..., fused=True)`: fused optimizers are CUDA kernels; XLA compiles
    the whole update into the step graph anyway."""
    uses = frozenset({"bindings", "values"})

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

    def _holds_arguments(self, expr: cst.BaseExpression) -> bool:
        symbol = self.ctx.values.symbol(expr)
        # the holders are found on first need (a walk of the whole module): most files ask none
        return symbol is not None and symbol in self.ctx.memo(
            "optimizer_argument_variables", lambda: _argument_holders(self.ctx))

    # (only a dict display with a "fused" key is ever turned off, leave_Dict: the holders,
    # a walk of the whole module, are asked for those alone)
    def visit_Call(self, node: cst.Call):
        func = node.func
        dicts = [a.value for a in node.args if _fused_key(a.value)]
        if (dicts and isinstance(func, cst.Attribute)
                and func.attr.value in ("update", "setdefault")
                and self._holds_arguments(func.value)):
            self.optimizer_dicts.update(map(id, dicts))

    def visit_Assign(self, node: cst.Assign):
        if _fused_key(node.value) and any(self._holds_arguments(t.target) for t in node.targets):
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
