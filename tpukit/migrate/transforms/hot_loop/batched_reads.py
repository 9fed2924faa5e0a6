"""Several numbers read back from the device in one statement of a loop or a function, read in
one transfer (TPU514).

`print("[D loss: %f] [G loss: %f]" % (d_loss.item(), g_loss.item()))` (PyTorch-GAN, pyGAT,
pytorch/examples' GAT and DCGAN log lines) reads each tensor on its own: every `.item()` runs
the graph that computes its tensor and waits for the device, one after another, each a transfer.
`_xla_read = _xla_items(d_loss, g_loss)` before the statement reads them all in one (one graph
run, one wait), and the statement uses `_xla_read[0]`, `_xla_read[1]`: the same Python numbers,
so nothing downstream can tell.

Decided by what the statement evaluates, not by what it is for: a statement that is one call
(`print(...)`, `logger.info(...)`, `writer.add_scalars(...)`) inside a loop or a function (what
runs more than once: pyGAT's `train(epoch)` is called once a step), with at least two
`x.item()` whose receivers are names or attribute chains of names (evaluated earlier, they give
the same tensors), none of them under a lambda, a comprehension, `a if c else b`, `and`/`or`
(evaluated only sometimes), and, before the last read, no call but `.format()` and the builtins
that only format or count (`str`, `format`, `len`, `int`, `float`, `round`, `abs`, `min`, `max`):
nothing evaluated before a read can change a tensor it sees (a call after the last read runs
after the reads either way: pyGAT's `time.time() - t`). Values that are
not XLA tensors (a numpy scalar) are read with their own `.item()`, in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from tpukit.migrate.nodes import ancestors, walk
from tpukit.migrate.transforms.base import Transform, transform

HELPER, NAME = "_xla_items", "_xla_read"  # helpers.py; the list the statement indexes
_PURE_BUILTINS = ("str", "format", "len", "int", "float", "round", "abs", "min", "max")
_SOMETIMES = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.IfExp,
              cst.BooleanOperation)
_REPEATED = (cst.For, cst.While, cst.FunctionDef)  # a class body or the module runs once


@dataclass
class _Line:
    reads: list[cst.Call]  # the `.item()` calls, in evaluation (source) order
    receivers: dict[int, cst.BaseExpression] = field(default_factory=dict)  # index -> updated
    applied: bool | None = None  # None until the first read is reported


def _chain(expr: cst.BaseExpression) -> bool:
    """A name or an attribute chain of names (`loss`, `out.data`)."""
    while isinstance(expr, cst.Attribute):
        expr = expr.value
    return isinstance(expr, cst.Name)


def _item(node: cst.CSTNode) -> bool:
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "item" and not node.args)


@transform("TPU514")
class BatchedReads(Transform):
    uses = frozenset({"values"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.lines: dict[int, _Line] = {}  # id() of a statement line -> its reads
        self.reads: dict[int, tuple[_Line, int]] = {}  # id() of a read -> (its line, index)
        self.clash = False

    def statement_triggers(self, source: str) -> set[str]:
        self.clash = re.search(rf"\b{NAME}\b", source) is not None  # the name is the user's
        return super().statement_triggers(source)

    # -- what a statement line evaluates ---------------------------------------------------
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if self.clash or len(node.body) != 1 or not isinstance(node.body[0], cst.Expr) \
                or not isinstance(node.body[0].value, cst.Call):
            return
        call = node.body[0].value
        reads = [n for n in walk(call) if _item(n)]
        if len(reads) < 2 or not all(_chain(r.func.value) for r in reads):
            return
        if not self._in_loop(node) or not self._only_pure_calls(call, reads):
            return
        parents = self.ctx.parents()
        if any(isinstance(n, _SOMETIMES) for r in reads for n in ancestors(r, parents, call)):
            return
        line = _Line(reads)
        self.lines[id(node)] = line
        for index, read in enumerate(reads):
            self.reads[id(read)] = (line, index)
            self.ctx.handled.add(id(read))  # TPU501 leaves these reads to this rule

    def _in_loop(self, node) -> bool:
        """In a loop, or in a function (pyGAT's `train(epoch)`, called once a step): what
        runs more than once. A statement of the module outside any loop runs once."""
        return any(isinstance(above, _REPEATED)
                   for above in ancestors(node, self.ctx.parents(), None))

    def _only_pure_calls(self, call: cst.Call, reads: list[cst.Call]) -> bool:
        """Before the last read (in evaluation order), no call but the reads, `.format()` and
        the formatting builtins; no walrus, `await` or `yield` anywhere: nothing evaluated
        before a read can change what it sees. A call after the last read (`time.time() - t`
        in pyGAT's line) runs after the reads either way."""
        ids = {id(r) for r in reads} | {id(call)}
        nodes = list(walk_args(call))  # preorder: the order Python evaluates them in
        last = max(i for i, n in enumerate(nodes) if id(n) in ids)
        for index, node in enumerate(nodes):
            if isinstance(node, (cst.NamedExpr, cst.Await, cst.Yield)):
                return False
            if not isinstance(node, cst.Call) or id(node) in ids or index > last:
                continue
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value == "format":
                continue
            if isinstance(func, cst.Name) and func.value in _PURE_BUILTINS \
                    and not self.ctx.values.bindings(func):
                continue
            return False
        return True

    # -- the rewrite ------------------------------------------------------------------------
    def leave_Call(self, original: cst.Call, updated: cst.Call):
        found = self.reads.get(id(original))
        if found is None:
            return None
        line, index = found
        if line.applied is None:
            first = self.fix_or_report(original, self.say(
                "reads", count=len(line.reads), code=self.ctx.short(original), helper=HELPER),
                lambda: True)
            line.applied = bool(first)
        if not line.applied:
            return None
        line.receivers[index] = updated.func.value
        return cst.Subscript(value=cst.Name(NAME), slice=[
            cst.SubscriptElement(cst.Index(cst.Integer(str(index))))])

    def leave_SimpleStatementLine(self, original, updated):
        line = self.lines.pop(id(original), None)
        if line is None or not line.applied or len(line.receivers) != len(line.reads):
            return None
        self.ctx.helpers_needed.add(HELPER)
        self.ctx.need_import("torch")
        self.ctx.need_import("torch_xla")
        read = cst.Assign(targets=[cst.AssignTarget(cst.Name(NAME))], value=cst.Call(
            func=cst.Name(HELPER), args=[cst.Arg(line.receivers[i]) for i in range(len(line.reads))]))
        return cst.FlattenSentinel([
            cst.SimpleStatementLine([read], leading_lines=updated.leading_lines),
            updated.with_changes(leading_lines=())])


def walk_args(call: cst.Call):
    """Every node of the call's function and arguments (the outer call itself left out)."""
    yield from walk(call.func)
    for arg in call.args:
        yield from walk(arg)
