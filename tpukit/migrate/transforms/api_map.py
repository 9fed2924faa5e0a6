"""Table-driven rules: calls of a qualified name, mapped per target in the rule file.

Each entry under `[targets.<target>.calls."<qualified name>"]` may have:
  replace     an expression template for the call (`{0}`, `{1}`: positional arguments' code,
              `{args}`: all arguments' code)
  statements  templates the call becomes when it is a statement of its own
  remove      the call, as a statement of its own, is removed; the text is the comment left
  helper      a function from tpukit.migrate.helpers that `replace` uses
  instead     no rewrite: what to do instead (the finding's message)
  when        a regular expression the call's source must match for the entry to apply
  otherwise   the finding's message for a call `when` does not match (no rewrite)
  as_device   the `replace` template where the call's value is used as a device (`.to(...)`,
              `device=`, `map_location=`, a `device_map` dict; `as_device_note`: its note)
  before_launch  the `replace` template to use instead in a launcher's scope (the function or
              top level that calls mp.spawn / torch_xla.launch), where the XLA runtime must
              not be initialised yet (`before_launch_note`: its note, `before_launch_helper`:
              its helper)
"""

from __future__ import annotations

import functools
import re

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.context import dotted, is_cuda_device_string, terminal_name
from tpukit.migrate.transforms.base import StatementPlan, Transform, engine
from tpukit.rules import load_rules


@engine("call-map")
class CallMap(Transform):
    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.calls: dict[str, dict] = self.mapping.get("calls", {})
        # id() of a rewritten availability guard -> (the call as written, its report)
        self.guards: dict[int, tuple[cst.Call, object]] = {}
        self.as_device = any("as_device" in entry for entry in self.calls.values())
        self.device_arguments: set[int] = set()  # id() of expressions used as a device

    def _entry(self, call: cst.BaseExpression,
               report_otherwise: bool = False) -> tuple[str, dict] | tuple[None, None]:
        if not isinstance(call, cst.Call):
            return None, None
        name = self.ctx.qualify(call.func)
        entry = self.calls.get(name) if name else None
        if entry is None:
            return None, None
        if "when" in entry and not re.search(entry["when"], self.ctx.code(call)):
            if report_otherwise and "otherwise" in entry:
                self._manual(call, entry["otherwise"])
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

    def _mark_device_arguments(self, node: cst.Call) -> None:
        """Remember the arguments of `node` that take a device, for the calls inside them."""
        func = node.func
        # x.to(d), x.cuda(d), torch.device(d), send_to_device(batch, d): the first arguments
        moves = isinstance(func, cst.Attribute) and func.attr.value in ("to", "cuda")
        if terminal_name(func).endswith("to_device"):
            self.device_arguments.update(id(a.value) for a in node.args[:2] if not a.keyword)
        for i, arg in enumerate(node.args):
            if (arg.keyword is None and not arg.star and i == 0
                    and (moves or self.ctx.qualify(func) == "torch.device")) or (
                    arg.keyword is not None and arg.keyword.value in DEVICE_KEYWORDS):
                self.device_arguments.add(id(arg.value))
                if isinstance(arg.value, cst.Dict):  # device_map={"": ...}
                    self.device_arguments.update(
                        id(e.value) for e in arg.value.elements if isinstance(e, cst.DictElement))

    def visit_Call(self, node: cst.Call):
        if self.as_device:
            self._mark_device_arguments(node)
        name, entry = self._entry(node, report_otherwise=True)
        if entry is None:
            return None
        if "replace" not in entry:
            text = entry.get("instead")
            if text is None:  # statement-only entry used as a value
                text = self.say("value", "has no XLA equivalent as a value; ") + (
                    entry.get("remove") or "call it as a statement of its own"
                )
            self._manual(node, text)
            return None
        template = entry["replace"]
        if "as_device" in entry and id(node) in self.device_arguments:
            template = entry["as_device"]
            entry = {**entry, "note": entry.get("as_device_note", entry.get("note"))}
        elif "before_launch" in entry and self.ctx.in_launcher():
            template = entry["before_launch"]
            entry = {**entry, "note": entry.get("before_launch_note", entry.get("note")),
                     "helper": entry.get("before_launch_helper")}
        elif self.ctx.at_import_time() and STARTS_RUNTIME.search(template):
            if "before_launch" in entry:  # what runs before torch_xla.launch runs here too
                template = entry["before_launch"]
                entry = {**entry, "note": "this runs when the module is imported, where the "
                         "XLA runtime must not start yet: " + entry.get("note", ""),
                         "helper": entry.get("before_launch_helper")}
            else:
                self._manual(node, f"`{self._format(template, node)}` would start the XLA "
                             "runtime when this module is imported; move the call into the "
                             "function that needs it, then port it")
                return None
        new = self._format(template, node)

        def build():
            if entry.get("helper"):
                self.ctx.helpers_needed.add(entry["helper"])
            return self.ctx.expr(new)

        replacement = self.fix_or_report(node, self._describe(node, new, entry), build)
        if replacement is not None and name in GUARDS:
            self.guards[id(replacement)] = (node, self.ctx.reports[-1])
        return replacement

    # -- availability guards ----------------------------------------------------------------
    # `if torch.cuda.is_available(): return torch.cuda.Stream(device)`: on a TPU the guard
    # is true once rewritten, and the CUDA-only code it guards would run. A guard is rewritten
    # only when everything it guards is migrated; otherwise it stays as it was (False on a
    # TPU VM: the other branch runs) and says why.
    def leave_If(self, original: cst.If, updated: cst.If):
        return self._guard(updated, updated.body, updated.orelse)

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp):
        return self._guard(updated, updated.body, updated.orelse)

    def _guard(self, updated, body, orelse):
        if not self.guards:
            return None
        found = _GuardUses(self.guards)
        updated.test.visit(found)
        restore = {}
        for key, negated in found.uses.items():
            guarded = orelse if negated else body
            left = residual_cuda(self.ctx, guarded) if guarded is not None else None
            if left is None:
                continue
            call, report = self.guards.pop(key)
            restore[key] = call
            report.applied = False
            report.fix = FixKind.NONE
            report.message = (
                f"`{self.ctx.short(call)}` guards code that is still CUDA-only (`{left}`): "
                "left as it is (False on a TPU, so the other branch runs); port what it "
                "guards, then the guard")
        if not restore:
            return None
        return updated.with_changes(test=updated.test.visit(_Restore(restore)))


GUARDS = {"torch.cuda.is_available", "torch.accelerator.is_available"}
DEVICE_KEYWORDS = ("device", "map_location", "device_map")
# torch_xla calls that start the runtime (xr.device_type() only reads the environment).
STARTS_RUNTIME = re.compile(r"torch_xla\.device(?:_count)?\(|\bxm\.|\bxr\.(?!device_type\()")


class _GuardUses(cst.CSTVisitor):
    """The rewritten guards in a test, each with whether it is negated (`not ...`)."""

    def __init__(self, guards: dict) -> None:
        self.guards = guards
        self.uses: dict[int, bool] = {}
        self.negations = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) in self.guards:
            self.uses[id(node)] = self.negations % 2 == 1
            return False
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            self.negations += 1
        return True

    def on_leave(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            self.negations -= 1


class _Restore(cst.CSTTransformer):
    def __init__(self, originals: dict) -> None:
        self.originals = originals

    def on_leave(self, original, updated):
        return self.originals.get(id(original), updated)


def residual_cuda(ctx, node: cst.CSTNode) -> str | None:
    """The first CUDA-only thing left in rewritten code (a torch.cuda name, a `.cuda()`
    call, a "cuda" device string, a CUDA-only library), or None."""
    finder = _ResidualCuda(ctx)
    node.visit(finder)
    return finder.found


class _ResidualCuda(cst.CSTVisitor):
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.found: str | None = None

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.found is not None:
            return False
        if isinstance(node, (cst.Attribute, cst.Name)):
            name = self.ctx.qualify(node) or ""
            if name == "torch.cuda" or name.startswith("torch.cuda.") or _cuda_only(name):
                self.found = name
                return False
            if isinstance(node, cst.Attribute) and node.attr.value == "cuda" \
                    and not self.ctx.qualify(node.value):
                self.found = f"{self.ctx.short(node)}()"
                return False
        elif isinstance(node, (cst.Import, cst.ImportFrom)):
            module = dotted(node.module) if isinstance(node, cst.ImportFrom) else (
                dotted(node.names[0].name) if node.names else None)
            if module and (module.startswith("torch.cuda") or _cuda_only(module)):
                self.found = f"import {module}"
            return False
        elif isinstance(node, cst.SimpleString) and is_cuda_device_string(node):
            self.found = node.value
        return True


def _cuda_only(name: str) -> bool:
    return bool(name) and any(name == m or name.startswith(m + ".") for m in cuda_only_modules())


@functools.cache
def cuda_only_modules() -> tuple[str, ...]:
    """The modules the CUDA-only-library rules (TPU9xx) name."""
    return tuple(m for rule in load_rules().values()
                 if rule.extra.get("engine") == "cuda-only-import" for m in rule.extra["modules"])
