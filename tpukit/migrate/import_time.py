"""Which of a module's functions run when it is imported.

A package module's top level runs at import, and so does every function it calls there
(accelerate's `torch_device, device_count, _ = get_backend()`) or applies as a decorator,
and what those call in turn. The XLA runtime must not start in any of them: a later
`torch_xla.launch` / `xmp.spawn` in the importing program would then fail. A script's
`if __name__ == "__main__":` block is its program, not its import.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.nodes import scan
from tpukit.rules import engine_say


def import_time_functions(module: cst.Module) -> dict[str, str]:
    """Module-level function name -> why it runs at import (the line that calls it)."""
    defs = {stmt.name.value: stmt for stmt in module.body if isinstance(stmt, cst.FunctionDef)}
    if not defs:
        return {}
    calls = _Calls(set(defs))
    for stmt in module.body:
        if _is_main_guard(stmt):
            continue
        if isinstance(stmt, cst.FunctionDef):
            for part in (*stmt.decorators, stmt.params):  # evaluated where the def is
                scan(part, calls)
        else:
            scan(stmt, calls)
    found = {name: engine_say("migrate", "why_called_at_import", name=name) for name in calls.names}
    for name, node in defs.items():
        if name not in found and _applies_a_decorator(node):
            found[name] = engine_say("migrate", "why_decorator_at_import", name=name)
    todo = list(found)
    while todo:  # what they call, transitively
        inner = _Calls(set(defs))
        defs[todo.pop()].body.visit(inner)
        for name in inner.names:
            if name not in found:
                found[name] = engine_say("migrate", "why_caller_at_import", name=name)
                todo.append(name)
    return found


def _applies_a_decorator(node: cst.FunctionDef) -> bool:
    """`def require_multi_gpu(test_case): return unittest.skipUnless(...)(test_case)`: a
    function that hands its one argument to a decorator it builds, and returns the result."""
    params = node.params.params
    if len(params) != 1 or not isinstance(node.body, cst.IndentedBlock):
        return False
    last = node.body.body[-1] if node.body.body else None
    ret = last.body[0] if isinstance(last, cst.SimpleStatementLine) and last.body else None
    value = ret.value if isinstance(ret, cst.Return) else None
    return (isinstance(value, cst.Call) and isinstance(value.func, cst.Call)
            and len(value.args) == 1 and isinstance(value.args[0].value, cst.Name)
            and value.args[0].value.value == params[0].name.value)


def _is_main_guard(stmt: cst.CSTNode) -> bool:
    if not isinstance(stmt, cst.If) or not isinstance(stmt.test, cst.Comparison):
        return False
    sides = [stmt.test.left, *(c.comparator for c in stmt.test.comparisons)]
    return any(isinstance(s, cst.Name) and s.value == "__name__" for s in sides)


class _Calls(cst.CSTVisitor):
    """Names of `defs` called (or applied as decorators), outside nested function bodies."""

    def __init__(self, defs: set[str]) -> None:
        self.defs = defs
        self.names: list[str] = []

    def _add(self, expr: cst.BaseExpression) -> None:
        if isinstance(expr, cst.Name) and expr.value in self.defs and expr.value not in self.names:
            self.names.append(expr.value)

    def visit_Call(self, node: cst.Call) -> None:
        self._add(node.func)

    def visit_Decorator(self, node: cst.Decorator) -> None:
        self._add(node.decorator)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        for part in (*node.decorators, node.params):
            scan(part, self)
        return False  # a nested def's body runs when it is called

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False
