"""The traversal that runs every selected rule's hooks in one pass: hooks dispatched by node
type, two rules rewriting one node reported as a conflict, statement plans (lines added
before or after a statement, statements removed with a comment) applied to their block, and
a rewrite that would drop a `*args`/`**kwargs` refused."""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate import library_mode
from tpukit.migrate.context import MigrationContext, dotted
from tpukit.migrate.analysis.cuda_only import cuda_only_function, cuda_only_try, ported_import
from tpukit.migrate.guards import (
    library_cuda_choice,
    restore_after,
    restore_flags,
    restore_loop,
    restore_unported,
)
from tpukit.migrate.nodes import children, walk
from tpukit.migrate.prune import Layout
from tpukit.migrate.transforms.base import HookTable, StatementPlan
from tpukit.rules import engine_say


COMMENT_PREFIX = "# tpukit: "


class MigrationBug(Exception):
    """tpukit failed on this file (a rule raised, or its output would not compile): the file is
    left as it was. `line`: where, when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


# the statements and expressions that may be library code's CUDA-or-CPU choice
_CHOICES = frozenset({cst.If, cst.IfExp, cst.Assert})


class Rewriter(cst.CSTTransformer):
    def __init__(self, ctx: MigrationContext, hooks: HookTable, layout: Layout) -> None:
        super().__init__()
        self.ctx = ctx
        self.hooks = hooks
        # What the traversal tells the shared facts, before any rule's hook.
        self.facts = HookTable(list(ctx.facts))
        self.skip = layout.skip
        self.top_level = layout.first_line
        self.planned: dict[cst.CSTNode, object] = {}
        self.statement_plans: dict[cst.CSTNode, StatementPlan] = {}
        self.removed_lines: dict[cst.CSTNode, str] = {}
        self.cuda_only_at: set[int] = set()  # id() of the nodes that pushed ctx.cuda_only

    # Bookkeeping that every rule relies on, then the rules' own hooks.
    def on_visit(self, node: cst.CSTNode) -> bool:
        ctx = self.ctx
        ctx.reached(node)
        if id(node) in self.skip:
            return False
        if ctx.library_code and library_mode.confined(node, ctx.target):
            self.skip.add(id(node))  # the port and the code as written, chosen at run time
            return False
        if id(node) in self.top_level:
            ctx.sink.current_top = node
        # (node types by identity: libcst's node classes have no subclasses, and isinstance
        # through their ABCMeta cost 5% of a run on every node)
        node_type = type(node)
        if node_type is cst.Import:
            ctx.add_import(node)
            ctx.in_import = True
        elif node_type is cst.ImportFrom:
            ctx.add_import_from(node)
            ctx.in_import = True
            module = ported_import(ctx, node)
            if module is not None:  # Apex's DistributedDataParallel is torch's from here on
                for alias in node.names:
                    bound = alias.asname.name if alias.asname else alias.name
                    if isinstance(bound, cst.Name):
                        ctx.names.aliases[bound.value] = f"{module}.{dotted(alias.name)}"
        elif node_type is cst.FormattedString:
            ctx.fstring_quotes.append(node.quote)
        elif node_type is cst.Assign:
            ctx.assign_targets.append([t.target for t in node.targets])
        elif node_type is cst.FunctionDef or node_type is cst.Lambda:
            ctx.functions.append(node)
        why = (cuda_only_function(node, ctx) if node_type is cst.FunctionDef
               else cuda_only_try(node, ctx.path, ctx) if node_type is cst.Try
               else library_cuda_choice(ctx, node) if node_type in _CHOICES else None)
        if why:
            ctx.cuda_only.append(why)
            self.cuda_only_at.add(id(node))  # popped after the node's own leave hooks
        kind = node_type.__name__
        for fact in self.facts.visit.get(kind, ()):
            fact(node)
        hooks = self.hooks.visit.get(kind, ())
        for i, hook in enumerate(hooks):
            reported = len(ctx.reports)
            plan = hook(node)
            if plan is not None:
                if i + 1 < len(hooks):
                    self._no_rival(node, hook, hooks[i + 1:])
                if isinstance(plan, StatementPlan):
                    self.statement_plans[node] = plan
                else:
                    self.planned[node] = _unless_splats_lost(ctx, node, plan, reported)
                return False
        return True

    def _conflict(self, node: cst.CSTNode, hook, rival) -> None:
        top = self.ctx.current_top
        line = self.top_level.get(id(top))
        raise MigrationBug(
            f"rules {rule_of(hook).code} and {rule_of(rival).code} both rewrite "
            f"`{self.ctx.short(node)}`; file left unchanged, please report this",
            None if line is None else line + len(getattr(top, "leading_lines", ())))

    def _no_rival(self, node: cst.CSTNode, hook, rivals) -> None:
        """A rule planned `node`: no other rule may plan it too (which one would win is an
        accident of order). The rivals run as a probe whose reports and needs are undone."""
        sink = self.ctx.sink
        point = sink.checkpoint()
        try:
            for rival in rivals:
                if getattr(rival, "hook", rival)(node) is not None:
                    self._conflict(node, hook, rival)
        finally:
            sink.rollback(point)

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):
        if original in self.ctx.left_as:
            # a rule that moves statements across a block finds this one's result there
            self.ctx.left_as[original] = result = self._left(original, updated)
            return result
        return self._left(original, updated)

    def _left(self, original: cst.CSTNode, updated: cst.CSTNode):
        if id(original) in self.skip:
            return updated
        # CUDA-only code stays CUDA-only through its own node's leave hooks: a library's
        # `"cuda" if torch.cuda.is_available() else "cpu"` kept whole had its "cuda" made
        # "xla" by the conditional's leave hook (minGPT's trainer, named as a folder).
        try:
            result = self._leave(original, updated)
            kept = _keep_parentheses(original, result)
            if kept is not result and id(result) in self.ctx.guards:
                # the guard a rewrite registered is now the parenthesized node (ids only
                # stand for live nodes: a stale one could name the next node made)
                self.ctx.guards[id(kept)] = self.ctx.guards.pop(id(result))
            return kept
        finally:
            if id(original) in self.cuda_only_at:
                self.cuda_only_at.discard(id(original))
                self.ctx.cuda_only.pop()

    def _leave(self, original: cst.CSTNode, updated: cst.CSTNode):
        node_type = type(original)
        if node_type is cst.Assign:
            self.ctx.assign_targets.pop()
        elif node_type is cst.FunctionDef or node_type is cst.Lambda:
            self.ctx.functions.pop()
        elif node_type is cst.Import or node_type is cst.ImportFrom:
            self.ctx.in_import = False
        elif node_type is cst.FormattedString:
            self.ctx.fstring_quotes.pop()
        kind = node_type.__name__
        for fact in self.facts.leave.get(kind, ()):
            fact(original)
        if original in self.planned:
            return self.planned.pop(original)
        if type(updated) is cst.SimpleStatementLine and any(
                stmt in self.statement_plans for stmt in original.body):
            # The line's own statements first, so that a rule acting on the whole line (a
            # barrier added after it) sees them rewritten instead of dropping the rewrite.
            updated = self._apply_line_plans(original, updated)
            if not isinstance(updated, cst.SimpleStatementLine) or updated in self.removed_lines:
                return updated
        edited = None  # (the hook that last changed the node, the parts it replaced)
        for hook in self.hooks.leave.get(kind, ()):
            reported = len(self.ctx.reports)
            result = hook(original, updated)
            if result is not None and result is not updated:
                if edited is not None and _lost(edited[1], result):
                    self._conflict(original, edited[0], hook)
                before, updated = updated, _unless_splats_lost(self.ctx, updated, result, reported)
                if updated is not before:
                    edited = (hook, _replaced(before, updated))
                if isinstance(updated, (cst.FlattenSentinel, cst.RemovalSentinel)):
                    return updated
        if type(updated) is cst.BooleanOperation:
            updated = _fold_true(original, updated)
        if self.ctx.guards:
            updated_type = type(updated)
            if updated_type is cst.If or updated_type is cst.IfExp:
                updated = restore_unported(self.ctx, original, updated)
            elif updated_type is cst.Assign:
                updated = restore_flags(self.ctx, original, updated)
            elif updated_type is cst.For:
                updated = restore_loop(self.ctx, updated)
        updated_type = type(updated)
        if updated_type is cst.SimpleStatementLine:
            return self._apply_line_plans(original, updated)
        if updated_type is cst.SimpleStatementSuite:
            return self._apply_suite_plans(original, updated)
        if updated_type is cst.IndentedBlock or updated_type is cst.Module:
            if self.ctx.guarded_after:
                updated = restore_after(self.ctx, updated)
            return self._place_removal_comments(updated)
        return updated

    def _planned_body(self, original, updated) -> tuple[list, list[str]] | None:
        if not any(stmt in self.statement_plans for stmt in original.body):
            return None
        body, comments = [], []
        for old, new in zip(original.body, updated.body):
            plan = self.statement_plans.pop(old, None)
            if plan is None:
                body.append(new)
                continue
            body.extend(plan.statements)
            if not plan.statements and plan.comment:
                comments.append(plan.comment)
        return body, comments

    def _apply_line_plans(self, original, updated):
        planned = self._planned_body(original, updated)
        if planned is None:
            return updated
        body, comments = planned
        if not body:
            marker = updated.with_changes(body=[cst.Pass()])
            self.removed_lines[marker] = _removal_comment(comments, updated.trailing_whitespace)
            return marker
        if len(original.body) == 1 and len(body) > 1:
            # One statement became several: one line each, comments kept on the first/last.
            lines = []
            for i, stmt in enumerate(body):
                lines.append(
                    cst.SimpleStatementLine(
                        body=[_strip_semicolon(stmt)],
                        leading_lines=updated.leading_lines if i == 0 else (),
                        trailing_whitespace=updated.trailing_whitespace
                        if i == len(body) - 1
                        else cst.TrailingWhitespace(),
                    )
                )
            return cst.FlattenSentinel(lines)
        return updated.with_changes(body=_join(body))

    def _apply_suite_plans(self, original, updated):
        planned = self._planned_body(original, updated)
        if planned is None:
            return updated
        body, _ = planned
        return updated.with_changes(body=_join(body or [cst.Pass()]))

    def _place_removal_comments(self, block):
        """A removed line leaves a comment where it was; `pass  # ...` if the block is left empty."""
        if not any(stmt in self.removed_lines for stmt in block.body):
            return block
        body, pending = [], []
        for stmt in block.body:
            comment = self.removed_lines.pop(stmt, None)
            if comment is None:
                if pending:
                    stmt = stmt.with_changes(leading_lines=[*pending, *stmt.leading_lines])
                    pending = []
                body.append(stmt)
                continue
            pending.extend(stmt.leading_lines)
            pending.append(cst.EmptyLine(comment=cst.Comment(comment)))
            last_stmt = stmt
        if pending:
            if body or isinstance(block, cst.Module):
                return block.with_changes(body=body, footer=[*pending, *block.footer])
            body.append(
                last_stmt.with_changes(
                    leading_lines=pending[:-1],
                    trailing_whitespace=cst.TrailingWhitespace(
                        whitespace=cst.SimpleWhitespace("  "),
                        comment=pending[-1].comment,
                    ),
                )
            )
        return block.with_changes(body=body)


def _is_true(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def _bool_valued(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Comparison, cst.BooleanOperation)):
        return True
    if isinstance(node, cst.UnaryOperation):
        return isinstance(node.operator, cst.Not)
    return isinstance(node, cst.Call) and dotted(node.func) == "bool"


def _fold_true(original: cst.BooleanOperation, updated: cst.BooleanOperation):
    """An operand a rewrite made `True` (`torch.cuda.is_bf16_supported()` on a TPU) drops out
    of an `and`: `True and x` is `x`, and `x and True` is `x` when x is already a bool."""
    if not isinstance(updated.operator, cst.And):
        return updated
    if _is_true(updated.left) and not _is_true(original.left):
        return updated.right
    if (_is_true(updated.right) and not _is_true(original.right)
            and _bool_valued(updated.left)):
        return updated.left
    return updated


def _keep_parentheses(original: cst.CSTNode, result):
    """A replacement keeps the parentheses of the expression it replaces: `assert(x)` and
    `not(x)` need them (no space follows the keyword), and a rewritten operand keeps its
    grouping."""
    lpar = getattr(original, "lpar", None)
    if (lpar and result is not original and isinstance(result, cst.BaseExpression)
            and not getattr(result, "lpar", True)):
        return result.with_changes(lpar=original.lpar, rpar=original.rpar)
    return result


def rule_of(hook):
    """The rule whose hook this is (a suppression trial wraps the rule's own in `.hook`)."""
    return getattr(hook, "hook", hook).__self__.rule


def _arg_code(arg: cst.Arg) -> str:
    return arg.star + _EMPTY.code_for_node(arg.value)


_EMPTY = cst.Module(body=[])


def _replaced(before: cst.CSTNode, after: cst.CSTNode) -> list[cst.CSTNode]:
    """The parts of `after` a leave hook made (children not carried over from `before`): a
    replacement of another kind is made whole."""
    if type(after) is not type(before):
        return [after]
    kept = {id(child) for child in children(before)}
    return [child for child in children(after) if id(child) not in kept]


def _lost(parts: list[cst.CSTNode], result: cst.CSTNode) -> bool:
    """A later leave hook's `result` drops what an earlier one made (`parts`): it rebuilt the
    node from the original, or replaced the same part. Rules chain on one node (each gets the
    last one's result); none may undo another's edit, since which one won would be an accident
    of order. A part kept anywhere in `result` (wrapped, moved) is not lost."""
    if not parts or isinstance(result, cst.RemovalSentinel):
        return False  # removed: the same outcome whichever rule ran first
    roots = result.nodes if isinstance(result, cst.FlattenSentinel) else (result,)
    kept = {id(node) for node in walk(*roots)}
    return any(id(part) not in kept for part in parts)


def _unless_splats_lost(ctx: MigrationContext, before: cst.CSTNode, after: cst.CSTNode,
                        reported: int) -> cst.CSTNode:
    """A call's `*args` and `**kwargs` hold arguments no rule can see: a rewrite of the call
    that drops one, or that adds a keyword a `**kwargs` may already hold (a TypeError at run
    time), is not applied; the rule's findings from it say so, for a person to port."""
    if not (isinstance(before, cst.Call) and isinstance(after, cst.Call)) or before is after:
        return after
    splats = [a for a in before.args if a.star]
    if not splats:
        return after
    kept = {_arg_code(a) for a in after.args if a.star}
    lost = [a for a in splats if _arg_code(a) not in kept]
    had = {a.keyword.value for a in before.args if a.keyword}
    added = [a.keyword.value for a in after.args if a.keyword and a.keyword.value not in had]
    double = next((a for a in splats if a.star == "**"), None)
    if not lost and not (added and double is not None):
        return after
    why = (engine_say("migrate", "why_splat_dropped", ctx.target, arg=_arg_code(lost[0])) if lost
           else engine_say("migrate", "why_splat_keyword", ctx.target, keyword=added[0],
                           arg=_arg_code(double)))
    for report in ctx.reports[reported:]:
        report.applied = False
        report.fix = FixKind.NONE
        report.message += engine_say("migrate", "splat_left", ctx.target, why=why)
    return before


def _removal_comment(comments: list[str], trailing: cst.TrailingWhitespace) -> str:
    text = COMMENT_PREFIX + "; ".join(comments)
    if trailing.comment is not None:
        text += "  " + trailing.comment.value
    return text


def _strip_semicolon(stmt: cst.BaseSmallStatement) -> cst.BaseSmallStatement:
    return stmt.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)


def _join(body: list[cst.BaseSmallStatement]) -> list[cst.BaseSmallStatement]:
    """Small statements of one line: `; ` between them, none after the last."""
    joined = []
    for i, stmt in enumerate(body):
        last = i == len(body) - 1
        semicolon = (
            cst.MaybeSentinel.DEFAULT
            if last
            else cst.Semicolon(whitespace_after=cst.SimpleWhitespace(" "))
        )
        joined.append(stmt.with_changes(semicolon=semicolon))
    return joined
