"""TPU409 optimizer-step: Multi-process training without DDP steps with `xm.optimizer_step`.

Its messages and tables: rules/TPU409-optimizer-step.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.cuda_only import ported_as
from tpukit.migrate.analysis.launch import DDP_NAMES, group_calls, spawned_functions
from tpukit.migrate.nodes import first
from tpukit.migrate.transforms.base import StatementPlan, Transform, transform


# The optimizers TPU409 steps with `xm.optimizer_step`: torch.optim's classes, not its
# schedulers (`scheduler.step()` is no optimizer step) or SWA's averaged models.


@transform("TPU409")
class OptimizerStepWithoutDdp(Transform):
    """Several processes and no DDP: gradients must be averaged across them, which
    `xm.optimizer_step` does before the step."""
    uses = frozenset({"cuda_only", "launch", "values"})

    def _applies(self) -> bool:
        def compute() -> bool:
            values = self.ctx.values
            multi = bool(group_calls(self.ctx)) or bool(spawned_functions(self.ctx))
            return multi and not values.calls_any(ported_as(self.ctx, DDP_NAMES))
        return self.ctx.memo("optimizer_step_without_ddp", compute)

    def visit_Expr(self, node: cst.Expr):
        call = node.value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "step" and not call.args
                and isinstance(call.func.value, cst.Name) and self._applies()):
            return None
        name = call.func.value.value
        if K.OPTIMIZER not in self.ctx.values.kinds(call.func.value):
            return None
        return self.fix_or_report(
            call, self.say("step", code=self.ctx.short(call), name=name),
            lambda: StatementPlan([self.ctx.statement(f"xm.optimizer_step({name})")]))

    def visit_Call(self, node: cst.Call):
        """A hand-written gradient all-reduce: xm.optimizer_step already does it."""
        if self.ctx.qualify(node.func) != "torch.distributed.all_reduce" or not self._applies():
            return None
        if not node.args or not first(node.args[0].value, lambda n: isinstance(
                n, cst.Attribute) and n.attr.value == "grad"):
            return None
        self.ctx.report(self.rule, node, self.say("all_reduce", code=self.ctx.short(node)),
                        applied=False, fix=None)
        return None
