"""TPU411 zero-optimizer: ZeroRedundancyOptimizer becomes the plain optimizer it wraps; shard with
SPMD on TPU.

Its messages and tables: rules/TPU411-zero-optimizer.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind, Message
from tpukit.migrate.context import dotted, plain_positional
from tpukit.migrate.nodes import scan
from tpukit.migrate.transforms.base import StatementPlan, Transform, transform


ZERO = "torch.distributed.optim.ZeroRedundancyOptimizer"


ZERO_NAMES = {ZERO, "torch.distributed.optim.zero_redundancy_optimizer.ZeroRedundancyOptimizer"}


# ZeroRedundancyOptimizer(params, optimizer_class, process_group, parameters_as_bucket_view,
# overlap_with_ddp, **defaults): the arguments that are ZeRO's own; `**defaults` go to the
# optimizer class.
_ZERO_OWN = ("params", "optimizer_class", "process_group", "parameters_as_bucket_view",
             "overlap_with_ddp")


def _without(args: list[cst.Arg], dropped: set[int]) -> list[cst.Arg]:
    """`args` less those at the `dropped` positions, each keeping its own comma (and the new
    last one the old last one's, so a trailing comma or none stays as written)."""
    kept = [a for i, a in enumerate(args) if i not in dropped]
    if kept and args and kept[-1] is not args[-1]:
        kept[-1] = kept[-1].with_changes(comma=args[-1].comma)
    return kept


class _Assignments(cst.CSTVisitor):
    """The targets of `target = value` statements whose value `wanted(value)`."""

    def __init__(self, wanted) -> None:
        self.wanted = wanted
        self.targets: list[cst.BaseExpression] = []

    def visit_Assign(self, node: cst.Assign) -> None:
        if self.wanted(node.value):
            self.targets.extend(t.target for t in node.targets)


@transform("TPU411")
class ZeroOptimizer(Transform):
    """ZeroRedundancyOptimizer under DDP -> the plain optimizer it wraps. DDP already averages
    every gradient on every process, so stepping all parameters on each process gives the same
    values as ZeRO's step of a shard followed by its broadcast."""

    def _plan(self, call: cst.Call) -> tuple[Message | None, cst.Arg | None, set[int]] | None:
        """(why not, None, {}) when the call cannot be rewritten; else (None, optimizer_class
        argument, positions of ZeRO's own arguments to drop)."""
        plain = plain_positional(call)
        roles = {_ZERO_OWN[i]: a for i, a in enumerate(plain[:len(_ZERO_OWN)])}
        roles.update({a.keyword.value: a for a in call.args
                      if a.keyword and a.keyword.value in _ZERO_OWN})
        cls = roles.get("optimizer_class")
        if cls is None:
            return (self.say("why_splat"), None, set())
        overlap = roles.get("overlap_with_ddp")
        if (overlap is not None and dotted(overlap.value) != "False"
                and "hook_with_zero_step" in self.ctx.source):
            return (self.say("why_overlap"), None, set())
        drop = {i for i, a in enumerate(call.args)
                if a is not roles.get("params") and any(a is v for v in roles.values())}
        # `fused=` goes as TPU204 drops it from any optimizer: CUDA's kernel (it raises on XLA)
        drop |= {i for i, a in enumerate(call.args) if a.keyword and a.keyword.value == "fused"}
        return None, cls, drop

    def _message(self, call: cst.Call, new: str) -> Message:
        return self.say("zero", code=self.ctx.short(call), new=new)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) not in ZERO_NAMES:
            return None
        why, cls, drop = self._plan(original)
        if cls is None:
            self.ctx.report(self.rule, original,
                            self._message(original, self.say("plain_optimizer"))
                            + self.say("not_rewritten") + why, applied=False, fix=FixKind.NONE)
            return None
        new = self.ctx.code(cls.value)
        return self.fix_or_report(original, self._message(original, new), lambda: updated.with_changes(
            func=updated.args[original.args.index(cls)].value,
            args=_without(list(updated.args), drop)))

    def _zero_targets(self) -> set[str]:
        """What this file assigns a ZeroRedundancyOptimizer that is rewritten (`opt`,
        `self.optimizer`): their `.consolidate_state_dict()` has nothing to gather."""
        def compute() -> set[str]:
            found = _Assignments(lambda v: isinstance(v, cst.Call)
                                 and self.ctx.qualify(v.func) in ZERO_NAMES
                                 and self._plan(v)[1] is not None)
            scan(self.ctx.module, found)
            return {self.ctx.code(t) for t in found.targets}
        return self.ctx.memo("zero_targets", compute)

    def visit_Expr(self, node: cst.Expr):
        """`optimizer.consolidate_state_dict(to=0)`: a plain optimizer has no such method (an
        AttributeError) and its state_dict() is whole on every process already."""
        call = node.value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "consolidate_state_dict"
                and "ZeroRedundancyOptimizer" in self.ctx.source
                and self.ctx.code(call.func.value) in self._zero_targets()):
            return None
        text = self.ctx.short(call)
        return self.fix_or_report(
            call, self.say("consolidate", code=text),
            lambda: StatementPlan([], f'removed "{text}": a plain optimizer\'s state_dict() is '
                                      "whole already"))
