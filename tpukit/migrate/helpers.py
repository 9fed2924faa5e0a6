"""Small functions a rewrite may need in the user's file, inserted once after the imports.

They exist where no torch_xla expression is both correct and crash-free, e.g. memory
statistics: `xm.get_memory_info` raises UNIMPLEMENTED on XLA:CPU.
"""

from __future__ import annotations

import libcst as cst

SOURCES: dict[str, str] = {
    "_xla_memory_stat": '''
def _xla_memory_stat(key):
    """torch.cuda memory statistics on XLA (inserted by tpukit); 0 where the runtime
    cannot report them (XLA:CPU raises UNIMPLEMENTED)."""
    try:
        return xm.get_memory_info(torch_xla.device())[key]
    except RuntimeError:
        return 0
''',
}
IMPORTS_OF: dict[str, tuple[str, ...]] = {"_xla_memory_stat": ("xm", "torch_xla")}


def _defined(module: cst.Module) -> set[str]:
    return {s.name.value for s in module.body if isinstance(s, cst.FunctionDef)}


def _is_import_line(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
    )


def insert(module: cst.Module, names: set[str]) -> cst.Module:
    missing = sorted(names - _defined(module))
    if not missing:
        return module
    body = list(module.body)
    # After the last import of the file's opening block of imports (and docstring).
    position = 0
    for i, stmt in enumerate(body):
        if _is_import_line(stmt):
            position = i + 1
        elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            break
    new = []
    for name in missing:
        func = cst.parse_statement(SOURCES[name].strip() + "\n")
        new.append(func.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]))
    if position < len(body):
        following = body[position]
        if not following.leading_lines:
            body[position] = following.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    body[position:position] = new
    return module.with_changes(body=body)
