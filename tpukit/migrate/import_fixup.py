"""The imports of a file that changed, put right after the rewrite: the imports rules asked
for added (libcst's AddImportsVisitor; in library mode inside the functions that use them),
and the imports the rewrite left unused (`torch.cuda`, cuDNN flags, the accelerator API)
removed. Everything else in the file stays byte-identical."""

from __future__ import annotations

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from tpukit.migrate import helpers, library_mode
from tpukit.migrate.context import IMPORTS, MigrationContext, dotted, string_value
from tpukit.migrate.nodes import is_docstring, scan, walk
from tpukit.rules import engine_say


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


# -- imports ----------------------------------------------------------------------------
def fix_imports(module: cst.Module, ctx: MigrationContext) -> cst.Module:
    wanted = set(ctx.imports_needed)
    uses = _NameUses()
    scan(module, uses)
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


def confine(original: cst.Module, ported: cst.Module, ctx: MigrationContext) -> cst.Module:
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


def library_helper_imports(module: cst.Module, ctx: MigrationContext) -> cst.Module:
    """Library mode: the inserted helpers import the TPU runtime inside their functions."""
    wanted = set(IMPORTS) - {"torch"} - library_mode.top_level_imports(ctx.module)
    at = [i for i, s in enumerate(module.body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))
          and s.name.value in ctx.helpers_needed]
    if not at:
        return module
    alone = cst.Module(body=[module.body[i] for i in at])
    finder = _FunctionUses(wanted)
    scan(alone, finder)
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
    scan(ctx.module, before)  # the code as written: its own "xla" strings asked nothing
    finder = _FunctionUses(wanted, before.strings)
    scan(module, finder)
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
                scan(part, self)  # evaluated where the def is: import time
        self.in_body = True
        key = ".".join((*self._class, node.name.value))
        self._strings = 0
        scan(node.body, self)
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
        scan(node.value, self)  # `x.xm` is not a use of xm
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
        scan(node.value, self)  # `x.autocast`: the attribute name is not a use of `autocast`
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
