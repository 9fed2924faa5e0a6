"""Slices of a device-resident tensor at Python-int offsets (TPU505).

A corpus moved to the device once (`data = batchify(corpus.train, bsz)`, which ends in
`.to(device)`) and sliced per step (`source[i:i + seq_len]`, `i` from a `range`) gives XLA a
new slice instruction per offset: the bounds are attributes of the graph, so each offset is a
new compile. Indexing with an index built on the host (`torch.arange(n)[i:j]`, moved to the
device) gives one graph whatever the offset: the offset is data, not part of the graph.
Slicing the host arange with the user's own slice keeps Python's slice semantics (clamping,
negative bounds, steps) exactly.
"""

from __future__ import annotations

import re

import libcst as cst

from tpukit.migrate.analysis.device_data import device_data, on_device, reads_back
from tpukit.migrate.transforms.base import Transform, transform

# A file worth the pre-pass: a slice with a bound that is not a literal, and a move to a device.
_NAMED_SLICE = re.compile(r"\w\[[^\]\n]*[A-Za-z_]\w*\s*:|\w\[[^\]\n]*:\s*[A-Za-z_]")


def _is_literal(expr: cst.BaseExpression | None) -> bool:
    if isinstance(expr, cst.UnaryOperation):
        expr = expr.expression
    return isinstance(expr, cst.Integer)


def _varying_slice(original: cst.Subscript) -> tuple[int, cst.Slice] | None:
    """(dimension, slice) of the one slice whose bounds are Python values (`i:i + n`), all the
    other dimensions whole (`:`); None when there is no such slice."""
    found = None
    for dim, element in enumerate(original.slice):
        part = element.slice
        if not isinstance(part, cst.Slice):
            return None
        whole = part.lower is None and part.upper is None and part.step is None
        if whole:
            continue
        if found is not None or part.lower is None or part.upper is None:
            return None  # two sliced dimensions, or an open end (`x[i:]`: its size varies too)
        if _is_literal(part.lower) or _is_literal(part.upper):
            # fixed bounds: one graph; one fixed bound (`x[0:n]`, timesfm's decode loop): the
            # slice's length moves with the other, a new shape (and graph) either way
            return None
        found = (dim, part)
    return found


@transform("TPU505")
class DeviceSliceOffset(Transform):
    uses = frozenset({"device_data"})
    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.stores: set[int] = set()  # id() of subscripts written to: a view must stay a view

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.stores.add(id(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.stores.add(id(node.target))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value.endswith("_") and not node.attr.value.startswith("_"):
            self.stores.add(id(node.value))  # `x[i:j].zero_()` writes through the view

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript):
        if not isinstance(original.value, cst.Name) or not on_device(
                self.ctx, original.value, device_data(self.ctx, _NAMED_SLICE)):
            return None
        found = _varying_slice(original)
        if found is None:
            return None
        dim, part = found
        name = original.value.value
        bounds = cst.Module([]).code_for_node(updated.slice[dim].slice)
        size = f"{name}.size({dim})"
        fix = (f"{name}.index_select({dim}, torch.arange({size})[{bounds}].to({name}.device))")
        message = self.say("slice", code=self.ctx.short(original), fix=fix)
        if id(original) in self.stores:
            if reads_back(self.ctx, part.lower) or reads_back(self.ctx, part.upper):
                return None  # an offset read back from a tensor: TPU511's pointer
            self.ctx.report(self.rule, original, message + self.say("written_to"), applied=False)
            return None
        return self.fix_or_report(original, message, lambda: self.ctx.expr(fix))
