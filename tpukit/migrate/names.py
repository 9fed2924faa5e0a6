"""Name resolution from the file's own imports: which module a name stands for.

Names are resolved from the file's import statements, in source order, instead of libcst's
QualifiedNameProvider: scope analysis costs ~6x the parse on large trees, and import-based
resolution already makes `import torch as th`, `from torch import cuda` and
`from torch.cuda.amp import autocast as ac` resolve, while a local `cuda` does not.

A module-level statement that binds an imported name otherwise (`cuda = FakeCuda()`, a
`def cuda():`) ends the import's meaning for the code after it: found by a pre-pass over the
module's own statements (not its blocks: `try: import x` / `except: x = None` keeps `x`).
"""

from __future__ import annotations

import re

import libcst as cst

from tpukit.migrate.nodes import dotted, import_target, scan

# The words after an `import` keyword (a superset of the names imports bind): a rebinding
# of any other name cannot end an import, so it is not tracked.
_IMPORTED = re.compile(r"\bimport\b[ \t]*(\([^)]*\)|[^\n;#]*)")
_WORD = re.compile(r"\w+")


def _bound(target: cst.BaseExpression, into: set[str]) -> None:
    if isinstance(target, cst.Name):
        into.add(target.value)
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            _bound(element.value, into)
    elif isinstance(target, cst.StarredElement):
        _bound(target.value, into)


def rebinding(stmt: cst.CSTNode) -> set[str]:
    """The names a module-level statement binds other than by importing them."""
    names: set[str] = set()
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        names.add(stmt.name.value)
    elif isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    _bound(target.target, names)
            elif isinstance(small, (cst.AnnAssign, cst.AugAssign)) and (
                    not isinstance(small, cst.AnnAssign) or small.value is not None):
                _bound(small.target, names)
    return names


class ModuleRebindings:
    """Module-level rebindings in statement order; `reached(stmt)` forgets the imports that
    the statements before `stmt` rebound."""

    def __init__(self, module: cst.Module, source: str) -> None:
        imported = {w for text in _IMPORTED.findall(source) for w in _WORD.findall(text)}
        self.pending = [(i, names) for i, stmt in enumerate(module.body)
                        if (names := rebinding(stmt) & imported)]
        self.index = {id(stmt): i for i, stmt in enumerate(module.body)} if self.pending else {}
        self.next = 0  # the first entry of `pending` not applied yet

    def reached(self, stmt: cst.CSTNode, aliases: dict[str, str]) -> None:
        if self.next >= len(self.pending):
            return
        at = self.index.get(id(stmt))
        if at is None:
            return
        while self.next < len(self.pending) and self.pending[self.next][0] < at:
            for name in self.pending[self.next][1]:
                aliases.pop(name, None)
            self.next += 1


class _LocalNames(cst.CSTVisitor):
    """Names a function binds itself (parameters and assignment targets), not imports."""

    def __init__(self, function: cst.FunctionDef | cst.Lambda) -> None:
        self.function = function
        self.names: set[str] = set()

    def visit_FunctionDef(self, node) -> bool:
        return node is self.function

    def visit_Lambda(self, node) -> bool:
        return node is self.function

    def visit_ClassDef(self, node) -> bool:
        return False

    def visit_Import(self, node) -> bool:
        return False

    def visit_ImportFrom(self, node) -> bool:
        return False

    def visit_Param(self, node: cst.Param) -> None:
        self.names.add(node.name.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        _bound(node.target, self.names)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        _bound(node.target, self.names)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        _bound(node.target, self.names)

    def visit_For(self, node: cst.For) -> None:
        _bound(node.target, self.names)

    def visit_AsName(self, node: cst.AsName) -> None:
        _bound(node.name, self.names)


class Names:
    """What each name of one file stands for, as the traversal goes: the imports seen so
    far (alias -> qualified name), the enclosing functions (whose locals shadow an import),
    and the module-level rebindings passed."""

    def __init__(self, module: cst.Module, source: str) -> None:
        self.aliases: dict[str, str] = {}
        self.functions: list[cst.FunctionDef | cst.Lambda] = []  # enclosing functions
        self.rebindings = ModuleRebindings(module, source)
        self._locals: dict[int, set[str]] = {}  # id(function) -> names it binds

    def add_import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = import_target(alias.name)
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.aliases[alias.asname.name.value] = full
            else:
                root = full.split(".")[0]
                self.aliases[root] = root

    def add_import_from(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = import_target(node.module)
        for alias in node.names:
            name = import_target(alias.name)
            bound = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                bound = alias.asname.name.value
            self.aliases[bound] = f"{module}.{name}"

    def reached(self, stmt: cst.CSTNode) -> None:
        """The traversal is at `stmt`: imports rebound by module-level statements before it
        name something else now."""
        if self.rebindings.pending:
            self.rebindings.reached(stmt, self.aliases)

    def resolve(self, expr: cst.BaseExpression | None) -> str | None:
        """The qualified name of a Name/Attribute chain through the imports seen so far,
        wherever it is (no function's locals are looked at): for whole-file scans."""
        parts = self._aliased(expr)
        if parts is None:
            return None
        _, full, rest = parts
        return f"{full}.{rest}" if rest else full

    def _aliased(self, expr: cst.BaseExpression | None) -> tuple[str, str, str] | None:
        """(root name, the import it names, the rest of the chain) of a Name/Attribute chain
        whose root an import bound; None otherwise."""
        path = dotted(expr)
        if path is None:
            return None
        root, _, rest = path.partition(".")
        full = self.aliases.get(root)
        return None if full is None else (root, full, rest)

    def qualify(self, expr: cst.BaseExpression | None) -> str | None:
        """The qualified name of a Name/Attribute chain, through this file's imports."""
        parts = self._aliased(expr)
        if parts is None:
            return None
        root, full, rest = parts
        # `from torch import cuda` and a function's own `cuda` (a parameter, a local): the
        # local wins. Only aliases that differ from their module (`cuda`, `th`) are checked:
        # nobody rebinds `torch` itself, and checking costs a scan of the function.
        if full != root and any(root in self.local_names(f) for f in self.functions):
            return None
        return f"{full}.{rest}" if rest else full

    def local_names(self, function: cst.FunctionDef | cst.Lambda) -> set[str]:
        names = self._locals.get(id(function))
        if names is None:
            visitor = _LocalNames(function)
            scan(function, visitor)
            names = self._locals[id(function)] = visitor.names
        return names

    def torch_alias(self) -> str | None:
        """The name this file binds torch to (`torch`, `th`), if it imports it."""
        for name, full in self.aliases.items():
            if full == "torch":
                return name
        return None
