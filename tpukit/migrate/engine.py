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
from tpukit.findings import Finding, Location
from tpukit.migrate import helpers, library_mode
from tpukit.migrate.context import MigrationContext
from tpukit.migrate.import_fixup import confine, fix_imports, library_helper_imports
from tpukit.migrate.nodes import walk
from tpukit.migrate.ownership import Owner
from tpukit.migrate.prune import Layout
from tpukit.migrate.rewriter import MigrationBug, Rewriter
from tpukit.migrate.suppressing import SuppressedHooks
from tpukit.migrate.transforms import load_transforms
from tpukit.migrate.transforms.base import HookTable, transform_for
from tpukit.rules import Rule, engine_say
from tpukit.suppress import Suppressions, split, unused_findings


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
        new_module = confine(module, new_module, ctx)
    positions = trial.positions if trial is not None else _positions(module, layout, ctx.reports)
    findings = _findings(ctx, ctx.reports, positions, path)
    changed = any(r.applied for r in ctx.reports)
    if not changed:
        return _silenced(Migration(source, source, findings), silenced, suppressions, path,
                         options)
    if not options.render_source:
        return _silenced(Migration(source, source, findings, changed=True), silenced,
                         suppressions, path, options)
    new_module = fix_imports(new_module, ctx)
    new_module = helpers.insert(new_module, ctx.helpers_needed)
    if ctx.library_code:
        new_module = library_helper_imports(new_module, ctx)
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
