"""TPU415 all-reduce-avg: `dist.all_reduce(t, op=ReduceOp.AVG)` becomes a SUM divided by the world
size on XLA.

Its messages and tables: rules/TPU415-all-reduce-avg.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.context import find_keyword
from tpukit.migrate.transforms.base import StatementPlan, Transform, transform


ALL_REDUCE = {"torch.distributed.all_reduce", "torch.distributed.distributed_c10d.all_reduce"}


AVG = {"torch.distributed.ReduceOp.AVG", "torch.distributed.distributed_c10d.ReduceOp.AVG"}


def _average_op(ctx, call: cst.BaseExpression) -> cst.Arg | None:
    """The `op=ReduceOp.AVG` argument of a `dist.all_reduce(...)` call, else None."""
    if not (isinstance(call, cst.Call) and ctx.qualify(call.func) in ALL_REDUCE):
        return None
    op = find_keyword(call, "op")
    positional = [a for a in call.args if a.keyword is None]
    if op is None and len(positional) >= 2:
        op = positional[1]
    return op if op is not None and ctx.qualify(op.value) in AVG else None


@transform("TPU415")
class AverageAllReduce(Transform):
    def leave_Call(self, original: cst.Call, updated: cst.Call):
        # Used as a value (`work = dist.all_reduce(..., async_op=True)`): said, not rewritten.
        if id(original) not in self.ctx.handled and _average_op(self.ctx, original) is not None:
            self._finding(original)
        return None

    def _finding(self, call: cst.Call) -> None:
        self.ctx.report(self.rule, call, self.say("average", code=self.ctx.short(call)),
                        applied=False)

    def visit_Expr(self, node: cst.Expr):
        call = node.value
        op = _average_op(self.ctx, call)
        if op is None:
            return None
        positional = [a for a in call.args if a.keyword is None]
        tensor = find_keyword(call, "tensor") or (positional[0] if positional else None)
        group = find_keyword(call, "group") or (positional[2] if len(positional) > 2 else None)
        asynchronous = find_keyword(call, "async_op")
        code = self.ctx.short(call)
        if (tensor is None or not isinstance(tensor.value, (cst.Name, cst.Attribute))
                or (asynchronous is not None and not (isinstance(asynchronous.value, cst.Name)
                                                      and asynchronous.value.value == "False"))):
            self._finding(call)
            return None
        name = self.ctx.code(tensor.value)
        dist = self.ctx.code(call.func.value) if isinstance(call.func, cst.Attribute) else None
        size = f"{dist}.get_world_size" if dist else "torch.distributed.get_world_size"
        size += f"({self.ctx.code(group.value)})" if group is not None else "()"
        summed = self.ctx.code(op.value)[: -len("AVG")] + "SUM"

        def build():
            new_call = call.with_changes(args=[
                a.with_changes(value=cst.parse_expression(summed)) if a is op else a
                for a in call.args])
            return StatementPlan([cst.Expr(new_call),
                                  cst.parse_statement(f"{name} /= {size}\n").body[0]])

        return self.fix_or_report(
            call, self.say("summed", code=code, name=name, size=size), build)
