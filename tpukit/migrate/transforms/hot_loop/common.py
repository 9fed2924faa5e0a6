"""What TPU512 (sums) and TPU513 (meters) share: a number read back from the device, the
counts it is multiplied by, the loop that must end a graph at each iteration, and the deferred
read that replaces it (helpers.py's `_xla_deferred`, `_xla_value`)."""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis.bindings import Assigned
from tpukit.migrate.analysis.steps import find_steps, loader_in_iter
from tpukit.migrate.nodes import ancestors

DEFERRED, VALUE = "_xla_deferred", "_xla_value"  # helpers.py
_SUMS = (cst.AddAssign, cst.SubtractAssign)
_UPDATES = (cst.AddAssign, cst.SubtractAssign, cst.MultiplyAssign, cst.DivideAssign,
            cst.FloorDivideAssign)
_ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)
_COUNTS = ("size", "numel", "dim")  # tensor methods that return an int
_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.ListComp, cst.SetComp, cst.DictComp,
           cst.GeneratorExp)


def _number(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        expr = expr.expression
    return isinstance(expr, (cst.Integer, cst.Float))


def read_call(values, node: cst.CSTNode) -> bool:
    """`t.item()`, `float(t)`, `int(t)`: a number read back (`float`, `int` the builtins)."""
    if not isinstance(node, cst.Call):
        return False
    if isinstance(node.func, cst.Attribute):
        return node.func.attr.value == "item" and not node.args
    return (isinstance(node.func, cst.Name) and node.func.value in ("float", "int")
            and not values.bindings(node.func) and len(node.args) == 1
            and node.args[0].keyword is None and not node.args[0].star
            and not _number(node.args[0].value)
            and not isinstance(node.args[0].value, cst.SimpleString))


def counted(values, expr: cst.BaseExpression, depth: int = 0) -> bool:
    """A number the code counts: a literal, `len(...)`, `x.size(...)`, `x.numel()`,
    `x.shape[i]`, or a local bound only to such."""
    if _number(expr):
        return True
    if isinstance(expr, cst.Call):
        func = expr.func
        return (isinstance(func, cst.Name) and func.value == "len"
                and not values.bindings(func)) or (
            isinstance(func, cst.Attribute) and func.attr.value in _COUNTS)
    if isinstance(expr, cst.Subscript):
        return isinstance(expr.value, cst.Attribute) and expr.value.attr.value == "shape"
    if isinstance(expr, cst.Name) and depth < 3:
        bindings = values.bindings(expr)
        return bool(bindings) and all(isinstance(b, Assigned) and not b.path
                                      and counted(values, b.value, depth + 1) for b in bindings)
    return False


def reads_in(values, expr: cst.BaseExpression) -> list[cst.Call] | None:
    """The reads an added value is made of (`loss.item() * data.size(0)`), or None when
    something else is in it."""
    if read_call(values, expr):
        return [expr]
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        return reads_in(values, expr.expression)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, _ARITHMETIC):
        sides = [reads_in(values, s) if not counted(values, s) else [] for s in
                 (expr.left, expr.right)]
        if None in sides:
            return None
        return sides[0] + sides[1]
    return None


def ends_graph(ctx, loop) -> bool:
    """Each iteration of `loop` ends a graph once ported: a loader (MpDeviceLoader cuts at
    every batch), an optimizer step (a barrier follows it) or a barrier."""
    if isinstance(loop, cst.For) and loader_in_iter(ctx, loop):
        return True
    steps = find_steps(ctx, loop)
    return bool(steps.step_lines) or steps.has_barrier


def enclosing_loop(node, parents, function):
    return next((n for n in ancestors(node, parents, function)
                 if isinstance(n, (cst.For, cst.While))), None)


def under_if(node, parents, loop) -> bool:
    """Inside the body (not the test) of an `if` that is inside `loop`: not run at every
    iteration (a logging interval)."""
    child = node
    current = parents.get(id(node))
    while current is not None and current is not loop:
        if isinstance(current, (cst.If, cst.Else)) and child is not getattr(current, "test", None):
            return True
        child, current = current, parents.get(id(current))
    return False


def deferred_read(original: cst.Call, updated: cst.Call) -> cst.Call:
    """`_xla_deferred(t)` for `t.item()`, `_xla_deferred(t, float)` for `float(t)`."""
    if isinstance(original.func, cst.Attribute):
        return cst.Call(func=cst.Name(DEFERRED), args=[cst.Arg(updated.func.value)])
    return cst.Call(func=cst.Name(DEFERRED), args=[
        updated.args[0].with_changes(comma=cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))),
        cst.Arg(cst.Name(original.func.value))])


def deferred_fix(rule, original: cst.Call, updated: cst.Call, message: str):
    """Report the read `original` with `message`; where `rule` may fix it, its deferred form
    (`deferred_read`), the helpers and torch's import asked for."""
    new = deferred_read(original, updated)

    def build():
        rule.ctx.helpers_needed.update({DEFERRED, VALUE})
        rule.ctx.need_import("torch")
        return new

    return rule.fix_or_report(original, message, build)
