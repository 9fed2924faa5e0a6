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


WRAPPERS = ("DistributedDataParallel", "DataParallel", "DDP", "FullyShardedDataParallel", "compile",
            "deepcopy")


def _assigned_name(stmt: cst.CSTNode) -> tuple[str, cst.Assign] | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        assign = stmt.body[0]
        if (isinstance(assign, cst.Assign) and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name)):
            return assign.targets[0].target.value, assign
    return None


@transform("TPU106")
class OptimizerBeforeDevice(Transform):
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

    def _fix_body(self, original_body, updated_body):
        new_body = list(updated_body)
        changed = False
        for j, stmt in enumerate(original_body):
            found = self._optimizer_model(stmt)
            if found is None:
                continue
            model, call = found
            for i in range(j - 1, -1, -1):
                assigned = _assigned_name(original_body[i])
                if self._moves(original_body[i], model):
                    break  # moved (or built on the device) before the optimizer: fine
                if assigned is None or assigned[0] != model:
                    continue
                value = assigned[1].value
                if not isinstance(value, cst.Call) or self._wraps_moved(value, original_body[:i]):
                    break

                def build(i=i):
                    line = new_body[i]
                    new_assign = line.body[0].with_changes(value=cst.Call(
                        func=cst.Attribute(value=line.body[0].value, attr=cst.Name("to")),
                        args=[cst.Arg(self.ctx.device_expr())]))
                    return line.with_changes(body=[new_assign])

                replacement = self.fix_or_report(
                    call, self.say(
                        "optimizer", "`{call}` is built from `{model}`'s parameters before "
                        "`{model}` is on the XLA device; moving a module to XLA replaces its "
                        "Parameter objects, so this optimizer would update stale CPU copies and "
                        "the model would never train: `{model}` moves to the device where it is "
                        "built", call=self.ctx.short(call), model=model),
                    build)
                if replacement is not None:
                    new_body[i] = replacement
                    changed = True
                break
        return new_body if changed else None

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock):
        body = self._fix_body(original.body, updated.body)
        return None if body is None else updated.with_changes(body=body)

    def leave_Module(self, original: cst.Module, updated: cst.Module):
        body = self._fix_body(original.body, updated.body)
        return None if body is None else updated.with_changes(body=body)
