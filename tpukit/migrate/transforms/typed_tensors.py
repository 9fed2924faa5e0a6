"""Legacy CUDA typed tensors: `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`,
then `Tensor(n, 1).fill_(1.0)`, `Tensor(np_array)` and `imgs.type(Tensor)`, as hundreds of
public GAN scripts write them. Each needs a CUDA driver: the port crashed at the first
`.type(Tensor)`. The type becomes a small class inserted after the imports, `_XlaTensorType(
dtype)`, which constructs tensors of that dtype on the device as the legacy type did; a
`.type(T)` cast becomes `.to(device, dtype)`.
"""

from __future__ import annotations

import re

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.context import string_value
from tpukit.migrate.nodes import scan
from tpukit.migrate.transforms.base import Transform, transform

DTYPES = {
    "FloatTensor": "float32", "DoubleTensor": "float64", "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16", "ByteTensor": "uint8", "CharTensor": "int8",
    "ShortTensor": "int16", "IntTensor": "int32", "LongTensor": "int64", "BoolTensor": "bool",
}
TYPED = {f"torch.cuda.{name}": dtype for name, dtype in DTYPES.items()}
HOST_TYPED = {f"torch.{name}": dtype for name, dtype in DTYPES.items()}
# A typed tensor is reached by its name, written where it is imported or used: a file
# without one calls none (a sound prefilter; what decides is the name a value resolves to).
_TYPED_NAMES = re.compile(r"\b(?:%s)\b" % "|".join(DTYPES))


def _dtype(ctx, expr: cst.BaseExpression, qualify=None) -> str | None:
    """The dtype of a typed tensor: `torch.cuda.FloatTensor`, or `torch.cuda.FloatTensor if
    cuda else torch.FloatTensor` (either way round, the same dtype), or the string
    'torch.cuda.FloatTensor'. `qualify`: how names resolve (the traversal's by default)."""
    qualify = qualify or ctx.qualify
    if isinstance(expr, cst.IfExp):
        sides = [_dtype(ctx, expr.body, qualify), _dtype(ctx, expr.orelse, qualify)]
        host = [HOST_TYPED.get(qualify(e)) for e in (expr.body, expr.orelse)]
        cuda = [d for d in sides if d]
        if len(cuda) == 1 and (cuda[0] in host or sides == [cuda[0], cuda[0]]):
            return cuda[0]
        return None
    name = qualify(expr)
    if name in TYPED:
        return TYPED[name]
    text = string_value(expr)
    return TYPED.get(text) if text else None


def aliases(ctx) -> dict[str, str]:
    """Module-level names bound to a CUDA typed tensor (name -> dtype), read before the
    traversal: a function defined above the assignment may use the name."""
    def compute() -> dict[str, str]:
        found: dict[str, str] = {}
        if not _TYPED_NAMES.search(ctx.source):
            return found
        for stmt in _module_statements(ctx.module.body):
            for small in stmt.body:
                if (isinstance(small, cst.Assign) and len(small.targets) == 1
                        and isinstance(small.targets[0].target, cst.Name)):
                    dtype = _dtype(ctx, small.value, ctx.values.qualified)
                    if dtype:
                        found[small.targets[0].target.value] = dtype
        return found

    return ctx.memo("typed_tensor_aliases", compute)


def _module_statements(body):
    """Simple statements at module level, and in its `if`/`try` blocks (not in functions)."""
    for stmt in body:
        if isinstance(stmt, cst.SimpleStatementLine):
            yield stmt
        elif isinstance(stmt, (cst.If, cst.Try)):
            blocks = [stmt.body]
            orelse = getattr(stmt, "orelse", None)
            while orelse is not None:
                blocks.append(orelse.body)
                orelse = getattr(orelse, "orelse", None)
            for handler in getattr(stmt, "handlers", ()):
                blocks.append(handler.body)
            for block in blocks:
                if isinstance(block, cst.IndentedBlock):
                    yield from _module_statements(block.body)


@transform("TPU121")
class TypedTensor(Transform):
    uses = frozenset({"device_facts", "values"})
    table_keys = frozenset({"helper"})
    claims = frozenset(TYPED)

    def statement_triggers(self, source: str) -> set[str]:
        return super().statement_triggers(source) | set(aliases(self.ctx))

    def _helper(self) -> str:
        return self.mapping["helper"]

    def _type_of(self, dtype: str) -> str:
        return f"{self._helper()}(torch.{dtype})"

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        if not (len(original.targets) == 1 and isinstance(original.targets[0].target, cst.Name)):
            return None
        if self.ctx.functions:  # a local alias: the same rewrite, scoped to its function
            dtype = _dtype(self.ctx, original.value)
        else:
            dtype = aliases(self.ctx).get(original.targets[0].target.value)
            if dtype is None or _dtype(self.ctx, original.value) != dtype:
                return None
        if dtype is None:
            return None
        new = self._type_of(dtype)
        self._local_aliases.add(original.targets[0].target.value)

        def build():
            self.ctx.helpers_needed.add(self._helper())
            return updated.with_changes(value=self.ctx.expr(new))

        return self.fix_or_report(
            original.value,
            self.say("alias", code=self.ctx.short(original.value), new=new,
                     note=self.mapping["note"]), build)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        func = original.func
        name = self.ctx.qualify(func)
        if name in TYPED:  # torch.cuda.FloatTensor(1), in a logging helper
            new = self._type_of(TYPED[name])

            def build():
                self.ctx.helpers_needed.add(self._helper())
                return updated.with_changes(func=self.ctx.expr(new))

            return self.fix_or_report(
                original,
                self.say("constructor", code=self.ctx.short(original), new=new,
                         note=self.mapping["note"]), build)
        if not (isinstance(func, cst.Attribute) and func.attr.value == "type"
                and len(original.args) == 1 and original.args[0].keyword is None):
            return None
        arg = original.args[0].value
        dtype = _dtype(self.ctx, arg)
        if dtype is not None:  # x.type(torch.cuda.FloatTensor) / x.type('torch.cuda.FloatTensor')
            device = self.ctx.code(self.ctx.device_expr())
            target = f"{device}, torch.{dtype}"
        elif isinstance(arg, cst.Name) and (arg.value in self._local_aliases or (
                arg.value in aliases(self.ctx)
                and not any(arg.value in self.ctx._local_names(f) for f in self.ctx.functions))):
            target = f"{arg.value}.device, {arg.value}.dtype"
        else:
            return None
        new_args = self.ctx.expr(f"f({target})").args

        def build():
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")),
                                        args=new_args)

        return self.fix_or_report(
            original, self.say("cast", code=self.ctx.short(original), target=target), build)

    # Top-down, the uses this rule rewrites claim the type's name inside them; any other use
    # (`isinstance(x, torch.cuda.FloatTensor)`) is a finding, reported on the way up.
    def _own(self, node: cst.CSTNode) -> None:
        class Names(cst.CSTVisitor):
            def __init__(self, owned) -> None:
                self.owned = owned

            def visit_Attribute(self, attr) -> None:
                self.owned.add(id(attr))

        scan(node, Names(self._owned))

    def visit_Assign(self, node: cst.Assign):
        if _dtype(self.ctx, node.value):
            self._own(node.value)
        return None

    def visit_Call(self, node: cst.Call):
        if self.ctx.qualify(node.func) in TYPED:
            self._own(node.func)
        elif (isinstance(node.func, cst.Attribute) and node.func.attr.value == "type"
              and len(node.args) == 1 and _dtype(self.ctx, node.args[0].value)):
            self._own(node.args[0].value)
        return None

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        if self.ctx.in_import or id(original) in self._owned:
            return None
        name = self.ctx.qualify(original)
        if name in TYPED:
            self.ctx.report(self.rule, original,
                            self.say("type", code=self.ctx.short(original), dtype=TYPED[name]),
                            False, fix=FixKind.NONE)
        return None

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self._owned: set[int] = set()
        self._local_aliases: set[str] = set()  # aliases assigned in a function, rewritten above
