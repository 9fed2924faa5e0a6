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
