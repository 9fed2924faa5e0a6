"""What makes a TPU step slow, reported at the line: host syncs in the training loop,
data-dependent shapes, batches padded to their own length, and head dims the matrix units
do not fit."""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.transforms.host_values import host_bound
from tpukit.findings import FixKind

from tpukit.migrate.context import dotted, integer_value, terminal_name
from tpukit.migrate.transforms.base import Transform, transform
from tpukit.migrate.transforms.loops import HOST_READS, find_steps, loader_in_iter

TENSORISH = ("loss", "acc", "correct", "pred", "logit", "output", "out", "norm", "score")
LOGGERS = ("print", "info", "debug", "warning", "log")


# A flag's name (`use_accel`, `is_accum_step`, `has_loss`): a Python bool, whatever its words.
FLAG_PREFIXES = ("use_", "is_", "has_", "no_", "do_", "should_", "enable_", "with_")


def _tensorish(expr: cst.BaseExpression) -> bool:
    name = terminal_name(expr).lower()
    if isinstance(expr, cst.Subscript):
        name = terminal_name(expr.value).lower()
    if name.startswith(FLAG_PREFIXES) or name.endswith(("_enabled", "_flag")):
        return False
    return any(word in name for word in TENSORISH)


@transform("TPU501")
class HostSyncInLoop(Transform):
    """Inside a training step, `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `float(t)`,
    `int(t)`, `print(t)` and `if t:` each wait for the device and copy to the host."""

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.depth = 0
        self.loops: list[bool] = []

    def _training(self, node) -> bool:
        if isinstance(node, cst.For) and loader_in_iter(self.ctx, node.iter):
            return True
        return bool(find_steps(self.ctx, node).step_lines)

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
            if not self.ctx.qualify(func.value):
                self._report(original, self.say("copies"))
        elif isinstance(func, cst.Name) and func.value in ("float", "int") and len(original.args) == 1:
            if _tensorish(original.args[0].value):
                self._report(original, self.say("reads"))
        elif isinstance(func, cst.Name) and func.value == "print":
            if any(isinstance(a.value, (cst.Name, cst.Attribute)) and _tensorish(a.value) for a in original.args):
                self._report(original, self.say("prints"))
        return None

    def leave_If(self, original: cst.If, updated: cst.If):
        if self.depth and isinstance(original.test, (cst.Name, cst.Attribute)) and _tensorish(original.test):
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
        names = [n for n in (target.value, mask.left) if isinstance(n, cst.Name)]
        if any(host_bound(self.ctx, n.value) for n in names):
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
        boolean = isinstance(index, cst.Comparison) or (
            isinstance(index, (cst.Name, cst.Attribute)) and "mask" in terminal_name(index).lower())
        if boolean:
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
        self.functions: list[str] = []
        self.loops = 0

    def visit_For(self, node):
        self.loops += 1

    def leave_For(self, original, updated):
        self.loops -= 1
        return None

    def visit_While(self, node):
        self.loops += 1

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
        if grown and parts and isinstance(parts[0].value, cst.Name) and parts[0].value.value in grown:
            name = parts[0].value.value
            self.ctx.report(self.rule, original,
                            self.say("grows", code=self.ctx.short(original), name=name),
                            applied=False)
        return None

    def visit_FunctionDef(self, node):
        self.functions.append(node.name.value)

    def leave_FunctionDef(self, original, updated):
        self.functions.pop()
        return None

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        name = self.ctx.qualify(original.func) or dotted(original.func) or ""
        padding = name.endswith("pad_sequence") or name.endswith("DataCollatorWithPadding")
        if padding and (name.endswith("DataCollatorWithPadding") or any("collate" in f for f in self.functions)):
            self.ctx.report(self.rule, original, self.say("padding", code=self.ctx.short(original)),
                            applied=False)
        return None


@transform("TPU504")
class HeadDim(Transform):
    """Attention head dims that do not fill the TPU's matrix units (128 wide on v5e and older,
    256 on v6e)."""

    NAMES = ("head_dim", "head_size", "d_head", "dim_head", "d_k")

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.constants: dict[str, int] = {}

    def _remember(self, target, value) -> None:
        number = integer_value(value)
        if number is not None:
            self.constants[terminal_name(target)] = number

    def visit_Assign(self, node: cst.Assign):
        for t in node.targets:
            self._remember(t.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign):
        if node.value is not None:
            self._remember(node.target, node.value)

    def visit_Param(self, node: cst.Param):
        if node.default is not None:
            self._remember(node.name, node.default)

    def _value(self, expr) -> int | None:
        number = integer_value(expr)
        return number if number is not None else self.constants.get(terminal_name(expr))

    def _advise(self, node, head_dim: int) -> None:
        if head_dim % 128 == 0 or head_dim <= 0:
            return
        padded = -(-head_dim // 128) * 128
        self.ctx.report(self.rule, node, self.say("head_dim", head_dim=head_dim, padded=padded),
                        applied=False, head_dim=head_dim)

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        names = [terminal_name(t.target) for t in original.targets]
        number = integer_value(original.value)
        if any(n in self.NAMES for n in names) and number is not None:
            self._advise(original.value, number)
        return None

    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated):
        if not isinstance(original.operator, (cst.FloorDivide, cst.Divide)):
            return None
        left, right = terminal_name(original.left), terminal_name(original.right)
        if not (("embd" in left or "hidden" in left or "d_model" in left or left == "dim")
                and "head" in right):
            return None
        a, b = self._value(original.left), self._value(original.right)
        if a and b and a % b == 0:
            self._advise(original, a // b)
        return None
