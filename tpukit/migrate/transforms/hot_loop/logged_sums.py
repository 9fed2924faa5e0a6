"""A number read back from the device every step only to be summed for the logs, summed on
the device instead (TPU512).

`total_loss += loss.item()` in a training or evaluation loop (word_language_model, MNIST's
test pass, the VAE) makes the host wait for the device at every step and splits the step's
graph there, though the sum is read only every `log_interval` steps or after the loop. Left on
the device (`_xla_deferred(loss)`), the sum runs in the step's graph, and each place the code
uses the sum reads it back (`_xla_value(total_loss)`): once per logging interval.

Decided by dataflow over the function: the variable is a local bound only to number literals
(its resets) and to sums of reads (`+=`, `-=`, each read reached through arithmetic with
numbers the code counts: literals, `len()`, `.size()`, `.numel()`, `.shape[i]`), plus
arithmetic updates (`test_loss /= len(dataset)`); the loop that sums ends a graph at every
iteration (a loader, an optimizer step or a barrier: otherwise the sums would be traced into one
graph); and every read of it inside that loop is under an `if` (the logging interval), not
once per iteration. Every read of the variable becomes `_xla_value(...)`, a Python number as
before; the sum is float32 on the device where the host summed in float64 (the logs' last
digits may differ; the training does not).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from tpukit.migrate.analysis.bindings import Assigned
from tpukit.migrate.analysis.steps import find_steps, loader_in_iter
from tpukit.migrate.nodes import ancestors, parent_map, walk
from tpukit.migrate.transforms.base import Transform, transform

DEFERRED, VALUE = "_xla_deferred", "_xla_value"  # helpers.py
_SUMS = (cst.AddAssign, cst.SubtractAssign)
_UPDATES = (cst.AddAssign, cst.SubtractAssign, cst.MultiplyAssign, cst.DivideAssign,
            cst.FloorDivideAssign)
_ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)
_COUNTS = ("size", "numel", "dim")  # tensor methods that return an int
_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.ListComp, cst.SetComp, cst.DictComp,
           cst.GeneratorExp)


@dataclass
class _Plan:
    reads: dict[int, tuple[cst.Call, cst.AugAssign]] = field(default_factory=dict)
    loads: set[int] = field(default_factory=set)  # id() of Name reads of a sum: wrapped



def _number(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        expr = expr.expression
    return isinstance(expr, (cst.Integer, cst.Float))


@transform("TPU512")
class LoggedSums(Transform):
    uses = frozenset({"bindings", "steps", "values"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.plans: dict[int, _Plan] = {}

    def statement_triggers(self, source: str) -> set[str]:
        # every read of a sum is rewritten, wherever it is: the names summed with `+=`
        words = super().statement_triggers(source)
        for line in source.splitlines():
            left, sep, right = line.partition("+=")
            if sep and ("item()" in right or "float(" in right or "int(" in right):
                words.add(left.strip())
        return {w for w in words if w}

    # -- the analysis, once per function --------------------------------------------------
    def _plan(self) -> _Plan | None:
        return self.per_function(self.plans, self._analyse)

    def _read(self, node: cst.CSTNode) -> bool:
        """`t.item()`, `float(t)`, `int(t)`: a number read back."""
        if not isinstance(node, cst.Call):
            return False
        if isinstance(node.func, cst.Attribute):
            return node.func.attr.value == "item" and not node.args
        return (isinstance(node.func, cst.Name) and node.func.value in ("float", "int")
                and not self.ctx.values.bindings(node.func) and len(node.args) == 1
                and node.args[0].keyword is None and not node.args[0].star
                and not _number(node.args[0].value)
                and not isinstance(node.args[0].value, cst.SimpleString))

    def _count(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        """A number the code counts: a literal, `len(...)`, `x.size(...)`, `x.numel()`,
        `x.shape[i]`, or a local bound only to such."""
        if _number(expr):
            return True
        if isinstance(expr, cst.Call):
            func = expr.func
            return (isinstance(func, cst.Name) and func.value == "len"
                    and not self.ctx.values.bindings(func)) or (
                isinstance(func, cst.Attribute) and func.attr.value in _COUNTS)
        if isinstance(expr, cst.Subscript):
            return isinstance(expr.value, cst.Attribute) and expr.value.attr.value == "shape"
        if isinstance(expr, cst.Name) and depth < 3:
            bindings = self.ctx.values.bindings(expr)
            return bool(bindings) and all(isinstance(b, Assigned) and not b.path
                                          and self._count(b.value, depth + 1) for b in bindings)
        return False

    def _sum_of_reads(self, expr: cst.BaseExpression) -> list[cst.Call] | None:
        """The reads an added value is made of (`loss.item() * data.size(0)`), or None when
        something else is in it."""
        if self._read(expr):
            return [expr]
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            return self._sum_of_reads(expr.expression)
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, _ARITHMETIC):
            sides = [self._sum_of_reads(s) if not self._count(s) else [] for s in
                     (expr.left, expr.right)]
            if None in sides:
                return None
            return sides[0] + sides[1]
        return None

    def _analyse(self, function: cst.FunctionDef) -> _Plan:
        plan = _Plan()
        parents = parent_map(function)
        sums: dict[object, list[tuple[cst.AugAssign, list[cst.Call]]]] = {}
        for node in walk(function.body):
            if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name) \
                    and isinstance(node.operator, _SUMS):
                reads = self._sum_of_reads(node.value)
                if reads:
                    symbol = self.ctx.values.symbol(node.target)
                    sums.setdefault(symbol, []).append((node, reads))
        scope = self.ctx.values.scopes.get(id(function))
        for symbol, found in sums.items():
            if symbol is None or symbol[1] != id(scope):
                continue  # a global or a closure's: read elsewhere too
            loops = [self._loop(aug, parents, function) for aug, _ in found]
            if any(loop is None or not self._ends_graph(loop) for loop in loops):
                continue
            loads = self._loads(symbol, found, loops, parents, function)
            if loads is None:
                continue
            plan.loads.update(loads)
            for aug, reads in found:
                for read in reads:
                    plan.reads[id(read)] = (read, aug)
        return plan

    def _loop(self, node, parents, function):
        return next((n for n in ancestors(node, parents, function)
                     if isinstance(n, (cst.For, cst.While))), None)

    def _ends_graph(self, loop) -> bool:
        """Each iteration ends a graph once ported: a loader (MpDeviceLoader cuts at every
        batch), an optimizer step (a barrier follows it) or a barrier."""
        if isinstance(loop, cst.For) and loader_in_iter(self.ctx, loop):
            return True
        steps = find_steps(self.ctx, loop)
        return bool(steps.step_lines) or steps.has_barrier

    def _loads(self, symbol, found, loops, parents, function) -> set[int] | None:
        """The Name reads of the sum to wrap, or None where a use needs it as it was."""
        sums = {id(aug) for aug, _ in found}
        loads, resets = set(), 0
        for node in walk(function.body):
            if not (isinstance(node, cst.Name) and self.ctx.values.symbol(node) == symbol):
                continue
            parent = parents.get(id(node))
            if isinstance(parent, cst.Attribute) and parent.attr is node \
                    or isinstance(parent, cst.Arg) and parent.keyword is node:
                continue
            above = list(ancestors(node, parents, function))
            if any(isinstance(n, _SCOPES) for n in above):
                return None  # seen from another scope
            if isinstance(parent, cst.AssignTarget):
                assign = parents[id(parent)]
                if len(assign.targets) != 1 or not _number(assign.value):
                    return None
                resets += 1
                continue
            if isinstance(parent, cst.AugAssign) and parent.target is node:
                if id(parent) in sums or (isinstance(parent.operator, _UPDATES)
                                          and self._count(parent.value)):
                    continue
                return None
            if self._bound_here(node, parent, above):
                return None  # a for target, an unpacking, `with ... as`, `del`: bound otherwise
            if any(id(n) in sums for n in above):
                return None  # read in its own sum
            for loop in loops:
                if loop in above and not self._under_if(node, parents, loop):
                    return None  # read at every iteration: nothing is saved
            loads.add(id(node))
        return loads if resets else None

    @staticmethod
    def _bound_here(node, parent, above) -> bool:
        if isinstance(parent, (cst.Param, cst.AsName, cst.Del, cst.Global, cst.Nonlocal,
                               cst.NameItem, cst.ImportAlias, cst.CompFor)):
            return True
        if isinstance(parent, cst.NamedExpr) and parent.target is node:
            return True
        child = node
        for ancestor in above:
            if isinstance(ancestor, cst.AssignTarget) or (
                    isinstance(ancestor, (cst.For, cst.CompFor)) and ancestor.target is child):
                return True
            child = ancestor
        return False

    @staticmethod
    def _under_if(node, parents, loop) -> bool:
        """Inside the body (not the test) of an `if` that is inside `loop`."""
        child = node
        current = parents.get(id(node))
        while current is not None and current is not loop:
            if isinstance(current, (cst.If, cst.Else)) and child is not getattr(current, "test", None):
                return True
            child, current = current, parents.get(id(current))
        return False

    # -- the rewrite ------------------------------------------------------------------------
    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        plan = self._plan() if self.ctx.functions else None
        if plan is not None:  # TPU501 leaves to this rule the reads it moves off the step
            self.ctx.handled.update(i for i, (_, aug) in plan.reads.items() if aug is node)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if not self._read(original):
            return None
        plan = self._plan()
        found = plan.reads.get(id(original)) if plan is not None else None
        if found is None:
            return None
        _, aug = found
        if isinstance(original.func, cst.Attribute):
            new = cst.Call(func=cst.Name(DEFERRED), args=[cst.Arg(updated.func.value)])
        else:
            new = cst.Call(func=cst.Name(DEFERRED), args=[
                updated.args[0].with_changes(comma=cst.Comma(
                    whitespace_after=cst.SimpleWhitespace(" "))),
                cst.Arg(cst.Name(original.func.value))])

        def build():
            self.ctx.helpers_needed.update({DEFERRED, VALUE})
            self.ctx.need_import("torch")
            return new

        return self.fix_or_report(original, self.say(
            "sum", code=self.ctx.short(original), name=aug.target.value, helper=DEFERRED,
            value=VALUE), build)

    def leave_Name(self, original: cst.Name, updated: cst.Name):
        plan = self._plan() if self.ctx.functions else None
        if plan is None or id(original) not in plan.loads:
            return None
        if not (self.rule.maps(self.ctx.target) and self.ctx.can_fix(self.rule, None)):
            return None
        self.ctx.helpers_needed.add(VALUE)
        return cst.Call(func=cst.Name(VALUE), args=[cst.Arg(updated)])
