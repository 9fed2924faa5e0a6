"""A position read back from a tensor to index a device tensor, kept on the device (TPU511).

A contrastive trainer's queue (MoCo's `_dequeue_and_enqueue`: `ptr = int(self.queue_ptr)`,
`self.queue[:, ptr:ptr + batch_size] = keys.T`, `ptr = (ptr + batch_size) % self.K`,
`self.queue_ptr[0] = ptr`) reads its pointer back every call, so the host waits for the device
mid-step, and the slice's bounds are constants of the graph: one compile per position until the
pointer wraps. Kept on the device (`_xla_pointer`), the pointer is data: its arithmetic and its
write-back run in the graph, and `_xla_put_slice` writes at it, one graph for every position.

Decided by dataflow over the function: every use of the variable `int(...)` binds must be one
that means the same for an int and a 0-d integer tensor (arithmetic, rebinding it, a slice bound
or index of a subscript that is written, storing it back into the tensor it was read from).
Anything else (a read at it, a comparison, a call, a closure) needs the int on the host: the
line is reported with the rewrite to make.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from tpukit.migrate.analysis.device_data import int_read
from tpukit.migrate.nodes import ancestors, parent_map, walk
from tpukit.migrate.transforms.base import Transform, transform

POINTER, PUT = "_xla_pointer", "_xla_put_slice"  # helpers.py
# operators whose result is the same number for an int and a 0-d integer tensor
_ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide, cst.Modulo)
_AUG_ARITHMETIC = (cst.AddAssign, cst.SubtractAssign, cst.MultiplyAssign,
                   cst.FloorDivideAssign, cst.ModuloAssign)


@dataclass
class _Pointer:
    name: str
    read: cst.Call  # `int(tensor)`
    writes: list[tuple[cst.Assign, int, cst.BaseExpression, cst.BaseExpression | None]] = \
        field(default_factory=list)  # (the assignment, dim, start, stop or None for an index)
    blocker: cst.CSTNode | None = None  # the first use that needs the int on the host
    indexes: bool = False  # used in a subscript at all (else not this rule's idiom)


class _Plan:
    """The pointers of one function and the statements their rewrite touches."""

    def __init__(self, pointers: list[_Pointer]) -> None:
        self.pointers = pointers
        self.reads = {id(p.read): p for p in pointers}
        self.writes = {id(w[0]): (p, w) for p in pointers for w in p.writes}



def _full_slice(element: cst.SubscriptElement) -> bool:
    s = element.slice
    return isinstance(s, cst.Slice) and s.lower is None and s.upper is None and s.step is None


@transform("TPU511")
class DevicePointers(Transform):
    uses = frozenset({"device_data", "values"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.plans: dict[int, _Plan] = {}  # id(function) -> its plan

    # -- the analysis, once per function --------------------------------------------------
    def _plan(self) -> _Plan | None:
        return self.per_function(self.plans, self._analyse)

    def _analyse(self, function: cst.FunctionDef) -> _Plan:
        parents = parent_map(function)
        pointers = []
        for node in walk(function.body):
            if not (isinstance(node, cst.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0].target, cst.Name)
                    and int_read(self.ctx, node.value)):
                continue
            target = node.targets[0].target
            pointer = _Pointer(target.value, node.value)
            self._check_uses(pointer, self.ctx.values.symbol(target), function, parents)
            if pointer.indexes:
                pointers.append(pointer)
        return _Plan(pointers)

    def _check_uses(self, pointer: _Pointer, symbol, function, parents) -> None:
        source = pointer.read.args[0].value
        tensor = source.value if isinstance(source, cst.Subscript) else source
        sources = 0
        for node in walk(function.body):
            if not (isinstance(node, cst.Name) and node.value == pointer.name
                    and self.ctx.values.symbol(node) == symbol):
                continue
            parent = parents.get(id(node))
            if isinstance(parent, cst.Attribute) and parent.attr is node \
                    or isinstance(parent, cst.Arg) and parent.keyword is node:
                continue  # `x.ptr`, `f(ptr=...)`: another name
            problem = self._use_problem(node, parents, function, pointer, tensor)
            if problem is None and isinstance(parent, cst.AssignTarget) \
                    and parents[id(parent)].value is pointer.read:
                sources += 1
            if problem is not None and pointer.blocker is None:
                pointer.blocker = problem
        if sources != 1 and pointer.blocker is None:
            pointer.blocker = pointer.read

    def _use_problem(self, node, parents, function, pointer, tensor) -> cst.CSTNode | None:
        """None where this occurrence of the pointer means the same for an int and a 0-d
        tensor; else the node that needs the int (reported)."""
        if any(isinstance(n, (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.ListComp,
                              cst.SetComp, cst.DictComp, cst.GeneratorExp))
               for n in ancestors(node, parents, function)):
            return node  # seen from another scope: a closure keeps it
        parent = parents.get(id(node))
        if isinstance(parent, cst.AssignTarget):  # `ptr = ...`: a rebinding
            assign = parents[id(parent)]
            return None if len(assign.targets) == 1 else assign
        if isinstance(parent, cst.AugAssign) and parent.target is node:
            return None if isinstance(parent.operator, _AUG_ARITHMETIC) else parent
        top = node
        while isinstance(parents.get(id(top)), (cst.BinaryOperation, cst.UnaryOperation)):
            above = parents[id(top)]
            if isinstance(above, cst.BinaryOperation) and not isinstance(above.operator, _ARITHMETIC) \
                    or isinstance(above, cst.UnaryOperation) and not isinstance(above.operator, cst.Minus):
                return above
            top = above
        above = parents.get(id(top))
        if isinstance(above, cst.Assign) and above.value is top:
            (target,) = [t.target for t in above.targets] if len(above.targets) == 1 else [None]
            if isinstance(target, cst.Name) and target.value == pointer.name:
                return None  # `ptr = (ptr + n) % k`
            if isinstance(target, cst.Subscript) and self.ctx.code(target.value) == \
                    self.ctx.code(tensor):
                return None  # `queue_ptr[0] = ptr`: stored back where it was read from
            return above
        if isinstance(above, cst.AugAssign) and above.value is top \
                and isinstance(above.target, cst.Name) and above.target.value == pointer.name:
            return None
        return self._subscript_problem(top, parents, pointer)

    def _subscript_problem(self, top, parents, pointer) -> cst.CSTNode | None:
        """A bound of the subscript an assignment writes (`buf[:, ptr:ptr + n] = v`,
        `buf[ptr] = v`), the dimensions before it whole (`:`) and none after it."""
        bound = parents.get(id(top))
        element = parents.get(id(bound)) if isinstance(bound, cst.Slice) else bound
        if isinstance(bound, cst.Index):
            element = parents.get(id(bound))
        subscript = parents.get(id(element))
        if not (isinstance(element, cst.SubscriptElement) and isinstance(subscript, cst.Subscript)):
            return bound if isinstance(bound, cst.BaseExpression) else top  # `at == 0`
        pointer.indexes = True
        target = parents.get(id(subscript))
        assign = parents.get(id(target))
        if not (isinstance(target, cst.AssignTarget) and isinstance(assign, cst.Assign)
                and len(assign.targets) == 1):
            return subscript  # a read at the position (a copy would not be a view) or `del`
        elements = list(subscript.slice)
        dim = elements.index(element)
        if element is not elements[-1] or not all(_full_slice(e) for e in elements[:dim]):
            return subscript
        index = element.slice
        if isinstance(index, cst.Index):
            write = (assign, dim, index.value, None)
        elif isinstance(index, cst.Slice) and index.step is None and index.lower is not None \
                and index.upper is not None:
            write = (assign, dim, index.lower, index.upper)
        else:
            return subscript
        if all(w[0] is not assign for w in pointer.writes):
            pointer.writes.append(write)
        return None

    # -- the rewrite ------------------------------------------------------------------------
    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if not int_read(self.ctx, original):
            return None
        plan = self._plan()
        pointer = plan.reads.get(id(original)) if plan is not None else None
        if pointer is None:
            return None
        code = self.ctx.short(original)
        if pointer.blocker is not None or not pointer.writes:
            blocker = pointer.blocker or original
            self.ctx.report(self.rule, original, self.say(
                "left", code=code, name=pointer.name, use=self.ctx.short(blocker),
                tensor=self.ctx.code(original.args[0].value)), applied=False)
            return None
        writes = ", ".join(f"`{self.ctx.short(w[0])}`" for w in pointer.writes)

        def build():
            self.ctx.helpers_needed.add(POINTER)
            self.ctx.need_import("torch")
            return cst.Call(func=cst.Name(POINTER), args=[updated.args[0]])

        return self.fix_or_report(original, self.say(
            "pointer", code=code, name=pointer.name, writes=writes, helper=POINTER), build)

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        plan = self._plan() if self.ctx.functions else None
        found = plan.writes.get(id(original)) if plan is not None else None
        if found is None or found[0].blocker is not None:
            return None
        pointer, (_, dim, start, stop) = found
        buffer = original.targets[0].target.value
        bounds = self.ctx.code(start) + ", " + ("None" if stop is None else self.ctx.code(stop))
        new = (f"{PUT}({self.ctx.code(buffer)}, {dim}, {bounds}, "
               f"{self.ctx.code(updated.value)})")

        def build():
            self.ctx.helpers_needed.add(PUT)
            self.ctx.need_import("torch")
            return cst.Expr(self.ctx.expr(new))

        return self.fix_or_report(original, self.say(
            "write", code=self.ctx.short(original), name=pointer.name, helper=PUT), build)
