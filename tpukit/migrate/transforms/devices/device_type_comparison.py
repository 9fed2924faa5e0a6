"""TPU104 device-type-comparison: `device.type == 'cuda'` style checks test for 'xla'.

Its messages and tables: rules/TPU104-device-type-comparison.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.context import string_value
from tpukit.migrate.transforms.base import Transform, transform
from tpukit.migrate.transforms.devices.common import (
    device_string,
    holds_a_device_string,
    need_device_module,
)


@transform("TPU104")
class DeviceTypeComparison(Transform):
    uses = frozenset({"values"})
    _OPERATORS = (cst.Equal, cst.NotEqual, cst.In, cst.NotIn)

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.assigned: list[list[cst.BaseExpression]] = []
        self.fused_args = 0  # inside a `fused=` argument

    def visit_Assign(self, node: cst.Assign):
        self.assigned.append([t.target for t in node.targets])

    def leave_Assign(self, original, updated):
        self.assigned.pop()
        return None

    def visit_Arg(self, node: cst.Arg):
        if node.keyword is not None and node.keyword.value == "fused":
            self.fused_args += 1

    def leave_Arg(self, original, updated):
        if original.keyword is not None and original.keyword.value == "fused":
            self.fused_args -= 1
        return None

    def _picks_fused_kernels(self) -> bool:
        """`use_fused = device_type == 'cuda'` given as `fused=use_fused`: fused optimizers are
        CUDA kernels, which XLA does not have (it fuses the update itself): the check must
        stay False."""
        return bool(self.fused_args) or any(
            self.ctx.values.given_as(t, "fused") for targets in self.assigned for t in targets)

    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison):
        if self._picks_fused_kernels():
            return None
        left_old, left_new = original.left, updated.left
        new_left = left_new
        targets = list(updated.comparisons)
        changed = False
        for i, (old, new) in enumerate(zip(original.comparisons, updated.comparisons)):
            if not isinstance(old.operator, self._OPERATORS):
                left_old = old.comparator
                continue
            pairs = ((left_old, old.comparator, "left"), (old.comparator, left_old, "right"))
            for literal, other, side in pairs:
                if string_value(literal) != "cuda" or not holds_a_device_string(self.ctx, other):
                    continue  # a backend, or an attribute name that keeps its "cuda"
                if self.library_keeps_cuda_check(literal, original):
                    continue
                replacement = self.fix_or_report(
                    literal, self.say("comparison", code=self.ctx.short(original)),
                    lambda lit=literal: self._xla(lit))
                if replacement is not None:
                    changed = True
                    self.ctx.add_guard(replacement, literal, negated=isinstance(
                        old.operator, (cst.NotEqual, cst.NotIn)), shown=original)
                    if side == "left" and i == 0:
                        new_left = replacement
                    elif side == "right":
                        targets[i] = new.with_changes(comparator=replacement)
            left_old = old.comparator
        if not changed:
            return None
        return updated.with_changes(left=new_left, comparisons=targets)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        # `device.startswith("cuda")` (build-nanogpt's device_type): a comparison by method
        func = original.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "startswith"
                and len(original.args) == 1 and holds_a_device_string(self.ctx, func.value)):
            return None
        literal = original.args[0].value
        if string_value(literal) not in ("cuda", "cuda:"):
            return None
        if self.library_keeps_cuda_check(literal, original):
            return None
        replacement = self.fix_or_report(
            literal, self.say("comparison", code=self.ctx.short(original)),
            lambda: self._xla(literal))
        if replacement is None:
            return None
        self.ctx.add_guard(replacement, literal, shown=original)
        return updated.with_changes(args=[updated.args[0].with_changes(value=replacement)])

    def _xla(self, literal):
        need_device_module(self.ctx)
        return device_string(self.ctx, literal)
