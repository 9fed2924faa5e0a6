"""Any `torch.cuda.*` name no other rule spoke for: it will fail or do nothing on TPU.

A target whose module mirrors torch.cuda (TorchTPU's `torch.tpu`) names it in its rule table
(`rename`, `exported`): a name it exports is renamed, any other is a finding. `moved` maps the
names the target exports but keeps from user code (TorchTPU's internal device API) to the
call to use instead; `internal` holds the fix for a name with no such call, a finding
(its message `internal` says why).
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate.transforms.base import Transform, transform


@transform("TPU117")
class UnmappedCudaApi(Transform):
    table_keys = frozenset({"aliases", "exported", "internal", "moved", "oom_errors", "rename"})

    def visit_ExceptHandler(self, node: cst.ExceptHandler):
        # `except torch.OutOfMemoryError` (either spelling): a handler XLA never enters
        errors = self.mapping.get("oom_errors")
        if not errors or node.type is None:
            return None
        types = [e.value for e in node.type.elements] if isinstance(node.type, cst.Tuple) \
            else [node.type]
        for expr in types:
            name = self.ctx.qualify(expr)
            if name in errors:
                self.ctx.report(self.rule, node, self.say("oom_handler", name=name), False,
                                fix=FixKind.NONE, severity=Severity.WARNING,
                                runs_as_written=True)
                return None
        return None
    def visit_Attribute(self, node: cst.Attribute):
        ctx = self.ctx
        if ctx.in_import:
            return None
        inner = []
        value = node.value
        while isinstance(value, cst.Attribute):
            inner.append(value)
            value = value.value
        if id(node) not in ctx.handled:
            name = ctx.qualify(node)
            if not (name and name.startswith("torch.cuda.")):
                return None
            if name not in ctx.claimed:
                ctx.handled.update(id(n) for n in inner)
                return self._rename(node, name)
        ctx.handled.update(id(n) for n in inner)  # `torch.cuda.amp` inside `torch.cuda.amp.x`
        return None

    def _rename(self, node: cst.Attribute, name: str):
        rest = name[len("torch.cuda."):]
        head = rest.split(".")[0]
        moved = self.mapping.get("moved", {})
        aliases = self.mapping.get("aliases", {})
        if head in aliases:
            new = aliases[head] + rest[len(head):]
            why = self.say("why_alias", name=name, new=new)
        elif head in moved:
            new = moved[head] + rest[len(head):]
            why = self.say("why_moved", module=self.mapping["rename"], name=head, call=moved[head])
        elif "rename" in self.mapping and head in self.mapping["exported"]:
            new = f"{self.mapping['rename']}.{rest}"
            why = self.say("why_exported")
        elif head in self.mapping.get("internal", {}):
            # a name TorchTPU keeps internal whose replacement torch does not have: the table
            # holds the fix
            self.ctx.report(self.rule, node, self.say(
                "internal", name=name, module=self.mapping["rename"], head=head,
                fix=self.mapping["internal"][head]), False, fix=FixKind.NONE)
            return None
        else:
            self._report(node, name)
            return None
        # an alias is the same object on a TPU host: it runs there as written (not counted by
        # `tpukit run`'s leftover-CUDA check)
        return self.fix_or_report(node, self.say("renamed", name=name, new=new, why=why),
                                  lambda: self.ctx.expr(new), runs_as_written=head in aliases)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        # `from torch.cuda import Stream` then `Stream()`: a bare name. Checked on leave, when
        # every rule's visit hook has had its chance to claim the call.
        if isinstance(original.func, cst.Name) and id(original) not in self.ctx.handled:
            name = self.ctx.qualify(original.func)
            if name and name.startswith("torch.cuda.") and name not in self.ctx.claimed:
                self._report(original, name)
        return None

    def _report(self, node: cst.CSTNode, name: str) -> None:
        self.ctx.report(self.rule, node, self.say(
            "unmapped", name=name, message=self.rule.message_for(self.ctx.target)), False,
            fix=FixKind.NONE)
