"""TPU501 host-sync-in-loop: A host sync in the training step (`.item()`, `.cpu()`, `print(loss)`,
...).

Its messages and tables: rules/TPU501-host-sync-in-loop.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.steps import HOST_READS, find_steps, loader_in_iter
from tpukit.migrate.context import terminal_name
from tpukit.migrate.transforms.base import Transform, transform


LOGGERS = ("print", "info", "debug", "warning", "log")


def _tensor(ctx, expr: cst.BaseExpression) -> bool:
    """Does `expr` hold a tensor, by where its value comes from (a model's output, a torch
    op) or what is done with it (`loss.backward()`)? A flag (`args.norm_adv`) does not."""
    return K.TENSOR in ctx.values.kinds(expr)


@transform("TPU501")
class HostSyncInLoop(Transform):
    """Inside a training step, `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `float(t)`,
    `int(t)`, `print(t)` and `if t:` each wait for the device and copy to the host."""
    uses = frozenset({"steps", "values"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.depth = 0
        self.loops: list[bool] = []

    def statement_triggers(self, source: str) -> set[str]:
        # a training loop: over a loader (whatever it is called), or stepping, or backward
        return super().statement_triggers(source) | self.ctx.values.names_of({K.LOADER}) | {
            ".backward(", ".step(", "optimizer_step("}

    def _training(self, node) -> bool:
        if isinstance(node, cst.For) and loader_in_iter(self.ctx, node):
            return True
        steps = find_steps(self.ctx, node)
        return bool(steps.step_lines) or steps.backward is not None

    def visit_For(self, node):
        training = self._training(node)
        self.loops.append(training)
        self.depth += training

    def visit_While(self, node):
        self.visit_For(node)

    def leave_For(self, original, updated):
        self.depth -= self.loops.pop()
        return None

    def leave_While(self, original, updated):
        return self.leave_For(original, updated)

    def _report(self, node, what: str) -> None:
        self.ctx.report(
            self.rule, node,
            self.say("sync", code=self.ctx.short(node), what=what),
            applied=False)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if not self.depth or id(original) in self.ctx.handled:
            return None  # (a read another rule moves off the step: TPU512's sums)
        func = original.func
        if isinstance(func, cst.Attribute) and func.attr.value in HOST_READS and not original.args:
            # `t.cpu().numpy()`: one read, reported at `t.cpu()` (what follows is on the host)
            inner = func.value
            if not (isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute)
                    and inner.func.attr.value in HOST_READS) and not self.ctx.qualify(inner):
                self._report(original, self.say("copies"))
        elif isinstance(func, cst.Name) and func.value in ("float", "int") and len(original.args) == 1:
            if _tensor(self.ctx, original.args[0].value):
                self._report(original, self.say("reads"))
        elif isinstance(func, cst.Name) and func.value == "print":
            if any(isinstance(a.value, (cst.Name, cst.Attribute)) and _tensor(self.ctx, a.value)
                   for a in original.args):
                self._report(original, self.say("prints"))
        return None

    def leave_If(self, original: cst.If, updated: cst.If):
        if self.depth and isinstance(original.test, (cst.Name, cst.Attribute)) \
                and _tensor(self.ctx, original.test):
            self._report(original.test, self.say("tests"))
        return None

    def leave_Expr(self, original: cst.Expr, updated: cst.Expr):
        # Unsafe fix for logging: print(...loss.item()...) -> xm.add_step_closure(lambda: print(...)).
        call = original.value
        if not (self.depth and self.ctx.unsafe_fixes and isinstance(call, cst.Call)):
            return None
        if "replace" not in self.mapping:
            return None  # a target without step closures (TorchTPU: eager)
        if terminal_name(call.func) not in LOGGERS or ".item()" not in self.ctx.code(call):
            return None
        closure = cst.Call(
            func=self.ctx.expr("xm.add_step_closure"),
            args=[cst.Arg(cst.Lambda(params=cst.Parameters(), body=updated.value))],
        )
        self.ctx.report(self.rule, original, self.say("closure", code=self.ctx.short(original)),
                        applied=True)
        return updated.with_changes(value=closure)
