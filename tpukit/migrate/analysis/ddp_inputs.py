"""Are the inputs of a DDP-wrapped model on the device where it is called?

`DistributedDataParallel(model, device_ids=[i])` copies every tensor of its forward's inputs to
device `i`; without `device_ids` (the XLA form) nothing moves them, so a script that called
`ddp_model(torch.randn(20, 10))` with a host tensor fails ("Expected XLA tensor"). This module
answers, from the file's text alone, whether every call of the wrapped model passes values
that are already on the device: each argument is a literal, or a name whose nearest binding
before the call (in the same function) is a device move (`x = x.to(rank)`, `x.cuda()`, a
factory with `device=`), or a parameter that every call of its function in this file passes
such a value. Anything else (a host tensor, a batch from a loader, a splat, a model passed
out of the file) is not proven, and the rewrite moves the inputs itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from tpukit.migrate.context import dotted, string_value, terminal_name
from tpukit.migrate.nodes import scan

# Tensor methods whose result stays on the tensor's device.
_SAME_DEVICE = {"float", "long", "int", "half", "bfloat16", "double", "bool", "contiguous",
                "view", "reshape", "unsqueeze", "squeeze", "permute", "transpose", "flatten",
                "detach", "clone", "requires_grad_", "type_as", "t"}
_LITERALS = (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString, cst.Imaginary)
_DEPTH = 3  # parameters followed through at most this many calls


@dataclass
class _Param:
    """An argument that is a parameter of the function it is used in."""

    function: cst.FunctionDef
    name: str


@dataclass
class _Call:
    func: cst.BaseExpression
    facts: dict[int | str, bool | _Param] = field(default_factory=dict)  # position/keyword
    splat: bool = False


def _is_dtype(expr: cst.BaseExpression) -> bool:
    name = dotted(expr) or ""
    return name.startswith("torch.") and name.split(".")[-1] not in ("device",)


def moves_to_device(expr: cst.BaseExpression) -> bool:
    """`x.to(rank)`, `x.to(device, non_blocking=True)`, `x.cuda()`, `torch.zeros(3,
    device=dev)` and tensor methods of those (`x.to(dev).float()`); not `.to(torch.float16)`
    or `.to("cpu")`."""
    if not isinstance(expr, cst.Call):
        return False
    device = next((a for a in expr.args if a.keyword and a.keyword.value == "device"), None)
    if device is not None:
        return string_value(device.value) != "cpu"
    if not isinstance(expr.func, cst.Attribute):
        return False
    method = expr.func.attr.value
    if method == "cuda":
        return True
    if method == "to":
        first = expr.args[0] if expr.args and expr.args[0].keyword is None else None
        if first is None or first.star:
            return False
        return string_value(first.value) != "cpu" and not _is_dtype(first.value)
    return method in _SAME_DEVICE and moves_to_device(expr.func.value)


class _Scan(cst.CSTVisitor):
    """Every call in the file with what is known of its arguments where it is made."""

    def __init__(self) -> None:
        self.calls: list[_Call] = []
        self.functions: list[cst.FunctionDef | None] = [None]
        self.bound: dict[tuple[int, str], bool | _Param] = {}  # (id(function), name) -> fact
        self.params: dict[int, list[str]] = {}  # id(function) -> parameter names

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)
        names = [p.name.value for p in (*node.params.posonly_params, *node.params.params)]
        self.params[id(node)] = names
        for name in names + [p.name.value for p in node.params.kwonly_params]:
            self.bound[(id(node), name)] = _Param(node, name)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.pop()

    def _scope(self) -> int:
        return id(self.functions[-1])

    def fact(self, expr: cst.BaseExpression) -> bool | _Param:
        if isinstance(expr, _LITERALS) or dotted(expr) in ("None", "True", "False"):
            return True
        if moves_to_device(expr):
            return True
        if isinstance(expr, cst.Name):
            return self.bound.get((self._scope(), expr.value), False)
        if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Name):
            known = self.fact(expr.value)
            return known if known is True else False  # an element of a device tensor
        return False

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if isinstance(target, cst.Name):
            self.bound[(self._scope(), target.value)] = (
                False if value is None else self.fact(value))
        elif isinstance(target, (cst.Tuple, cst.List)):
            values = (value.elements if isinstance(value, (cst.Tuple, cst.List))
                      and len(value.elements) == len(target.elements) else None)
            for i, element in enumerate(target.elements):
                self._bind(element.value, None if values is None else values[i].value)

    def leave_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value)

    def leave_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target, node.value)

    def leave_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target, None)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target, None)  # a loader's batches: on the host unless moved

    def visit_Call(self, node: cst.Call) -> None:
        call = _Call(node.func, splat=any(a.star for a in node.args))
        position = 0
        for arg in node.args:
            if arg.star:
                continue
            key = arg.keyword.value if arg.keyword else position
            position += arg.keyword is None
            call.facts[key] = self.fact(arg.value)
        self.calls.append(call)


class ForwardInputs:
    """One scan of a file, asked about each expression a DDP model is bound to."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.scan = _Scan()
        scan(module, self.scan)

    def on_device(self, target: str) -> bool:
        """Does every call of `target` (its code: `ddp_model`, `self.model`) in this file pass
        arguments on the device? False when there is no such call: the model is used where
        this file cannot see."""
        calls = [c for c in self.scan.calls if self.module.code_for_node(c.func) == target]
        return bool(calls) and all(self._proven(c, _DEPTH) for c in calls)

    def _proven(self, call: _Call, depth: int) -> bool:
        return not call.splat and all(self._holds(f, depth) for f in call.facts.values())

    def _holds(self, fact: bool | _Param, depth: int) -> bool:
        if not isinstance(fact, _Param):
            return fact
        if depth == 0:
            return False
        function, name = fact.function, fact.name
        names = self.scan.params.get(id(function), [])
        callers = [c for c in self.scan.calls if terminal_name(c.func) == function.name.value]
        if not callers:
            return False
        for caller in callers:
            # A method called as `self.f(x)`: `self` is not among the arguments.
            offset = 1 if isinstance(caller.func, cst.Attribute) and names[:1] == ["self"] else 0
            index = names.index(name) - offset if name in names else None
            fact_here = caller.facts.get(name)
            if fact_here is None and index is not None and index >= 0:
                fact_here = caller.facts.get(index)
            if fact_here is None or caller.splat or not self._holds(fact_here, depth - 1):
                return False
        return True
