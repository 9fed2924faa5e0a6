"""An optimizer built before its model moved to the XLA device trains nothing.

On CUDA, `model.to(device)` keeps each Parameter object and swaps its storage, so an optimizer
created earlier still holds the model's parameters. torch_xla cannot swap storage across
devices: `.to(xla)` gives the module new Parameter objects, and the optimizer keeps updating
the old CPU ones while the XLA model never changes, silently. The tutorial pattern
`model = Net(); opt = SGD(model.parameters()); Trainer(model, opt)` (the trainer moves the
model) hits exactly this. The fix moves the model where it is built, before the optimizer.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.context import dotted
from tpukit.migrate.transforms.base import Transform, transform
from tpukit.migrate.analysis.steps import uses_prepare


WRAPPERS = ("DistributedDataParallel", "DataParallel", "DDP", "FullyShardedDataParallel", "compile",
            "deepcopy", "_inputs_to_device")  # the last: TPU402's helper around a DDP


def _assigned_name(stmt: cst.CSTNode) -> tuple[str, cst.Assign] | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        assign = stmt.body[0]
        if (isinstance(assign, cst.Assign) and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name)):
            return assign.targets[0].target.value, assign
    return None


@transform("TPU106")
class OptimizerBeforeDevice(Transform):

    uses = frozenset({"device_facts", "steps"})
    def _optimizer_model(self, stmt: cst.CSTNode) -> tuple[str, cst.Call] | None:
        """`opt = torch.optim.X(model.parameters(), ...)` -> ("model", the call)."""
        found = _assigned_name(stmt)
        if found is None or not isinstance(found[1].value, cst.Call):
            return None
        call = found[1].value
        name = self.ctx.qualify(call.func) or ""
        if not name.startswith("torch.optim.") or not call.args:
            return None
        first = call.args[0].value
        if (isinstance(first, cst.Call) and isinstance(first.func, cst.Attribute)
                and first.func.attr.value == "parameters" and isinstance(first.func.value, cst.Name)):
            return first.func.value.value, call
        return None

    def _moves(self, stmt: cst.CSTNode, model: str) -> bool:
        """`model.to(...)`/`model.cuda()`, or `model = ....to(...)` / `....cuda()`."""
        code = self.ctx.code(stmt)
        if f"{model}.to(" in code or f"{model}.cuda(" in code:
            return True
        assigned = _assigned_name(stmt)
        return (assigned is not None and assigned[0] == model
                and any(m in self.ctx.code(assigned[1].value) for m in (".to(", ".cuda(")))

    def _wraps_moved(self, value: cst.Call, before) -> bool:
        """`DDP(model)`, `torch.compile(model)`, `copy.deepcopy(model)`: a wrapper of a module
        that was moved before (or is moved by its own rule): not a model built here."""
        if (self.ctx.qualify(value.func) or dotted(value.func) or "").endswith(WRAPPERS):
            return True
        inner = value.args[0].value if value.args else None
        return isinstance(inner, cst.Name) and any(self._moves(s, inner.value) for s in before)

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        # line that builds a model -> (the optimizer call built before it moves, model name).
        # Planned on the original block before its statements are visited, applied to the
        # rewritten line: other rules may add lines before it, so positions would not do.
        self.plans: dict[cst.CSTNode, tuple[cst.Call, str]] = {}

    def _plan(self, body) -> None:
        if uses_prepare(self.ctx):
            # accelerate's `prepare` moves the model and points the optimizer at the moved
            # parameters itself on XLA; a model it is not given is a CPU reference (its
            # test scripts' baselines), which must stay where its inputs are
            return
        for j, stmt in enumerate(body):
            found = self._optimizer_model(stmt)
            if found is None:
                continue
            model, call = found
            for i in range(j - 1, -1, -1):
                assigned = _assigned_name(body[i])
                if self._moves(body[i], model):
                    break  # moved (or built on the device) before the optimizer: fine
                if assigned is None or assigned[0] != model:
                    continue
                value = assigned[1].value
                if isinstance(value, cst.Call) and not self._wraps_moved(value, body[:i]):
                    self.plans[body[i]] = (call, model)
                break

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._plan(node.body)

    def visit_Module(self, node: cst.Module) -> None:
        self._plan(node.body)

    def leave_SimpleStatementLine(self, original, updated):
        return self._move(original, updated)

    def _apply_in(self, original_body, updated_body) -> list | None:
        """Lines the engine skipped (nothing in them to rewrite) get no leave hook of their
        own: they are the same objects in the rewritten block, found there by identity."""
        new_body, changed = list(updated_body), False
        for stmt in original_body:
            if stmt in self.plans:
                at = next((k for k, s in enumerate(new_body) if s is stmt), None)
                moved = self._move(stmt, stmt) if at is not None else None
                if moved is not None:
                    new_body[at], changed = moved, True
        return new_body if changed else None

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock):
        body = self._apply_in(original.body, updated.body)
        return None if body is None else updated.with_changes(body=body)

    def leave_Module(self, original: cst.Module, updated: cst.Module):
        body = self._apply_in(original.body, updated.body)
        return None if body is None else updated.with_changes(body=body)

    def _move(self, original, updated):
        planned = self.plans.pop(original, None)
        if planned is None:
            return None
        call, model = planned

        def build():
            assign = updated.body[0]
            return updated.with_changes(body=[assign.with_changes(value=cst.Call(
                func=cst.Attribute(value=assign.value, attr=cst.Name("to")),
                args=[cst.Arg(self.ctx.device_expr())]))])

        return self.fix_or_report(
            call, self.say("optimizer", call=self.ctx.short(call), model=model), build)
