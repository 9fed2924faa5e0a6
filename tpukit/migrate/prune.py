"""Which statements can hold a match at all: the rest is not traversed.

libcst's traversal rebuilds every node it passes, which costs far more than parsing. Most of
a large file has nothing to migrate, so the statements of a module, class or function body
whose source lines contain none of the selected rules' trigger words are skipped, found by
walking Python's (C-speed) `ast` of the same source in step with the libcst body.
"""

from __future__ import annotations

import ast
import re

import libcst as cst


_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n#;]*)", re.M)


def bound_names(source: str, triggers: tuple[str, ...]) -> set[str]:
    """Names that imports bind to something a trigger names: `from torch.utils.cpp_extension
    import load` makes `load` a trigger, or a statement `ops = load(...)` would be skipped."""
    names: set[str] = set()
    # a call's trigger (`FullyShardedDataParallel(`) names the import of it
    words = tuple({t.rstrip("(") for t in triggers if t.rstrip("(")})

    def matches(text: str) -> bool:
        return any(t in text for t in words)

    for module, imported in _FROM_IMPORT.findall(source):
        for item in imported.strip("()").replace("\\", " ").split(","):
            parts = item.split()
            if not parts:
                continue
            if matches(module) or matches(parts[0]):
                names.add(parts[-1])
    for imported in _IMPORT.findall(source):
        for item in imported.split(","):
            parts = item.split()
            if len(parts) == 3 and parts[1] == "as" and matches(parts[0]):
                names.add(parts[2])
    return names


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", None) or []
    return min([node.lineno, *(d.lineno for d in decorators)])


def _holds_import(stmt: cst.CSTNode) -> bool:
    """A simple statement line with an import among its statements."""
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
    )


class Layout:
    """Statement lines from `ast`, keyed by the libcst statement they belong to."""

    def __init__(self, module: cst.Module, source: str, triggers: tuple[str, ...]) -> None:
        self.skip: set[int] = set()  # id() of statements with no trigger in their lines
        self.first_line: dict[int, int] = {}  # id() of top-level statement -> line of its code
        self._lines = source.splitlines(keepends=True)
        self._triggers = tuple(sorted({*triggers, *bound_names(source, triggers)}))
        try:
            tree = ast.parse(source)
            self._walk(module.body, tree.body, top=True)
        except (SyntaxError, ValueError, StopIteration, RecursionError):
            # Syntax this interpreter cannot read, or bodies that do not line up: no pruning.
            self.skip.clear()
            self.first_line.clear()

    def _walk(self, cst_body, ast_body, top: bool) -> None:
        statements = iter(ast_body)
        for stmt in cst_body:
            count = len(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else 1
            group = [next(statements) for _ in range(count)]
            first = min(_first_line(s) for s in group)
            last = max(s.end_lineno or s.lineno for s in group)
            if top:
                self.first_line[id(stmt)] = first - len(stmt.leading_lines)
            text = "".join(self._lines[first - 1 : last])
            if not any(trigger in text for trigger in self._triggers):
                # Imports feed name resolution, so never skip them: bare, or inside a
                # try/if block (`try: import torch`). A def's local imports stay local.
                defines = isinstance(stmt, (cst.FunctionDef, cst.ClassDef))
                if not _holds_import(stmt) and (defines or "import" not in text):
                    self.skip.add(id(stmt))
            elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and isinstance(
                stmt.body, cst.IndentedBlock
            ):
                self._walk(stmt.body.body, group[0].body, top=False)
        if next(statements, None) is not None:
            raise StopIteration
