"""Names bound to host values (NumPy arrays, Python lists, numbers): a rewrite into a torch
tensor method (`masked_fill_`, `index_select`) must not touch them.

`mm = np.zeros_like(ids); mm[ids == k] = 1` is NumPy (transformers' processors), and
`buff = buff.cpu().numpy(); buff[a:b]` slices an array (deepspeed's data analyzer): a name
bound anywhere in the same function (or at module level) to a NumPy call or to `.numpy()`,
`.tolist()`, `.item()`, or to a helper named for NumPy (`to_numpy_array`) is not known to be
a tensor there.
"""

from __future__ import annotations

import libcst as cst

HOST_METHODS = ("numpy", "tolist", "item")


def _host_value(ctx, value: cst.BaseExpression | None) -> bool:
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Attribute) and func.attr.value in HOST_METHODS:
        return True
    name = ctx.qualify(func) or ""
    if name == "numpy" or name.startswith("numpy."):
        return True
    # a helper named for what it returns: transformers' `to_numpy_array(label)`
    own = func.attr.value if isinstance(func, cst.Attribute) else (
        func.value if isinstance(func, cst.Name) else "")
    return "numpy" in own.lower() or "ndarray" in own.lower()


class _HostNames(cst.CSTVisitor):
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.by_scope: dict[int | None, set[str]] = {}
        self._stack: list[cst.FunctionDef] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._stack.append(node)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._stack.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        if not _host_value(self.ctx, node.value):
            return
        scope = id(self._stack[-1]) if self._stack else None
        for target in node.targets:
            if isinstance(target.target, cst.Name):
                self.by_scope.setdefault(scope, set()).add(target.target.value)


def host_bound(ctx, name: str) -> bool:
    """Whether `name` is bound to a host value in the innermost enclosing function or at
    module level (computed once per file)."""
    def compute():
        if "numpy" not in ctx.source and "np." not in ctx.source and not any(
                f".{m}()" in ctx.source for m in HOST_METHODS):
            return {}
        visitor = _HostNames(ctx)
        ctx.module.visit(visitor)
        return visitor.by_scope

    scopes = ctx.memo("host_bound_names", compute)
    function = next((f for f in reversed(ctx.functions) if isinstance(f, cst.FunctionDef)), None)
    return name in scopes.get(id(function) if function is not None else None, ()) or \
        name in scopes.get(None, ())
