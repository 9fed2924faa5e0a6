"""One file in, migrated source and findings out: one parse, one batched traversal.

The rewriter runs every selected rule's hooks in a single pass. Afterwards, and only for a
file that changed, imports are added (libcst's AddImportsVisitor) and imports the rewrite
left unused are removed; everything outside changed nodes stays byte-identical.
"""

from __future__ import annotations

import ast
import dataclasses
import warnings
from dataclasses import dataclass, field

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider

from tpukit.config import EAGER_MODES
from tpukit.findings import Finding, FixKind, Location
from tpukit.migrate import helpers, library_mode
from tpukit.migrate.context import IMPORTS, MigrationContext, dotted, string_value
from tpukit.migrate.guards import (
    cuda_only_function,
    cuda_only_try,
    library_cuda_choice,
    restore_after,
    restore_flags,
    restore_loop,
    restore_unported,
)
from tpukit.migrate.nodes import is_docstring, walk
from tpukit.migrate.ownership import Owner
from tpukit.migrate.prune import Layout
from tpukit.migrate.suppressing import SuppressedHooks
from tpukit.migrate.transforms import load_transforms
from tpukit.migrate.transforms.base import HookTable, StatementPlan, transform_for
from tpukit.rules import Rule, engine_say
from tpukit.suppress import Suppressions, split, unused_findings

COMMENT_PREFIX = "# tpukit: "
# Imports whose names a rewrite can leave unused (torch.cuda.*, cuDNN flags, accelerator API,
# ZeroRedundancyOptimizer).
_ORPHANABLE = (
    "torch.cuda",
    "torch.backends.cudnn",
    "torch.backends.cuda",
    "torch.accelerator",
    "torch.amp",
    "torch.distributed.optim.ZeroRedundancyOptimizer",  # rewritten to the plain optimizer
    "torch.distributed.optim.zero_redundancy_optimizer",
)


@dataclass
class MigrateOptions:
    rules: list[Rule]
    target: str = "xla"
    unsafe_fixes: bool = False
    # torchtpu: the `--eager-mode` name set at start-up (None: the mode is not set).
    eager_mode: str | None = None
    # False: only decide whether anything changes (check mode): skips the import fix-up.
    render_source: bool = True
    # Also report suppression comments that silence nothing (TPU009).
    strict: bool = False
    # False: parse every file and traverse every statement, whatever its trigger words (the
    # test that every rule declares the words it needs compares both ways).
    prune: bool = True
    # Rule code -> why its rewrites are held (reported, not applied): a rule it `needs` is
    # turned off here by a suppression comment (set by migrate_source itself, see _held).
    held: dict[str, str] = field(default_factory=dict)
    # Whose code the file is (ownership.py): the user's program, ported whole, or a library
    # ported in library mode (a package module keeps its own CUDA choices).
    owner: Owner = Owner.PROGRAM
    # What the program's other modules say about this one (analysis/program.py), and its
    # dotted module name among them.
    received: object = None
    module_name: str = ""


@dataclass
class Migration:
    source: str
    new_source: str  # equals `source` in check mode, where the new text is not rendered
    findings: list[Finding] = field(default_factory=list)
    changed: bool = False
    # Findings a `# tpukit: ignore` comment silenced: each finding's dict plus `suppressed_by`.
    suppressed: list[dict] = field(default_factory=list)


load_transforms()


def triggers_of(rules: list[Rule], target: str | None = None) -> tuple[str, ...]:
    """The words a file must hold for any of `rules` (those that run on `target`) to match."""
    return tuple(sorted({t for rule in rules if target is None or not rule.skips(target)
                         for t in rule.triggers}))


def api_words(source: str) -> str | None:
    """What the file's code says of the APIs it uses, one word a line: the attributes it
    reads that it never sets itself (`torch.cuda.synchronize`, `x.is_cuda`, `.cuda()`; not
    `self.use_cuda`, which it sets), what it imports, its string values (not docstrings) and
    the keywords it passes; never its own names, comments or docstrings. None where Python's
    `ast` cannot read it (libcst then says why)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            docstrings.add(id(node.body[0].value))
    words = []
    attributes = []
    aliases: dict[str, str] = {}  # a name an import binds -> what it imports
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            words += [a.name for a in node.names]
            aliases.update({a.asname: a.name for a in node.names if a.asname})
            aliases.update({a.name.split(".")[0]: a.name.split(".")[0] for a in node.names
                            if not a.asname})
        elif isinstance(node, ast.ImportFrom):
            words += [node.module or "", *(a.name for a in node.names)]
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                            if node.module})
        elif isinstance(node, ast.Attribute):
            attributes.append(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            words.append(node.value)
        elif isinstance(node, ast.keyword) and node.arg:
            words.append(node.arg)
    own = {n.attr for n in attributes if isinstance(n.ctx, (ast.Store, ast.Del))}
    for node in attributes:
        if node.attr in own and node.attr != "cuda":
            continue
        words.append(node.attr)
        # the chain, from an import by what it imports (`th.tpu.synchronize` is
        # torch.tpu.synchronize), else from its first attribute (`ReduceOp.AVG`)
        parts, root = [node.attr], node.value
        while isinstance(root, ast.Attribute) and root.attr not in own:
            parts.append(root.attr)
            root = root.value
        if isinstance(root, ast.Name) and root.id in aliases:
            parts.append(aliases[root.id])
        if len(parts) > 1:
            words.append(".".join(reversed(parts)))
    return "\n".join(words)


def mentions(source: str, triggers: tuple[str, ...]) -> bool:
    """Does the file's code (api_words: not its names, comments or docstrings) hold a trigger?
    A file whose text holds none is out at once (the common case)."""
    if not any(trigger in source for trigger in triggers):
        return False
    words = api_words(source)
    return words is None or any(trigger in words for trigger in triggers)


def migrate_source(source: str, path: str, options: MigrateOptions) -> Migration:
    """Migrate one file's text. Raises libcst.ParserSyntaxError on invalid Python."""
    suppressions = Suppressions.from_source(source)
    # (a module the program's others give a loader or a device is read whatever its words:
    # UNet's evaluate.py names no CUDA and runs the validation loop on the device it is given)
    if options.prune and options.received is None and not mentions(
            source, triggers_of(options.rules, options.target)):
        return _silenced(Migration(source, source), [], suppressions, path, options)
    module = cst.parse_module(source)
    ctx = MigrationContext(module, options.target, options.unsafe_fixes, source, path,
                           owner=options.owner, received=options.received,
                           module_name=options.module_name)
    ctx.sink.held = options.held
    transforms = []
    triggers: set[str] = set()
    for rule in options.rules:
        if rule.skips(options.target):
            continue
        cls = transform_for(rule)
        if cls is not None:
            transforms.append(cls(rule, ctx))
            triggers |= transforms[-1].statement_triggers(source)
    layout = Layout(module, source, tuple(sorted(triggers)))
    if not options.prune:
        layout.skip.clear()
    hooks = HookTable(transforms)
    trial = None
    if suppressions:
        trial = SuppressedHooks(ctx, module, suppressions, {t.rule.code for t in transforms})
        hooks.visit, hooks.leave = trial.wrap(hooks.visit, False), trial.wrap(hooks.leave, True)
    rewriter = Rewriter(ctx, hooks, layout)
    try:
        new_module = module.visit(rewriter)
    except (RecursionError, MigrationBug):
        raise
    except Exception as exc:  # a rule's bug: said at the statement it was rewriting
        raise MigrationBug(f"{type(exc).__name__}: {exc}", _line_of(ctx.current_top, layout)) from exc
    silenced = []
    if trial is not None:
        silenced = _findings(ctx, trial.suppressed, trial.positions, path)
        held = {} if options.held else _held(ctx, trial, options.target)
        if held:  # once more, with the rules that rely on a suppressed one holding their fixes
            return migrate_source(source, path, dataclasses.replace(options, held=held))
    if not ctx.reports:
        return _silenced(Migration(source, source), silenced, suppressions, path, options)
    if ctx.library_code and any(r.applied for r in ctx.reports):
        new_module = _confine(module, new_module, ctx)
    positions = trial.positions if trial is not None else _positions(module, layout, ctx.reports)
    findings = _findings(ctx, ctx.reports, positions, path)
    changed = any(r.applied for r in ctx.reports)
    if not changed:
        return _silenced(Migration(source, source, findings), silenced, suppressions, path,
                         options)
    if not options.render_source:
        return _silenced(Migration(source, source, findings, changed=True), silenced,
                         suppressions, path, options)
    new_module = _fix_imports(new_module, ctx)
    new_module = helpers.insert(new_module, ctx.helpers_needed)
    if ctx.library_code:
        new_module = _library_helper_imports(new_module, ctx)
    if options.eager_mode is not None and not _sets_eager_mode(ctx):
        new_module = _set_eager_mode(new_module, ctx, options.eager_mode)
    new_source = new_module.code
    _check_still_python(source, new_source, path)
    if ctx.library_code:
        broken = library_mode.broken_contract(source, new_source, ctx.target, set(helpers.SOURCES))
        if broken is not None:
            raise MigrationBug(f"the library-mode port would change the code as written at "
                               f"{broken} where the TPU runtime is not imported; file left "
                               "unchanged, please report this")
    return _silenced(Migration(source, new_source, findings, changed=new_source != source),
                     silenced, suppressions, path, options)


def _held(ctx: MigrationContext, trial: SuppressedHooks, target: str) -> dict[str, str]:
    """The rules whose rewrites here rely on a rule a suppression comment turned off (TPU203's
    GradScaler removal on TPU201's bf16 autocast: under `# tpukit: ignore[TPU201]` the fp16
    autocast stays, and needs its loss scaling), each with the sentence that says so."""
    off: dict[str, int] = {}
    for report in trial.suppressed:
        span = trial.positions.get(report.node)
        off.setdefault(report.rule.code, span.start.line if span else 0)
    held = {}
    for report in ctx.reports:
        need = next((code for code in report.rule.needs if code in off), None)
        if report.applied and need is not None:
            held[report.rule.code] = engine_say("migrate", "held_by_suppression", target,
                                                code=need, line=off[need])
    return held


def _silenced(migration: Migration, silenced: list[Finding], suppressions: Suppressions,
              path: str, options: MigrateOptions) -> Migration:
    """The findings the file's suppression comments silenced (`silenced`: the rules' own,
    whose fixes were not applied; a finding not applied that a comment covers, made outside
    a rule's hook, too), and with --strict the comments that silenced nothing (TPU009)."""
    if not suppressions and not suppressions.bad:
        return migration
    unapplied = [f for f in migration.findings if not f.applied]
    _, migration.suppressed = split(silenced, suppressions)
    kept, more = split(unapplied, suppressions)
    if more:
        gone = {id(f) for f in unapplied} - {id(f) for f in kept}
        migration.findings = [f for f in migration.findings if id(f) not in gone]
        migration.suppressed += more
    if options.strict:
        migration.findings = sorted([*migration.findings, *unused_findings(path, suppressions)],
                                    key=Finding.sort_key)
    return migration


def _sets_eager_mode(ctx: MigrationContext) -> bool:
    """Does the file set (`torch.tpu.eager_mode = ...`) or enter (`torch.tpu.set_eager_mode(
    ...)`) a mode already, by the names its code resolves to (a variable of its own called
    `eager_mode` is no mode)?"""
    if "eager_mode" not in ctx.source:
        return False  # neither name is written (a sound prefilter)
    values = ctx.values
    return any(
        (isinstance(node, cst.AssignTarget) and values.qualified(node.target) == "torch.tpu.eager_mode")
        or (isinstance(node, cst.Call) and values.qualified(node.func) == "torch.tpu.set_eager_mode")
        for node in walk(ctx.module))


def _set_eager_mode(module: cst.Module, ctx: MigrationContext, mode: str) -> cst.Module:
    """TorchTPU's eager mode (`--eager-mode`), set once right after the imports of a file that
    the rewrite made import torch_tpu: before the first op on the device. Through the property
    (`torch.tpu.eager_mode = ...`): `torch.tpu.set_eager_mode(mode)` is a context manager, and
    called as a statement it sets nothing."""
    if not helpers.imports_module(module, "torch_tpu"):
        return module
    torch = next((name for name, full in ctx.aliases.items() if full == "torch"), None)
    if torch is None:
        context = CodemodContext()
        AddImportsVisitor.add_needed_import(context, "torch")
        module, torch = AddImportsVisitor(context).transform_module(module), "torch"
    member = EAGER_MODES[mode]
    return helpers.insert_statement(
        module, f"{torch}.tpu.eager_mode = {torch}.tpu.EagerMode.{member}")


class MigrationBug(Exception):
    """tpukit failed on this file (a rule raised, or its output would not compile): the file is
    left as it was. `line`: where, when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


def _line_of(top: cst.CSTNode | None, layout: Layout) -> int | None:
    """The first code line of a top-level statement (after its leading blank lines)."""
    if top is None or id(top) not in layout.first_line:
        return None
    return layout.first_line[id(top)] + len(getattr(top, "leading_lines", ()))


def compiles(source: str, path: str) -> SyntaxError | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the user's own SyntaxWarnings are not ours to print
        try:
            compile(source, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        except SyntaxError as exc:
            return exc
    return None


def _check_still_python(source: str, new_source: str, path: str) -> None:
    exc = compiles(new_source, path)
    if exc is not None:
        if compiles(source, path) is not None:
            return  # newer syntax than this interpreter reads; libcst parsed it, so keep going
        raise MigrationBug(
            f"the rewrite would not compile (line {exc.lineno}: {exc.msg}); file left unchanged, "
            "please report this")


def _positions(module: cst.Module, layout: Layout, reports) -> dict:
    """Node -> CodeRange for the reported nodes. Positions cost a code generation pass, so
    only the top-level statements holding a finding are generated, each on its own and
    shifted to its line in the file (known from the ast walk)."""
    tops = {id(r.top): r.top for r in reports if r.top is not None}
    if not tops or any(key not in layout.first_line for key in tops):
        return dict(MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider))
    positions = {}
    for key, stmt in tops.items():
        alone = module.with_changes(body=[stmt], header=(), footer=())
        shift = layout.first_line[key] - 1
        for node, span in MetadataWrapper(alone, unsafe_skip_copy=True).resolve(
            PositionProvider
        ).items():
            positions[node] = CodeRange(
                CodePosition(span.start.line + shift, span.start.column),
                CodePosition(span.end.line + shift, span.end.column),
            )
    return positions


def _findings(ctx: MigrationContext, reports, positions: dict, path: str) -> list[Finding]:
    findings = []
    for report in reports:
        pos = positions.get(report.node)
        location = (
            Location(path, pos.start.line, pos.start.column + 1, pos.end.line, pos.end.column + 1)
            if pos
            else Location(path)
        )
        findings.append(Finding.from_rule(report.rule, location, report.message, target=ctx.target,
                                          fix=report.fix or report.rule.fix_for(ctx.target),
                                          applied=report.applied, extra=report.extra,
                                          severity=report.severity))
    findings.sort(key=Finding.sort_key)
    return findings


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
        if isinstance(node, cst.Import):
            ctx.add_import(node)
            ctx.in_import = True
        elif isinstance(node, cst.ImportFrom):
            ctx.add_import_from(node)
            ctx.in_import = True
        elif isinstance(node, cst.FormattedString):
            ctx.fstring_quotes.append(node.quote)
        elif isinstance(node, cst.Assign):
            ctx.assign_targets.append([t.target for t in node.targets])
        elif isinstance(node, (cst.FunctionDef, cst.Lambda)):
            ctx.functions.append(node)
        why = (cuda_only_function(node, ctx) if isinstance(node, cst.FunctionDef)
               else cuda_only_try(node, ctx.path) if isinstance(node, cst.Try)
               else library_cuda_choice(ctx, node)
               if isinstance(node, (cst.If, cst.IfExp, cst.Assert)) else None)
        if why:
            ctx.cuda_only.append(why)
            self.cuda_only_at.add(id(node))  # popped after the node's own leave hooks
        kind = type(node).__name__
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
        if isinstance(original, cst.Assign):
            self.ctx.assign_targets.pop()
        elif isinstance(original, (cst.FunctionDef, cst.Lambda)):
            self.ctx.functions.pop()
        elif isinstance(original, (cst.Import, cst.ImportFrom)):
            self.ctx.in_import = False
        elif isinstance(original, cst.FormattedString):
            self.ctx.fstring_quotes.pop()
        for fact in self.facts.leave.get(type(original).__name__, ()):
            fact(original)
        if original in self.planned:
            return self.planned.pop(original)
        if isinstance(updated, cst.SimpleStatementLine) and any(
                stmt in self.statement_plans for stmt in original.body):
            # The line's own statements first, so that a rule acting on the whole line (a
            # barrier added after it) sees them rewritten instead of dropping the rewrite.
            updated = self._apply_line_plans(original, updated)
            if not isinstance(updated, cst.SimpleStatementLine) or updated in self.removed_lines:
                return updated
        edited = None  # (the hook that last changed the node, the parts it replaced)
        for hook in self.hooks.leave.get(type(original).__name__, ()):
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
        if isinstance(updated, cst.BooleanOperation):
            updated = _fold_true(original, updated)
        if self.ctx.guards and isinstance(updated, (cst.If, cst.IfExp)):
            updated = restore_unported(self.ctx, updated)
        elif self.ctx.guards and isinstance(updated, cst.Assign):
            updated = restore_flags(self.ctx, updated)
        elif self.ctx.guards and isinstance(updated, cst.For):
            updated = restore_loop(self.ctx, updated)
        if isinstance(updated, cst.SimpleStatementLine):
            return self._apply_line_plans(original, updated)
        if isinstance(updated, cst.SimpleStatementSuite):
            return self._apply_suite_plans(original, updated)
        if isinstance(updated, (cst.IndentedBlock, cst.Module)):
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
    kept = {id(child) for child in before.children}
    return [child for child in after.children if id(child) not in kept]


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


# -- imports ----------------------------------------------------------------------------
def _fix_imports(module: cst.Module, ctx: MigrationContext) -> cst.Module:
    wanted = set(ctx.imports_needed)
    uses = _NameUses()
    module.visit(uses)
    module = module.visit(_RemoveUnused(uses, _root_bindings(module)))
    # Only what the final code uses: a rewrite inside a node that an outer rewrite then
    # replaced whole (a "cuda" -> "xla" inside a map_location that became "cpu") needs nothing.
    needed = {alias for alias in wanted if uses.names.get(alias)}
    if "torch_xla" in wanted and "xla" in uses.device_strings:
        needed.add("torch_xla")  # 'xla' device strings work once torch_xla is imported
    if "torch_tpu" in wanted and (uses.device_strings & {"tpu", "tpu_dist"} or uses.torch_tpu):
        needed.add("torch_tpu")  # registers the 'tpu' device, torch.tpu and "tpu_dist"
    for helper in ctx.helpers_needed:  # inserted after this, so not counted above
        needed.update(helpers.IMPORTS_OF[helper])
    if not needed and not ctx.side_effect_imports:
        return module
    if ctx.library_code:
        return _library_imports(module, ctx, needed)
    if ctx.package_module and ctx.target == "xla" and not ctx.side_effect_imports \
            and not ctx.helpers_needed:
        local = _import_in_functions(module, needed, ctx)
        if local is not None:
            return local
    context = CodemodContext()
    for alias in sorted(needed):
        mod, asname = IMPORTS[alias]
        AddImportsVisitor.add_needed_import(context, mod, asname=asname)
    for mod in sorted(ctx.side_effect_imports):
        AddImportsVisitor.add_needed_import(context, mod)
    return AddImportsVisitor(context).transform_module(module)


def _confine(original: cst.Module, ported: cst.Module, ctx: MigrationContext) -> cst.Module:
    """Library mode: every change of the port under the runtime's test (library_mode.py); the
    rewrites in definition headers, kept as written, are reported as not applied."""
    ours = set(IMPORTS) - {"torch"} - library_mode.top_level_imports(original)
    confined, confinement = library_mode.confine(
        original, ported, ctx.target, lambda expr: bool(library_mode.names_used(expr) & ours))
    kept = {id(node) for part in confinement.kept_headers for node in walk(part)}
    rebound = {id(node) for part in confinement.rebound for node in walk(part)}
    for report in ctx.reports:
        if report.applied and id(report.node) in rebound:
            report.message += engine_say("migrate", "library_default", ctx.target)
        elif report.applied and id(report.node) in kept:
            report.applied = False
            report.message += engine_say("migrate", "library_header", ctx.target)
    if confinement.used:
        ctx.helpers_needed.add(library_mode.TESTS[ctx.target][0])
    return confined


def _library_imports(module: cst.Module, ctx: MigrationContext, needed: set[str]) -> cst.Module:
    """Library mode: what the port imports of the TPU runtime, inside the confined branches
    that use it (importing the library never imports it); torch at the top."""
    bound = library_mode.top_level_imports(ctx.module)
    statements = {}
    for alias, (mod, asname) in IMPORTS.items():
        if alias != "torch" and alias not in bound:
            statements[alias] = f"import {mod} as {asname}" if asname else f"import {mod}"
    module = module.visit(library_mode.BranchImports(
        ctx.target, statements, sorted(ctx.side_effect_imports), ctx.device_type))
    if "torch" in needed and "torch" not in bound:
        context = CodemodContext()
        AddImportsVisitor.add_needed_import(context, "torch")
        module = AddImportsVisitor(context).transform_module(module)
    return module


def _library_helper_imports(module: cst.Module, ctx: MigrationContext) -> cst.Module:
    """Library mode: the inserted helpers import the TPU runtime inside their functions."""
    wanted = set(IMPORTS) - {"torch"} - library_mode.top_level_imports(ctx.module)
    at = [i for i, s in enumerate(module.body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))
          and s.name.value in ctx.helpers_needed]
    if not at:
        return module
    alone = cst.Module(body=[module.body[i] for i in at])
    finder = _FunctionUses(wanted)
    alone.visit(finder)
    alone = alone.visit(_AddLocalImports(finder.uses))
    body = list(module.body)
    for i, stmt in zip(at, alone.body):
        body[i] = stmt
    return module.with_changes(body=body)


def _import_in_functions(module: cst.Module, needed: set[str],
                         ctx: MigrationContext) -> cst.Module | None:
    """A package module whose rewritten code uses torch_xla only in function bodies imports it
    there, so that importing the module neither imports torch_xla nor needs it installed;
    None when some use runs at import time (then the imports go at the top, as for scripts)."""
    wanted = {a for a in needed if ctx.aliases.get(IMPORTS[a][1] or IMPORTS[a][0]) is None}
    if not wanted:
        return module
    if "torch" in wanted:
        return None
    before = _FunctionUses(wanted)
    ctx.module.visit(before)  # the code as written: its own "xla" strings asked nothing
    finder = _FunctionUses(wanted, before.strings)
    module.visit(finder)
    if finder.at_import or not finder.uses:
        return None
    return module.visit(_AddLocalImports(finder.uses))


class _FunctionUses(cst.CSTVisitor):
    """Which outermost functions (module-level defs and methods of module-level classes) use
    which of `aliases` (a "xla" string counts as torch_xla), and whether anything outside
    them (import-time code: top level, class bodies, defaults, decorators) does. `written`:
    the "xla" strings each function had before the port (by `strings`' keys): as many or fewer
    after it are the code's own (accelerate's `_prepare_backend` sets `backend = "xla"` where
    torch_xla is importable), not a use of ours."""

    def __init__(self, aliases: set[str], written: dict[str, int] | None = None) -> None:
        self.aliases = aliases
        self.written = written or {}
        self.uses: dict[int, set[str]] = {}  # id(outermost FunctionDef) -> aliases
        self.strings: dict[str, int] = {}  # "class.function" -> its "xla" device strings
        self._class: list[str] = []
        self.at_import = False
        self.outer: cst.FunctionDef | None = None
        self.in_body = False
        self.comparisons = 0  # inside `... == "xla"`: a string compared needs no torch_xla

    def visit_Comparison(self, node: cst.Comparison) -> None:
        self.comparisons += 1

    def leave_Comparison(self, node: cst.Comparison) -> None:
        self.comparisons -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._class.append(node.name.value)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._class.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if self.outer is not None:
            return True
        self.outer = node
        for part in (*node.decorators, node.params, node.returns):
            if part is not None:
                part.visit(self)  # evaluated where the def is: import time
        self.in_body = True
        key = ".".join((*self._class, node.name.value))
        self._strings = 0
        node.body.visit(self)
        self.strings[key] = self.strings.get(key, 0) + self._strings
        if self._strings > self.written.get(key, 0):  # more than it had: a string of ours
            self._use("torch_xla")
        self.in_body, self.outer = False, None
        return False

    def visit_Import(self, node) -> bool:
        return False

    def visit_ImportFrom(self, node) -> bool:
        return False

    def _use(self, alias: str) -> None:
        if alias not in self.aliases:
            return
        if self.outer is None or not self.in_body or not isinstance(self.outer.body, cst.IndentedBlock):
            self.at_import = True
        else:
            self.uses.setdefault(id(self.outer), set()).add(alias)

    def visit_Name(self, node: cst.Name) -> None:
        self._use(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # `x.xm` is not a use of xm
        return False

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        # fairscale's ShardedGradScaler: `t.device.type == "xla"` was there before any port
        if "xla" in node.value and string_value(node) in _NameUses.DEVICE_STRINGS \
                and not self.comparisons:
            if self.outer is not None and self.in_body:
                self._strings += 1  # counted against what the function had (visit_FunctionDef)
            else:
                self._use("torch_xla")


class _AddLocalImports(cst.CSTTransformer):
    def __init__(self, uses: dict[int, set[str]]) -> None:
        self.uses = uses

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        aliases = self.uses.get(id(original))
        if not aliases:
            return updated
        lines = []
        for alias in sorted(aliases):
            mod, asname = IMPORTS[alias]
            lines.append(cst.parse_statement(
                f"import {mod} as {asname}\n" if asname else f"import {mod}\n"))
        body = list(updated.body.body)
        first = 1 if body and is_docstring(body[0]) else 0
        if first < len(body) and lines:
            lines[0] = lines[0].with_changes(leading_lines=body[first].leading_lines)
            body[first] = body[first].with_changes(leading_lines=())
        body[first:first] = lines
        return updated.with_changes(body=updated.body.with_changes(body=body))


class _NameUses(cst.CSTVisitor):
    """Counts uses of names and of dotted prefixes outside import statements."""

    DEVICE_STRINGS = frozenset({"xla", "tpu", "tpu_dist"})

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.dotted: dict[str, int] = {}
        self.device_strings: set[str] = set()  # "xla", "tpu", "tpu_dist" literals
        self.torch_tpu = False  # some `torch.tpu.*` or `torch.accelerator.*` (`th.` too) is used

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if len(node.value) <= 13 and ("xla" in node.value or "tpu" in node.value):
            value = node.evaluated_value
            if value in self.DEVICE_STRINGS:
                self.device_strings.add(value)

    def visit_Import(self, node) -> bool:
        return False

    def visit_ImportFrom(self, node) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.names[node.value] = self.names.get(node.value, 0) + 1

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        path = dotted(node)
        if path:
            self.dotted[path] = self.dotted.get(path, 0) + 1
            self.torch_tpu = self.torch_tpu or path.split(".")[1:2] in (["tpu"], ["accelerator"])
        node.value.visit(self)  # `x.autocast`: the attribute name is not a use of `autocast`
        return False


def _orphanable(full: str) -> bool:
    return any(full == p or full.startswith(p + ".") for p in _ORPHANABLE)


def _root_bindings(module: cst.Module) -> dict[str, int]:
    """How many `import` aliases bind each top name (`import torch`, `import torch.cuda`: 2 for
    `torch`), anywhere in the module."""
    counts: dict[str, int] = {}
    for node in walk(module):
        if isinstance(node, cst.Import):
            for alias in node.names:
                if alias.asname is None:
                    root = (dotted(alias.name) or "").split(".")[0]
                    counts[root] = counts.get(root, 0) + 1
    return counts


class _RemoveUnused(cst.CSTTransformer):
    def __init__(self, uses: _NameUses, roots: dict[str, int]) -> None:
        super().__init__()
        self.uses = uses
        self.roots = roots  # bindings of each top name by `import a.b` aliases still there

    def _unused(self, bound: str, full: str, dotted_import: bool) -> bool:
        if not _orphanable(full):
            return False
        if dotted_import:  # `import torch.cuda`: binds `torch`; unused when no torch.cuda.* is left
            return not any(k == full or k.startswith(full + ".") for k in self.uses.dotted)
        return self.uses.names.get(bound, 0) == 0

    def leave_Import(self, original, updated):
        kept = []
        for alias in updated.names:
            full = dotted(alias.name) or ""
            asname = alias.asname.name.value if alias.asname else None
            is_dotted = asname is None and "." in full
            if not self._unused(asname or full, full, is_dotted):
                kept.append(alias)
                continue
            root = full.split(".")[0]
            if is_dotted and self.uses.names.get(root, 0) and self.roots.get(root, 0) <= 1:
                # ultralytics' `import torch.cuda`, its only `import` of torch, whose
                # `torch.device` is still used: it stays an import of torch
                kept.append(alias.with_changes(name=cst.Name(root)))
                continue
            if is_dotted:
                self.roots[root] = self.roots.get(root, 0) - 1
        return _rebuild_import(updated, kept)

    def leave_ImportFrom(self, original, updated):
        if updated.relative or isinstance(updated.names, cst.ImportStar) or updated.module is None:
            return updated
        module = dotted(updated.module) or ""
        kept = []
        for alias in updated.names:
            name = dotted(alias.name) or ""
            bound = alias.asname.name.value if alias.asname else name
            if not self._unused(bound, f"{module}.{name}", False):
                kept.append(alias)
        return _rebuild_import(updated, kept)


def _rebuild_import(node, kept):
    if len(kept) == len(node.names) and all(a is b for a, b in zip(kept, node.names)):
        return node
    if not kept:
        return cst.RemoveFromParent()
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return node.with_changes(names=kept)


