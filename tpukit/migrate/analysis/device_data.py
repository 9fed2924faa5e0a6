"""Variables that hold a tensor on the device, by dataflow: what `.to(device)`, `.cuda()` or
a torch factory given `device=` made, what a function of the file that returns one gives, and
the parameters such variables are passed to. By the dataflow's symbols (a name in its scope),
never by spelling. Read by the rules whose cost is a device tensor indexed at Python ints
(TPU505's slices, TPU510's position writes, TPU511's pointers read back)."""

from __future__ import annotations

import re

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.bindings import Assigned
from tpukit.migrate.analysis.host_values import host_value
from tpukit.migrate.context import is_cuda_device_string
from tpukit.migrate.device_facts import is_device_value
from tpukit.migrate.nodes import scan

_MOVE = re.compile(r"\.(?:to|cuda)\(|\bdevice\s*=")
# torch's factories that make a tensor where their `device=` says
FACTORIES = frozenset({"torch.zeros", "torch.ones", "torch.empty", "torch.full", "torch.tensor",
                       "torch.arange", "torch.zeros_like", "torch.ones_like", "torch.empty_like",
                       "torch.full_like", "torch.rand", "torch.randn", "torch.randint"})


def _is_device(ctx, target: cst.BaseExpression) -> bool:
    """`device`, `"cuda"`, `torch.device(...)`: a device, as the dataflow knows it."""
    if isinstance(target, cst.Call):
        return is_device_value(ctx, target)
    return is_cuda_device_string(target) or (
        isinstance(target, (cst.Name, cst.Attribute)) and K.DEVICE in ctx.values.kinds(target))


def _moves_to_device(ctx, expr: cst.BaseExpression | None) -> bool:
    """`x.to(device)`, `x.to("cuda")`, `x.to(torch.device(...))`, `x.cuda()`, and a factory
    given a device (`torch.zeros(n, device=device)`)."""
    if not isinstance(expr, cst.Call):
        return False
    if not isinstance(expr.func, cst.Attribute) or ctx.qualify(expr.func) in FACTORIES:
        return ctx.qualify(expr.func) in FACTORIES and any(
            a.keyword is not None and a.keyword.value == "device" and _is_device(ctx, a.value)
            for a in expr.args)
    if expr.func.attr.value == "cuda":
        return ctx.qualify(expr.func.value) is None  # Tensor.cuda(), not torch.cuda
    if expr.func.attr.value != "to" or not expr.args or expr.args[0].keyword is not None:
        return False
    return _is_device(ctx, expr.args[0].value)


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


def device_data(ctx, wanted: re.Pattern) -> _DeviceData | None:
    """The file's device-resident variables; None where the source has nothing `wanted` looks
    for (a rule's own pre-filter) or moves nothing to a device."""
    if not (wanted.search(ctx.source) and _MOVE.search(ctx.source)):
        return None

    def compute():
        data = _DeviceData(ctx)
        data.resolve(ctx.module)
        return data

    return ctx.memo("device_data", compute)


def on_device(ctx, node: cst.Name, data: _DeviceData | None) -> bool:
    """Is the variable `node` names (in the function being walked) a tensor on the device?"""
    if data is None or host_value(ctx, node):
        return False  # also a NumPy array here: not known a tensor
    function = next((f for f in reversed(ctx.functions) if isinstance(f, cst.FunctionDef)), None)
    if function is not None:
        if node.value in data.params.get(id(function), ()):
            return True
        if node.value in {p.name.value for p in function.params.params}:
            return False  # a parameter nobody passes device data to
    return data.holds(node)


def int_read(ctx, node: cst.CSTNode) -> bool:
    """`int(x)`: the builtin `int` given one positional argument that is not a literal (a
    position read back from a tensor, `int(self.queue_ptr)`, when `x` is one)."""
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Name)
            and node.func.value == "int" and not ctx.values.bindings(node.func)
            and len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star
            and not isinstance(node.args[0].value, (cst.Integer, cst.Float, cst.SimpleString)))


def reads_back(ctx, expr: cst.BaseExpression | None) -> bool:
    """Does `expr` read a variable some binding of which is `int(x)` (TPU511's pointers)?"""
    if expr is None:
        return False
    return any(isinstance(b, Assigned) and not b.path and int_read(ctx, b.value)
               for name in scan_names(expr) for b in ctx.values.bindings(name))


def scan_names(expr: cst.BaseExpression):
    """The Name nodes of an arithmetic expression (`ptr + n`)."""
    if isinstance(expr, cst.Name):
        yield expr
    elif isinstance(expr, cst.BinaryOperation):
        yield from scan_names(expr.left)
        yield from scan_names(expr.right)
    elif isinstance(expr, cst.UnaryOperation):
        yield from scan_names(expr.expression)
