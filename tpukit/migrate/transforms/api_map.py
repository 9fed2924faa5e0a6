"""Table-driven rules: calls of a qualified name, mapped per target in the rule file.

Each entry under `[targets.<target>.calls."<qualified name>"]` may have:
  replace     an expression template for the call (`{0}`, `{1}`: positional arguments' code,
              `{args}`: all arguments' code)
  statements  templates the call becomes when it is a statement of its own
  remove      the call, as a statement of its own, is removed; the text is the comment left
  helper      a function from tpukit.migrate.helpers that `replace` uses
  instead     no rewrite: what to do instead (the finding's message)
  value_ok    a `statements`/`remove` entry whose call, used as a value, is right as it is
              (`with torch.tpu.set_eager_mode(m):` is the context manager's own use)
  when        a regular expression the call's source must match for the entry to apply
  before_launch  the `replace` template to use instead in a launcher's scope (the function or
              top level that calls mp.spawn / torch_xla.launch), where the XLA runtime must
              not be initialised yet (`before_launch_note`: its note, `before_launch_helper`:
              its helper)
"""

from __future__ import annotations

import re

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.transforms.base import StatementPlan, Transform, engine


@engine("call-map")
class CallMap(Transform):
    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.calls: dict[str, dict] = self.mapping.get("calls", {})

    def _entry(self, call: cst.BaseExpression) -> tuple[str, dict] | tuple[None, None]:
        if not isinstance(call, cst.Call):
            return None, None
        name = self.ctx.qualify(call.func)
        entry = self.calls.get(name) if name else None
        if entry is None:
            return None, None
        if "when" in entry and not re.search(entry["when"], self.ctx.code(call)):
            return None, None
        return name, entry

    def _describe(self, call: cst.Call, new: str, entry: dict) -> str:
        note = entry.get("note") or self.rule.message_for(self.ctx.target) or self.rule.summary
        return f"`{self.ctx.short(call)}` -> `{new}`: {note}"

    def _manual(self, call: cst.Call, text: str) -> None:
        self.ctx.report(self.rule, call, f"`{self.ctx.short(call)}`: {text}", False, fix=FixKind.NONE)

    def _format(self, template: str, call: cst.Call) -> str:
        positional = [self.ctx.code(a.value) for a in call.args if a.keyword is None]
        everything = ", ".join(self.ctx.code(a).rstrip(", ") for a in call.args)
        return template.format(*positional, args=everything)

    def visit_Expr(self, node: cst.Expr):
        name, entry = self._entry(node.value)
        if entry is None or not ("statements" in entry or "remove" in entry):
            return None
        call = node.value
        if "remove" in entry:
            note = f'removed "{self.ctx.short(call)}": {entry["remove"]}'
            plan = self.fix_or_report(
                call, f"`{self.ctx.short(call)}` is removed: {entry['remove']}",
                lambda: StatementPlan([], note),
            )
        else:
            texts = [self._format(t, call) for t in entry["statements"]]
            plan = self.fix_or_report(
                call, self._describe(call, "; ".join(texts), entry),
                lambda: StatementPlan([self.ctx.statement(t) for t in texts]),
            )
        return plan

    def visit_Call(self, node: cst.Call):
        name, entry = self._entry(node)
        if entry is None:
            return None
        if "replace" not in entry:
            if entry.get("value_ok"):
                return None
            text = entry.get("instead")
            if text is None:  # statement-only entry used as a value
                text = self.say("value", "has no XLA equivalent as a value; ") + (
                    entry.get("remove") or "call it as a statement of its own"
                )
            self._manual(node, text)
            return None
        template = entry["replace"]
        if "before_launch" in entry and self.ctx.in_launcher():
            template = entry["before_launch"]
            entry = {**entry, "note": entry.get("before_launch_note", entry.get("note")),
                     "helper": entry.get("before_launch_helper")}
        new = self._format(template, node)

        def build():
            if entry.get("helper"):
                self.ctx.helpers_needed.add(entry["helper"])
            return self.ctx.expr(new)

        return self.fix_or_report(node, self._describe(node, new, entry), build)
