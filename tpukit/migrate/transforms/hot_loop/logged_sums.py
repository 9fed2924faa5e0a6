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
from tpukit.migrate.nodes import ancestors, parent_map, walk
from tpukit.migrate.transforms.base import Transform, transform
from tpukit.migrate.transforms.hot_loop.common import (
    _SCOPES, _SUMS, _UPDATES, DEFERRED, VALUE, _number, counted, deferred_fix, enclosing_loop,
    ends_graph, read_call, reads_in, under_if)

@dataclass
class _Plan:
    reads: dict[int, tuple[cst.Call, cst.AugAssign]] = field(default_factory=dict)
    loads: set[int] = field(default_factory=set)  # id() of Name reads of a sum: wrapped



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

    def _analyse(self, function: cst.FunctionDef) -> _Plan:
        plan = _Plan()
        parents = parent_map(function)
        sums: dict[object, list[tuple[cst.AugAssign, list[cst.Call]]]] = {}
        for node in walk(function.body):
            if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name) \
                    and isinstance(node.operator, _SUMS):
                reads = reads_in(self.ctx.values, node.value)
                if reads:
                    symbol = self.ctx.values.symbol(node.target)
                    sums.setdefault(symbol, []).append((node, reads))
        scope = self.ctx.values.scopes.get(id(function))
        for symbol, found in sums.items():
            if symbol is None or symbol[1] != id(scope):
                continue  # a global or a closure's: read elsewhere too
            loops = [enclosing_loop(aug, parents, function) for aug, _ in found]
            if any(loop is None or not ends_graph(self.ctx, loop) for loop in loops):
                continue
            loads = self._loads(symbol, found, loops, parents, function)
            if loads is None:
                continue
            plan.loads.update(loads)
            for aug, reads in found:
                for read in reads:
                    plan.reads[id(read)] = (read, aug)
        return plan

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
                                          and counted(self.ctx.values, parent.value)):
                    continue
                return None
            if self._bound_here(node, parent, above):
                return None  # a for target, an unpacking, `with ... as`, `del`: bound otherwise
            if any(id(n) in sums for n in above):
                return None  # read in its own sum
            for loop in loops:
                if loop in above and not under_if(node, parents, loop):
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

    # -- the rewrite ------------------------------------------------------------------------
    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        plan = self._plan() if self.ctx.functions else None
        if plan is not None:  # TPU501 leaves to this rule the reads it moves off the step
            self.ctx.handled.update(i for i, (_, aug) in plan.reads.items() if aug is node)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if not read_call(self.ctx.values, original):
            return None
        plan = self._plan()
        found = plan.reads.get(id(original)) if plan is not None else None
        if found is None:
            return None
        _, aug = found
        return deferred_fix(self, original, updated, self.say(
            "sum", code=self.ctx.short(original), name=aug.target.value, helper=DEFERRED,
            value=VALUE))

    def leave_Name(self, original: cst.Name, updated: cst.Name):
        plan = self._plan() if self.ctx.functions else None
        if plan is None or id(original) not in plan.loads:
            return None
        if not (self.rule.maps(self.ctx.target) and self.ctx.can_fix(self.rule, None)):
            return None
        self.ctx.helpers_needed.add(VALUE)
        return cst.Call(func=cst.Name(VALUE), args=[cst.Arg(updated)])
