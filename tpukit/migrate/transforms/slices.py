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

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.host_values import host_value
from tpukit.migrate.context import is_cuda_device_string
from tpukit.migrate.device_facts import is_device_value
from tpukit.migrate.nodes import scan
from tpukit.migrate.transforms.base import Transform, transform

# A file worth the pre-pass: a slice with a bound that is not a literal, and a move to a device.
_NAMED_SLICE = re.compile(r"\w\[[^\]\n]*[A-Za-z_]\w*\s*:|\w\[[^\]\n]*:\s*[A-Za-z_]")
_MOVE = re.compile(r"\.(?:to|cuda)\(")


def _moves_to_device(ctx, expr: cst.BaseExpression | None) -> bool:
    """`x.to(device)`, `x.to("cuda")`, `x.to(torch.device(...))`, `x.cuda()`."""
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
        return False
    if expr.func.attr.value == "cuda":
        return ctx.qualify(expr.func.value) is None  # Tensor.cuda(), not torch.cuda
    if expr.func.attr.value != "to" or not expr.args or expr.args[0].keyword is not None:
        return False
    target = expr.args[0].value
    if isinstance(target, cst.Call):
        return is_device_value(ctx, target)
    return is_cuda_device_string(target) or (
        isinstance(target, (cst.Name, cst.Attribute)) and K.DEVICE in ctx.values.kinds(target))


class _DeviceData(cst.CSTVisitor):
    """Variables bound to a tensor on the device: `x = t.to(device)`, `x = batchify(...)` where
    `batchify` returns one, and the parameters such variables are passed to (`get_batch(x, i)`).
    By variable (the dataflow's symbol: a name in its scope), never by spelling: the `x` of a
    collater's comprehension over NumPy arrays is not the `x` another method moved."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.functions: dict[str, cst.FunctionDef] = {}
        self.returning: set[str] = set()  # functions that return a tensor moved to the device
        self.symbols: set = set()  # the dataflow's symbols (values.symbol) of those variables
        self.params: dict[int, set[str]] = {}  # id(function) -> its device-resident parameters
        self._stack: list[cst.FunctionDef] = []
        self._moved_locals: list[set[str]] = []
        self._calls: list[cst.Call] = []
        self._assigned_calls: list[tuple[str, object]] = []  # `x = f(...)`: (f, targets)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions[node.name.value] = node
        self._stack.append(node)
        self._moved_locals.append(set())

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._stack.pop()
        self._moved_locals.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Call) and isinstance(node.value.func, cst.Name):
            self._assigned_calls.append((node.value.func.value, node.targets))
        if _moves_to_device(self.ctx, node.value):
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    if self._stack:
                        self._moved_locals[-1].add(target.target.value)
                    self._add(target.target)

    def visit_Return(self, node: cst.Return) -> None:
        if not self._stack:
            return
        value = node.value
        if _moves_to_device(self.ctx, value) or (
                isinstance(value, cst.Name) and value.value in self._moved_locals[-1]):
            self.returning.add(self._stack[-1].name.value)

    def visit_Call(self, node: cst.Call) -> None:
        self._calls.append(node)

    def _add(self, name: cst.Name) -> None:
        symbol = self.ctx.values.symbol(name)
        if symbol is not None:
            self.symbols.add(symbol)

    def holds(self, name: cst.Name) -> bool:
        return self.ctx.values.symbol(name) in self.symbols

    def resolve(self, module: cst.Module) -> None:
        scan(module, self)
        # `train_data = batchify(corpus.train, bsz)`: bound to what `batchify` returns
        for function, targets in self._assigned_calls:
            if function in self.returning:
                for t in targets:
                    if isinstance(t.target, cst.Name):
                        self._add(t.target)
        for call in self._calls:
            function = self.functions.get(call.func.value) if isinstance(call.func, cst.Name) else None
            if function is None:
                continue
            params = [p.name.value for p in function.params.params]
            for i, arg in enumerate(call.args):
                if not isinstance(arg.value, cst.Name) or not self.holds(arg.value):
                    continue
                if arg.keyword is not None:
                    name = arg.keyword.value
                elif arg.star or i >= len(params):
                    continue
                else:
                    name = params[i]
                self.params.setdefault(id(function), set()).add(name)


def device_data(ctx) -> _DeviceData | None:
    def compute():
        if not (_NAMED_SLICE.search(ctx.source) and _MOVE.search(ctx.source)):
            return None
        data = _DeviceData(ctx)
        data.resolve(ctx.module)
        return data

    return ctx.memo("device_data", compute)


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
    uses = frozenset({"host_values", "values"})
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

    def _on_device(self, name: str, node: cst.Name) -> bool:
        data = device_data(self.ctx)
        if data is None or host_value(self.ctx, node):
            return False  # also a NumPy array here: not known a tensor
        function = next((f for f in reversed(self.ctx.functions)
                         if isinstance(f, cst.FunctionDef)), None)
        if function is not None:
            if name in data.params.get(id(function), ()):
                return True
            if name in {p.name.value for p in function.params.params}:
                return False  # a parameter nobody passes device data to
        return data.holds(node)

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript):
        if not isinstance(original.value, cst.Name) or not self._on_device(original.value.value, original.value):
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
            self.ctx.report(self.rule, original, message + self.say("written_to"), applied=False)
            return None
        return self.fix_or_report(original, message, lambda: self.ctx.expr(fix))
