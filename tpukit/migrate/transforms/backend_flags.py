"""cuDNN and CUDA backend flags: removed, with a comment saying why."""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.transforms.base import StatementPlan, Transform, transform

PREFIXES = ("torch.backends.cudnn.", "torch.backends.cuda.")


@transform("TPU120")
class BackendFlags(Transform):
    def _is_flag(self, expr) -> bool:
        name = self.ctx.qualify(expr)
        return bool(name) and name.startswith(PREFIXES)

    def _remove(self, statement: cst.CSTNode):
        text = self.ctx.short(statement)
        if self.library_leaves(statement, "flag", lambda: self.say("library", code=text)):
            return None  # transformers' enable_full_determinism: CUDA's determinism, kept
        return self.fix_or_report(
            statement, self.say("flag", code=text),
            lambda: StatementPlan([], f'removed "{text}": {self.rule.message}'),
        )

    def visit_Assign(self, node: cst.Assign):
        if any(self._is_flag(t.target) for t in node.targets):
            return self._remove(node)
        return None

    def visit_AugAssign(self, node: cst.AugAssign):
        return self._remove(node) if self._is_flag(node.target) else None

    def visit_Expr(self, node: cst.Expr):
        call = node.value
        if isinstance(call, cst.Call) and self._is_flag(call.func):
            return self._remove(node)
        return None

    def visit_WithItem(self, node: cst.WithItem):
        call = node.item
        if isinstance(call, cst.Call) and self._is_flag(call.func):
            self.ctx.report(self.rule, call, self.say("context", code=self.ctx.short(call)),
                            applied=False, fix=FixKind.NONE)
        return None
