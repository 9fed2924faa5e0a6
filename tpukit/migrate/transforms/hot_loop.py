"""What makes a TPU step slow, reported at the line: host syncs in the training loop,
data-dependent shapes, batches padded to their own length, and head dims the matrix units
do not fit."""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.transforms.host_values import host_value
from tpukit.findings import FixKind

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import dotted, terminal_name
from tpukit.migrate.nodes import walk
import tpukit.migrate.transforms.samplers as samplers
from tpukit.migrate.transforms.base import Transform, transform
from tpukit.migrate.transforms.loops import HOST_READS, find_steps, loader_in_iter

LOGGERS = ("print", "info", "debug", "warning", "log")


def _tensor(ctx, expr: cst.BaseExpression) -> bool:
    """Does `expr` hold a tensor, by where its value comes from (a model's output, a torch
    op) or what is done with it (`loss.backward()`)? A flag (`args.norm_adv`) does not."""
    return K.TENSOR in ctx.values.kinds(expr)


@transform("TPU501")
class HostSyncInLoop(Transform):
    """Inside a training step, `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `float(t)`,
    `int(t)`, `print(t)` and `if t:` each wait for the device and copy to the host."""

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.depth = 0
        self.loops: list[bool] = []

    def statement_triggers(self, source: str) -> set[str]:
        # a training loop: over a loader (whatever it is called), or stepping, or backward
        return super().statement_triggers(source) | self.ctx.values.names_of({K.LOADER}) | {
            ".backward(", ".step(", "optimizer_step("}

    def _training(self, node) -> bool:
        if isinstance(node, cst.For) and loader_in_iter(self.ctx, node):
            return True
        steps = find_steps(self.ctx, node)
        return bool(steps.step_lines) or steps.backward is not None

    def visit_For(self, node):
        training = self._training(node)
        self.loops.append(training)
        self.depth += training

    def visit_While(self, node):
        self.visit_For(node)

    def leave_For(self, original, updated):
        self.depth -= self.loops.pop()
        return None

    def leave_While(self, original, updated):
        return self.leave_For(original, updated)

    def _report(self, node, what: str) -> None:
        self.ctx.report(
            self.rule, node,
            self.say("sync", code=self.ctx.short(node), what=what),
            applied=False)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if not self.depth:
            return None
        func = original.func
        if isinstance(func, cst.Attribute) and func.attr.value in HOST_READS and not original.args:
            # `t.cpu().numpy()`: one read, reported at `t.cpu()` (what follows is on the host)
            inner = func.value
            if not (isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute)
                    and inner.func.attr.value in HOST_READS) and not self.ctx.qualify(inner):
                self._report(original, self.say("copies"))
        elif isinstance(func, cst.Name) and func.value in ("float", "int") and len(original.args) == 1:
            if _tensor(self.ctx, original.args[0].value):
                self._report(original, self.say("reads"))
        elif isinstance(func, cst.Name) and func.value == "print":
            if any(isinstance(a.value, (cst.Name, cst.Attribute)) and _tensor(self.ctx, a.value)
                   for a in original.args):
                self._report(original, self.say("prints"))
        return None

    def leave_If(self, original: cst.If, updated: cst.If):
        if self.depth and isinstance(original.test, (cst.Name, cst.Attribute)) \
                and _tensor(self.ctx, original.test):
            self._report(original.test, self.say("tests"))
        return None

    def leave_Expr(self, original: cst.Expr, updated: cst.Expr):
        # Unsafe fix for logging: print(...loss.item()...) -> xm.add_step_closure(lambda: print(...)).
        call = original.value
        if not (self.depth and self.ctx.unsafe_fixes and isinstance(call, cst.Call)):
            return None
        if "replace" not in self.mapping:
            return None  # a target without step closures (TorchTPU: eager)
        if terminal_name(call.func) not in LOGGERS or ".item()" not in self.ctx.code(call):
            return None
        closure = cst.Call(
            func=self.ctx.expr("xm.add_step_closure"),
            args=[cst.Arg(cst.Lambda(params=cst.Parameters(), body=updated.value))],
        )
        self.ctx.report(self.rule, original, self.say("closure", code=self.ctx.short(original)),
                        applied=True)
        return updated.with_changes(value=closure)


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


@transform("TPU503")
class DynamicPadding(Transform):
    """Batches padded to their own longest sequence get a new shape, so a new compilation,
    almost every step."""

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.loops = 0
        self.ported: dict[int, samplers.Sampler] = {}  # id(For) -> the sampler it ports
        self.lines: dict[int, tuple[str, samplers.Sampler]] = {}  # id(line) -> its part in it
        self.bounded: set[int] = set()  # id(Assign) of cats cropped right after (bounded_cats)

    def _samplers(self) -> dict[int, samplers.Sampler]:
        """The file's growing samplers (samplers.py), by id() of their loop: ported on XLA."""
        if self.ctx.target != "xla":
            return {}
        return self.ctx.memo("samplers", lambda: {
            id(node): found for node in walk(self.ctx.module) if isinstance(node, cst.For)
            and (found := samplers.growing_sampler(node, self.ctx.values.qualified))})

    def statement_triggers(self, source: str) -> set[str]:
        # the crop's line names no trigger word of its own: the sequence it crops does
        return super().statement_triggers(source) | {s.grown for s in self._samplers().values()}

    def _statement(self, code: str) -> cst.SimpleStatementLine:
        return cst.SimpleStatementLine([self.ctx.statement(code)])

    def visit_For(self, node):
        self.loops += 1
        self.bounded |= samplers.bounded_cats(node, self.ctx.qualify)
        sampler = self._samplers().get(id(node))
        if sampler is not None:
            self.ported[id(node)] = sampler
            if self.rule.maps(self.ctx.target) and self.ctx.can_fix(self.rule, FixKind.SAFE):
                self.lines[id(sampler.crop)] = ("crop", sampler)
                self.lines[id(sampler.cat)] = ("cat", sampler)

    def leave_SimpleStatementLine(self, original, updated):
        role, sampler = self.lines.pop(id(original), (None, None))
        if role == "cat":
            return samplers.cat_lines(original, sampler, self._statement)
        return None

    def _crop(self, original, updated):
        role, sampler = self.lines.pop(id(original), (None, None))
        return samplers.crop(updated, sampler) if role == "crop" else None

    def leave_IfExp(self, original, updated):
        return self._crop(original, updated)

    def leave_Subscript(self, original, updated):
        return self._crop(original, updated)

    def leave_For(self, original, updated):
        self.loops -= 1
        sampler = self.ported.pop(id(original), None)
        if sampler is None:
            return None
        message = self.say("sampler", code=self.ctx.short(sampler.cat), name=sampler.grown,
                           bound=self.ctx.short(sampler.bound))
        return self.fix_or_report(sampler.cat, message, lambda: samplers.around(
            updated, sampler, self._statement, self.ctx.qualify), fix=FixKind.SAFE)

    def visit_While(self, node):
        self.loops += 1
        self.bounded |= samplers.bounded_cats(node, self.ctx.qualify)

    def leave_While(self, original, updated):
        self.loops -= 1
        return None

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        # idx = torch.cat((idx, idx_next), dim=1) in a loop: a longer tensor every iteration
        value = original.value
        if not (self.loops and isinstance(value, cst.Call)
                and self.ctx.qualify(value.func) in ("torch.cat", "torch.concat", "torch.concatenate")
                and value.args and isinstance(value.args[0].value, (cst.Tuple, cst.List))):
            return None
        grown = {t.target.value for t in original.targets if isinstance(t.target, cst.Name)}
        parts = value.args[0].value.elements
        if any(original is s.cat.body[0] for s in self.ported.values()) \
                or id(original) in self.bounded:
            return None  # the sampler's port (leave_For) says it; a window that stops growing
        if grown and parts and isinstance(parts[0].value, cst.Name) and parts[0].value.value in grown:
            name = parts[0].value.value
            self.ctx.report(self.rule, original,
                            self.say("grows", code=self.ctx.short(original), name=name),
                            applied=False, fix=FixKind.NONE)
        return None

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        name = self.ctx.qualify(original.func) or dotted(original.func) or ""
        padding = name.endswith("pad_sequence") or name.endswith("DataCollatorWithPadding")
        # a DataLoader's collate_fn (given as one, whatever it is called) pads each batch
        collates = self.ctx.values.functions_given_as("collate_fn")
        if padding and (name.endswith("DataCollatorWithPadding")
                        or any(id(f) in collates for f in self.ctx.functions)):
            self.ctx.report(self.rule, original, self.say("padding", code=self.ctx.short(original)),
                            applied=False, fix=FixKind.NONE)
        return None


@transform("TPU504")
class HeadDim(Transform):
    """Attention head dims that do not fill the TPU's matrix units (128 wide on v5e and older,
    256 on v6e): the last dimension of the queries given to scaled_dot_product_attention,
    followed back through `.transpose()`/`.view()` to a constant."""

    ATTENTION = frozenset({"torch.nn.functional.scaled_dot_product_attention"})
    # Methods whose result keeps the input's last dimension (a transpose of dims 1 and 2).
    KEEPS_LAST = frozenset({"transpose", "contiguous", "permute", "to", "float", "half",
                            "bfloat16", "clone"})

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.values.qualified(original.func) not in self.ATTENTION or not original.args:
            return None
        head_dim = self._last_dim(original.args[0].value, 0)
        if head_dim is None or head_dim <= 0 or head_dim % 128 == 0:
            return None
        padded = -(-head_dim // 128) * 128
        self.ctx.report(self.rule, original, self.say("head_dim", head_dim=head_dim, padded=padded),
                        applied=False, head_dim=head_dim)
        return None

    def _last_dim(self, expr: cst.BaseExpression, depth: int) -> int | None:
        """The constant size of the last dimension of the tensor `expr`, where it is one."""
        if depth > 8:
            return None
        if isinstance(expr, cst.Name):
            values = [b.value for b in self.ctx.values.bindings(expr)
                      if getattr(b, "value", None) is not None and not getattr(b, "path", ())]
            found = {self._last_dim(v, depth + 1) for v in values}
            return found.pop() if len(found) == 1 else None
        if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
            return None
        method = expr.func.attr.value
        if method in ("view", "reshape") and expr.args and not any(a.star for a in expr.args):
            return self.ctx.values.constant(expr.args[-1].value)
        if method in self.KEEPS_LAST and not (method == "permute" or (
                method == "transpose" and any(self.ctx.values.constant(a.value) in (-1, 3)
                                              for a in expr.args))):
            return self._last_dim(expr.func.value, depth + 1)
        return None


