"""TPU508 parameter-reads: a host read for every parameter, in gradient clipping or logging.

`for name, p in model.named_parameters(): norms.append(p.grad.norm().item())`, a histogram of
every weight (`writer.add_histogram(name, p.cpu().numpy())`), DINO's clipping (`if clip_coef <
1: p.grad.mul_(clip_coef)`): in the step, before its barrier, each read executes the pending
graph up to that tensor, the whole forward and backward again, and compiles a graph of its own
per parameter (a ViT's 150, a segmentation net's 300, each as large as the step: the process
passed vm.max_map_count and died in LLVM). Two ports, by what the loop does:

- the guard of a scale by a factor at most 1 (`if c < 1: t.mul_(c)`) is the clamp torch's own
  `clip_grad_norm_` uses (`t.mul_(torch.clamp(c, max=1.0))`): no read, the same values;
- on torch_xla, a read whose value is only appended to a list made empty just before the loop
  (`norms.append(n.item())`, `norms` read nowhere else in the loop) appends the tensor, and the
  list is read after the loop, after one barrier (`torch_xla.sync()` then `norms[:] = [t.item()
  for t in norms]`, in place: the same list object): the same floats, and no read between the loop's in-place updates (each
  read in the loop ran a graph holding every scale before it: DINO's clipping compiled 67
  graphs a step, growing from 10 to 1,533 instructions);
- on torch_xla, a barrier before the loop when reads stay: the pending step runs once, and each
  read then copies a tensor that is already computed (a small graph per distinct shape).

Its messages and tables: rules/TPU508-parameter-reads.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.steps import HOST_READS, is_barrier
from tpukit.migrate.nodes import scan
from tpukit.migrate.transforms.base import Transform, transform

PARAMETER_METHODS = ("parameters", "named_parameters")


def _over_parameters(loop: cst.For) -> bool:
    """`for p in m.parameters()`, `for n, p in m.named_parameters()` (also through
    `enumerate`, `zip`, `list`): a loop with one iteration per parameter."""
    it = loop.iter
    while (isinstance(it, cst.Call) and isinstance(it.func, cst.Name)
           and it.func.value in ("enumerate", "list", "sorted", "reversed") and it.args):
        it = it.args[0].value
    return (isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute)
            and it.func.attr.value in PARAMETER_METHODS)


def _is_one(expr: cst.BaseExpression) -> bool:
    return (isinstance(expr, (cst.Integer, cst.Float)) and float(expr.value) == 1.0)


class _Reads(cst.CSTVisitor):
    """The host reads of tensors in a loop's body (`.item()`, `.tolist()`, `.cpu()`,
    `.numpy()`, `float(t)`, `int(t)`, an `if` on a tensor), the clamp rewrites aside."""

    def __init__(self, transform, guards: set[int]) -> None:
        self.transform = transform
        self.guards = guards  # id(If) the clamp rewrite removes
        self.reads: list[cst.CSTNode] = []

    def visit_FunctionDef(self, node) -> bool:
        return False

    def visit_If(self, node: cst.If) -> None:
        if id(node) not in self.guards and self.transform._tensor(node.test):
            self.reads.append(node.test)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in HOST_READS and not node.args:
            if not self.transform.ctx.qualify(func.value):  # `np.cpu()`? a module's function
                self.reads.append(node)
        elif (isinstance(func, cst.Name) and func.value in ("float", "int") and len(node.args) == 1
              and self.transform._tensor(node.args[0].value)):
            self.reads.append(node)


@transform("TPU508")
class ParameterReads(Transform):
    uses = frozenset({"steps", "values"})
    table_keys = frozenset({"insert"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.before: set[int] = set()  # id(For) that get a barrier before them
        self.after: dict[int, list[tuple[str, int]]] = {}  # id(For) -> (list, id(read))
        self.deferred: set[int] = set()  # id(Call) of the `.item()` reads to append as tensors
        self.rewritten: set[int] = set()  # ... and of those leave_Call rewrote

    def _tensor(self, expr: cst.BaseExpression) -> bool:
        """Does `expr` hold a tensor (a comparison: one of a tensor's values; `p.grad is not
        None` compares no values)?"""
        if isinstance(expr, cst.Comparison):
            if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn))
                   for c in expr.comparisons):
                return False
            return self._tensor(expr.left) or any(self._tensor(c.comparator)
                                                  for c in expr.comparisons)
        return K.TENSOR in self.ctx.values.kinds(expr)

    def _clamp_guard(self, node: cst.If):
        """`if c < 1: t.mul_(c)` (or `1 > c`), no else, `c` a tensor: the scale it guards, as
        (t.mul_ call, c)."""
        test = node.test
        if node.orelse is not None or not isinstance(test, cst.Comparison) \
                or len(test.comparisons) != 1:
            return None
        op, right = test.comparisons[0].operator, test.comparisons[0].comparator
        if isinstance(op, cst.LessThan) and _is_one(right):
            factor = test.left
        elif isinstance(op, cst.GreaterThan) and _is_one(test.left):
            factor = right
        else:
            return None
        if not isinstance(factor, cst.Name) or not self._tensor(factor):
            return None
        body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
        if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) \
                or len(body[0].body) != 1 or not isinstance(body[0].body[0], cst.Expr):
            return None
        call = body[0].body[0].value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "mul_" and len(call.args) == 1
                and call.args[0].keyword is None and isinstance(call.args[0].value, cst.Name)
                and call.args[0].value.value == factor.value):
            return None
        return call, factor

    def _guards_in(self, loop: cst.For) -> set[int]:
        found = set()

        class Guards(cst.CSTVisitor):
            def visit_If(inner, node: cst.If) -> None:
                if self._clamp_guard(node) is not None:
                    found.add(id(node))

        scan(loop.body, Guards())
        return found

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._plan(node.body)

    def visit_Module(self, node: cst.Module) -> None:
        self._plan(node.body)

    def _plan(self, body) -> None:
        """Which loops over parameters get a barrier before them: those with a read left, not
        already after a barrier."""
        if not self.mapping.get("insert"):
            return
        previous = None
        for index, stmt in enumerate(body):
            if isinstance(stmt, cst.For) and _over_parameters(stmt):
                reads = _Reads(self, self._guards_in(stmt))
                scan(stmt.body, reads)
                deferred = self._deferrable(stmt, body[:index], reads.reads)
                if deferred:
                    self.after[id(stmt)] = [(name, id(call)) for name, call in deferred]
                    self.deferred.update(id(call) for _, call in deferred)
                left = [r for r in reads.reads if id(r) not in self.deferred]
                if left and not self._after_barrier(previous):
                    self.before.add(id(stmt))
            previous = stmt

    def _deferrable(self, loop: cst.For, before, reads) -> list[tuple[str, cst.Call]]:
        """The reads `L.append(x.item())` of the loop whose list `L` was bound to `[]` by the
        last statement before the loop that binds it, and that the loop uses only to append
        those reads: (L, the `.item()` call) for each."""
        appends: dict[str, list[cst.Call]] = {}
        read_ids = {id(r) for r in reads}
        transform = self

        class Appends(cst.CSTVisitor):
            def visit_FunctionDef(self, node) -> bool:
                return False

            def visit_Expr(self, node: cst.Expr) -> None:
                call = node.value
                if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                        and call.func.attr.value == "append"
                        and isinstance(call.func.value, cst.Name) and len(call.args) == 1
                        and call.args[0].keyword is None and call.args[0].star == ""):
                    return
                read = call.args[0].value
                if (isinstance(read, cst.Call) and id(read) in read_ids
                        and isinstance(read.func, cst.Attribute) and read.func.attr.value == "item"
                        and transform._tensor(read.func.value)):
                    appends.setdefault(call.func.value.value, []).append(read)

        scan(loop.body, Appends())
        found = []
        for name, calls in appends.items():
            uses = _Uses(name)
            scan(loop.body, uses)
            scan(loop.target, uses)
            if uses.count == len(calls) and _made_empty(name, before):
                found += [(name, call) for call in calls]
        return found

    def _after_barrier(self, stmt) -> bool:
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        return any(isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)
                   and is_barrier(s.value, self.ctx.qualify) for s in stmt.body)

    def leave_If(self, original: cst.If, updated: cst.If):
        guard = self._clamp_guard(original)
        if guard is None:
            return None
        _, factor = guard
        code = self.ctx.short(original.test)

        def build():
            call = updated.body.body[0].body[0].value
            clamped = self.ctx.expr(f"torch.clamp({factor.value}, max=1.0)")
            line = updated.body.body[0].with_changes(
                body=[cst.Expr(call.with_changes(args=[call.args[0].with_changes(value=clamped)]))],
                leading_lines=updated.leading_lines)
            return cst.FlattenSentinel([line])  # a statement for the `if` statement

        return self.fix_or_report(original, self.say("clamp", code=code, factor=factor.value),
                                  build)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if id(original) not in self.deferred:
            return None
        fixed = self.fix_or_report(original, self.say("deferred", code=self.ctx.short(original)),
                                   lambda: updated.func.value)  # the tensor, read after the loop
        if fixed is not None:
            self.rewritten.add(id(original))
        return fixed

    def leave_For(self, original: cst.For, updated: cst.For):
        before = id(original) in self.before
        self.before.discard(id(original))
        # the lists whose reads leave_Call deferred: read after the loop, after one barrier
        lists = list(dict.fromkeys(name for name, read in self.after.pop(id(original), [])
                                   if read in self.rewritten))
        after = [cst.SimpleStatementLine([cst.Expr(self.ctx.expr("torch_xla.sync()"))])] + [
            cst.parse_statement(f"{name}[:] = [t.item() for t in {name}]") for name in lists] \
            if lists else []
        if not before:
            return cst.FlattenSentinel([updated, *after]) if after else None

        def build():
            sync = cst.SimpleStatementLine([cst.Expr(self.ctx.expr("torch_xla.sync()"))],
                                           leading_lines=updated.leading_lines)
            return cst.FlattenSentinel([sync, updated.with_changes(leading_lines=()), *after])

        fixed = self.fix_or_report(original, self.say("barrier", code=self.ctx.short(original.iter)),
                                   build)
        return cst.FlattenSentinel([updated, *after]) if fixed is None and after else fixed


class _Uses(cst.CSTVisitor):
    """How many times code names `name`, nested functions and lambdas included (a closure that
    reads the list may run before the reads after the loop)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.name:
            self.count += 1


def _made_empty(name: str, before) -> bool:
    """Is the last statement of `before` that binds `name` `name = []`?"""
    for stmt in reversed(before):
        if not isinstance(stmt, cst.SimpleStatementLine):
            if _binds(stmt, name):
                return False
            continue
        for small in reversed(stmt.body):
            if isinstance(small, cst.Assign) and len(small.targets) == 1 \
                    and isinstance(small.targets[0].target, cst.Name) \
                    and small.targets[0].target.value == name:
                return isinstance(small.value, cst.List) and not small.value.elements
            if _binds(small, name):
                return False
    return False


def _binds(node: cst.CSTNode, name: str) -> bool:
    """Does `node` name `name` anywhere (a binding the simple test above cannot read)?"""
    uses = _Uses(name)
    scan(node, uses)
    return uses.count > 0
