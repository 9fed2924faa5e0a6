"""TPU502 data-dependent-shape: An op whose output shape depends on tensor values (a masked write
of a number becomes masked_fill_).

Its messages and tables: rules/TPU502-data-dependent-shape.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.host_values import host_value
from tpukit.migrate.context import dotted
from tpukit.migrate.transforms.base import Transform, transform


def _scalar(expr: cst.BaseExpression) -> bool:
    """A number: `0`, `-1e9`, `float('-inf')`, `-float('Inf')`, `math.inf`."""
    if isinstance(expr, cst.UnaryOperation):
        return _scalar(expr.expression)
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "float":
        return len(expr.args) == 1 and isinstance(expr.args[0].value, cst.SimpleString)
    return dotted(expr) in ("math.inf", "float.inf", "np.inf", "numpy.inf")


@transform("TPU502")
class DataDependentShape(Transform):
    """Ops whose output shape depends on tensor values fall back to the CPU or recompile."""
    uses = frozenset({"host_values", "values"})

    FUNCTIONS = ("torch.nonzero", "torch.masked_select", "torch.unique")
    METHODS = {"nonzero": "torch.nonzero", "masked_select": "torch.masked_select", "unique": "torch.unique"}

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        name = self.ctx.qualify(original.func)
        func = original.func
        if name is None and isinstance(func, cst.Attribute) and func.attr.value in self.METHODS:
            name = self.METHODS[func.attr.value]
        if name in self.FUNCTIONS:
            message = {"torch.nonzero": self.say("nonzero"),
                       "torch.masked_select": self.say("masked_select"),
                       "torch.unique": self.say("unique")}[name]
            self.ctx.report(self.rule, original, message, applied=False, fix=FixKind.NONE)
        elif name == "torch.where" and len(original.args) == 1:
            self.ctx.report(self.rule, original, self.say("where"), applied=False,
                            fix=FixKind.NONE)
        return None

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.filled: dict[int, cst.Subscript] = {}  # id(`x[x < v] = -inf`) -> its target

    def _mask_fill(self, node: cst.Assign) -> cst.Subscript | None:
        """`x[<comparison>] = <scalar>`: the same as `x.masked_fill_(<comparison>, <scalar>)`,
        which keeps x's shape (minGPT's top-k: `logits[logits < v[:, [-1]]] = -float('Inf')`)."""
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Subscript):
            return None
        target = node.targets[0].target
        if len(target.slice) != 1 or not isinstance(target.slice[0].slice, cst.Index):
            return None
        mask = target.slice[0].slice.value
        if not isinstance(mask, cst.Comparison):
            return None
        # a NumPy array (`mm = np.zeros_like(ids); mm[ids == k] = 1`) has no masked_fill_
        # (a name some binding may make one: `masks = np.stack(masks)` over a parameter the
        # callers give tensors, whichever binding reaches this line)
        names = [n for n in (target.value, mask.left) if isinstance(n, cst.Name)]
        if any(host_value(self.ctx, n) or K.NUMPY in self.ctx.values.kinds(n) for n in names):
            return None
        return target if _scalar(node.value) else None

    @staticmethod
    def _same_shape(target: cst.Subscript) -> bool:
        """Is the mask made from the target itself (`x[x < v] = 0`), so of its shape? A mask
        of another tensor may cover only the leading dims (ultralytics' SAM: a B x N mask of a
        B x N x C embedding), which boolean indexing allows and masked_fill_ does not."""
        mask = target.slice[0].slice.value
        return target.value.deep_equals(mask.left) or any(
            target.value.deep_equals(c.comparator) for c in mask.comparisons)

    def visit_Assign(self, node: cst.Assign):
        target = self._mask_fill(node)
        if target is not None:
            self.filled[id(node)] = target
        return None

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        target = self.filled.pop(id(original), None)
        if target is None:
            return None
        mask = self.ctx.code(target.slice[0].slice.value)
        tensor = self.ctx.code(target.value)
        value = self.ctx.code(original.value)
        new = f"{tensor}.masked_fill_({mask}, {value})"
        if not self._same_shape(target):
            self.ctx.report(self.rule, original, self.say(
                "masked_write_other", code=self.ctx.short(original), new=new),
                applied=False, fix=FixKind.NONE)
            return None
        return self.fix_or_report(
            original, self.say("masked_write", code=self.ctx.short(original), new=new),
            lambda: cst.Expr(cst.parse_expression(new)))

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript):
        if any(target is original for target in self.filled.values()):
            return None  # the target of a masked write being rewritten (leave_Assign)
        if len(original.slice) != 1 or not isinstance(original.slice[0].slice, cst.Index):
            return None
        index = original.slice[0].slice.value
        # a comparison, or a variable the dataflow says holds a boolean tensor
        boolean = isinstance(index, cst.Comparison) or (
            isinstance(index, (cst.Name, cst.Attribute)) and K.BOOL in self.ctx.values.kinds(index))
        if boolean and not host_value(self.ctx, original.value):  # a NumPy array's is the host's
            self.ctx.report(self.rule, original,
                            self.say("masked_index", code=self.ctx.short(original)),
                            applied=False, fix=FixKind.NONE)
        return None
