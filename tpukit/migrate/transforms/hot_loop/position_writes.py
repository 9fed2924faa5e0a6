"""A preallocated device buffer written at a Python-int position in a loop that syncs (TPU510).

PPO's rollout (`obs[step] = next_obs` for `step in range(num_steps)`, with the actions read to
the host every iteration for the environment) ends a graph each iteration, and each graph holds
its `step` as a constant: one compile per buffer position (cleanrl's ppo.py: 255 graphs after
warm-up). `_xla_put(obs, step, next_obs)` writes with `index_copy_` at an index tensor made from
the int, so the position is data and one graph serves them all. The helper keeps the assignment's
meaning: the value cast to the buffer's dtype, broadcast to a row (leading 1s dropped, as
`__setitem__` drops them), negative positions counted from the end, and anything else (a
position out of range, a bool, a NumPy int, what is not a tensor) written by `buffer[index] =
value` itself. Only where the loop syncs (a host read or a barrier in its body): a loop that
never ends a graph is one graph already, its writes unrolled into it.
"""

from __future__ import annotations

import re

import libcst as cst

from tpukit.migrate.analysis.device_data import device_data, on_device
from tpukit.migrate.analysis.steps import find_steps
from tpukit.migrate.nodes import walk
from tpukit.migrate.transforms.base import Transform, transform

HELPER = "_xla_put"  # helpers.py
# `name[name...] =`: a subscript written at a position that is not a literal
_POSITION_WRITE = re.compile(r"\w\[\s*[A-Za-z_][\w\s+\-]*\]\s*=[^=]")


@transform("TPU510")
class PositionWrites(Transform):
    uses = frozenset({"device_data", "steps", "values"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        # enclosing loops: (position variable or "", whether an iteration syncs, the loop)
        self.loops: list[tuple[str, bool, cst.For]] = []
        self.reads: dict[int, cst.Subscript | None] = {}  # id(loop) -> _position_read's

    def visit_For(self, node: cst.For) -> None:
        self.loops.append((self._position_variable(node), self._syncs(node), node))

    def leave_For(self, original: cst.For, updated: cst.For):
        self.loops.pop()
        return None

    def _position_variable(self, node: cst.For) -> str:
        """`i` of `for i in range(...)` or `reversed(range(...))` (the builtins), else ""."""
        it = node.iter
        if self._builtin(it, "reversed") and len(it.args) == 1:
            it = it.args[0].value
        if isinstance(node.target, cst.Name) and self._builtin(it, "range"):
            return node.target.value
        return ""

    def _builtin(self, expr: cst.BaseExpression, name: str) -> bool:
        return (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name)
                and expr.func.value == name and not self.ctx.values.bindings(expr.func))

    def _syncs(self, loop: cst.For | cst.While) -> bool:
        """Does an iteration end a graph: a host read (`.cpu()`, `.item()`, ...), a barrier or
        an optimizer step (a barrier follows it once ported), in its body or a loop nested in
        it (steps.find_steps: each loop's own statements, once per loop for every rule)?"""
        steps = find_steps(self.ctx, loop)
        return (steps.first_host_read is not None or steps.has_barrier or bool(steps.step_lines)
                or any(self._syncs(inner) for inner in steps.inner_loops))

    def _position(self, expr: cst.BaseExpression) -> bool:
        """An int a syncing position loop gives: its variable (the innermost loop that binds
        it), plus or minus integer literals (`t + 1`)."""
        if isinstance(expr, cst.Name):
            return next((syncs for name, syncs, _ in reversed(self.loops)
                         if name == expr.value), False)
        if isinstance(expr, cst.BinaryOperation) and isinstance(
                expr.operator, (cst.Add, cst.Subtract)):
            sides = (expr.left, expr.right)
            return any(self._position(a) and isinstance(b, cst.Integer)
                       for a, b in (sides, sides[::-1]))
        return False

    def _position_read(self) -> cst.Subscript | None:
        """A device tensor read at a position (`buf[t]`, not assigned to) in the innermost
        syncing position loop: its graph differs per position whatever the writes do."""
        loop = next((node for name, syncs, node in reversed(self.loops) if name and syncs), None)
        if loop is None:
            return None
        if id(loop) not in self.reads:  # asked once per write: the loop's answer is one
            self.reads[id(loop)] = self._first_position_read(loop)
        return self.reads[id(loop)]

    def _first_position_read(self, loop: cst.For) -> cst.Subscript | None:
        data = device_data(self.ctx, _POSITION_WRITE)
        inside = list(walk(loop.body))
        stores = {id(n.target) for n in inside if isinstance(n, (cst.AssignTarget, cst.AugAssign))}
        for node in inside:
            if (isinstance(node, cst.Subscript) and id(node) not in stores
                    and isinstance(node.value, cst.Name) and len(node.slice) == 1
                    and isinstance(node.slice[0].slice, cst.Index)
                    and self._position(node.slice[0].slice.value)
                    and on_device(self.ctx, node.value, data)):
                return node
        return None

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        if len(original.targets) != 1 or not self.loops:
            return None  # `a[t] = b = ...` binds a name as well: left
        target = original.targets[0].target
        if not (isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name)
                and len(target.slice) == 1 and isinstance(target.slice[0].slice, cst.Index)):
            return None
        index = target.slice[0].slice.value
        if not self._position(index):
            return None
        if not on_device(self.ctx, target.value, device_data(self.ctx, _POSITION_WRITE)):
            return None
        buffer, position = self.ctx.code(target.value), self.ctx.code(index)
        read = self._position_read()
        if read is not None:  # the loop's graph holds that position all the same
            self.ctx.report(self.rule, original, self.say(
                "write_and_read", code=self.ctx.short(original), buffer=buffer,
                position=position, read=self.ctx.short(read)), applied=False)
            return None
        value = self.ctx.code(updated.value)
        new = f"{HELPER}({buffer}, {position}, {value})"

        def build():
            self.ctx.helpers_needed.add(HELPER)
            self.ctx.need_import("torch")
            return cst.Expr(self.ctx.expr(new))

        return self.fix_or_report(original, self.say(
            "write", code=self.ctx.short(original), buffer=buffer, position=position,
            helper=HELPER), build)
