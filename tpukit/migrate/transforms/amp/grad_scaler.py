"""TPU203 grad-scaler: GradScaler is removed: bf16 needs no loss scaling.

Its messages and tables: rules/TPU203-grad-scaler.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import with_commas
from tpukit.migrate.nodes import find_keyword, first, scan
from tpukit.migrate.transforms.amp.common import CUDA_AUTOCAST, DEVICE_AUTOCAST, FP16
from tpukit.migrate.transforms.base import StatementPlan, Transform, transform


GRAD_SCALERS = {
    "torch.cuda.amp.GradScaler",
    "torch.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
}


SCALER_METHODS = ("scale", "step", "update", "unscale_", "state_dict", "load_state_dict",
                  "get_scale", "is_enabled")


def _scaler_variables(ctx) -> tuple[set, set]:
    """The variables (values.symbol) a GradScaler is assigned to, and those of them assigned
    under an `if` whose test reads torch.float16 (an fp16 chosen elsewhere)."""
    finder = _ScalerAssignments(ctx)
    scan(ctx.module, finder)
    return finder.symbols, finder.fp16_only


class _ScalerAssignments(cst.CSTVisitor):
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.tests: list[cst.BaseExpression] = []  # the tests of the enclosing ifs
        self.symbols: set = set()
        self.fp16_only: set = set()

    def visit_If(self, node: cst.If) -> None:
        self.tests.append(node.test)

    def leave_If(self, node: cst.If) -> None:
        self.tests.pop()

    def _assigned(self, value, targets) -> None:
        values = self.ctx.values
        if not (isinstance(value, cst.Call) and values.qualified(value.func) in GRAD_SCALERS):
            return
        under_fp16 = any(first(test, lambda n: isinstance(n, (cst.Name, cst.Attribute))
                               and values.qualified(n) in FP16) for test in self.tests)
        for target in targets:
            symbol = self.ctx.values.symbol(target)
            if symbol is not None:
                self.symbols.add(symbol)
                if under_fp16:
                    self.fp16_only.add(symbol)

    def visit_Assign(self, node: cst.Assign) -> None:
        self._assigned(node.value, [t.target for t in node.targets])

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._assigned(node.value, [node.target])


class _SymbolUses(cst.CSTVisitor):
    """Counts the reads of one variable other than `v.<scaler method>(...)` and the
    assignments that bind it (a docstring or comment that names it is no read)."""

    def __init__(self, values, symbol) -> None:
        self.values = values
        self.symbol = symbol
        self.other = 0

    def _is_it(self, expr) -> bool:
        return self.values.symbol(expr) == self.symbol

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if self._is_it(node):  # `self.scaler`
            self.other += 1
            return False
        if node.attr.value in SCALER_METHODS and self._is_it(node.value):
            return False  # `scaler.step(...)`: a method of the scaler
        scan(node.value, self)  # the attribute's own name is no variable
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if self._is_it(node):
            self.other += 1

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return not (isinstance(node.target, (cst.Name, cst.Attribute)) and self._is_it(node.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> bool:
        if isinstance(node.target, (cst.Name, cst.Attribute)) and self._is_it(node.target):
            if node.value is not None:
                scan(node.value, self)
            return False
        return True

    def visit_Arg(self, node: cst.Arg) -> bool:
        scan(node.value, self)  # a keyword's name is no variable
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        if node.default is not None:
            scan(node.default, self)
        return False

    def visit_ImportAlias(self, node) -> bool:
        return False


class _PresenceTests(cst.CSTVisitor):
    """The first test by which a program asks whether a scaler exists: `scaler is None`,
    `scaler is not None`, `scaler == None`, `if scaler:`, `not scaler`, `bool(scaler)`, or a
    scaler as an operand of `and`/`or`. (DINO: `autocast(enabled=fp16_scaler is not None)`.)"""

    def __init__(self, transform) -> None:
        self.transform = transform
        self.test: str | None = None  # its code

    def _tested(self, expr, shown=None) -> None:
        if self.test is None and self.transform._is_scaler(expr):
            self.test = self.transform.ctx.short(shown if shown is not None else expr)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        left = node.left
        for target in node.comparisons:
            right = target.comparator
            if isinstance(target.operator, (cst.Is, cst.IsNot, cst.Equal, cst.NotEqual)):
                for a, b in ((left, right), (right, left)):
                    if isinstance(b, cst.Name) and b.value == "None":
                        self._tested(a, node)
            left = right

    def visit_If(self, node: cst.If) -> None:
        self._tested(node.test)

    def visit_While(self, node: cst.While) -> None:
        self._tested(node.test)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._tested(node.test)

    def visit_UnaryOperation(self, node: cst.UnaryOperation) -> None:
        if isinstance(node.operator, cst.Not):
            self._tested(node.expression, node)

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        self._tested(node.left)
        self._tested(node.right)

    def visit_Call(self, node: cst.Call) -> None:
        if (len(node.args) == 1 and node.args[0].keyword is None
                and self.transform.ctx.qualify(node.func) == "builtins.bool"):
            self._tested(node.args[0].value, node)


def _disabled(call: cst.Call) -> bool:
    """`GradScaler(enabled=False)`: a scaler that scales nothing (what the port writes where
    the program tests for one): nothing to remove."""
    enabled = find_keyword(call, "enabled")
    return enabled is not None and isinstance(enabled.value, cst.Name) and enabled.value.value == "False"


def _enters_autocast(ctx) -> bool:
    """Does this file enter an autocast (torch.autocast, torch.cuda.amp.autocast, ...)?"""
    return bool(first(ctx.module, lambda n: isinstance(n, cst.Call) and ctx.qualify(n.func)
                      in CUDA_AUTOCAST | DEVICE_AUTOCAST))


@transform("TPU203")
class GradScaler(Transform):
    """GradScaler removed: scale(loss) -> loss, step(opt) -> opt.step(), update()/unscale_()
    removed, its state_dict left out of checkpoints, whatever the scaler is called."""
    uses = frozenset({"values"})

    claims = frozenset(GRAD_SCALERS)

    @property
    def symbols(self) -> set:
        """The variables a GradScaler is assigned to (by dataflow: a name's scope, a `self`
        attribute's class), found on first need (a walk of the whole module)."""
        return self.ctx.memo("scaler_variables", lambda: _scaler_variables(self.ctx))[0]

    @property
    def fp16_only(self) -> set:
        """... and those of them assigned under a test that reads torch.float16."""
        return self.ctx.memo("scaler_variables", lambda: _scaler_variables(self.ctx))[1]

    def statement_triggers(self, source: str) -> set[str]:
        # the variables that hold a scaler, whatever they are called (`self.amp.update()`)
        return super().statement_triggers(source) | self.ctx.values.names_of({K.SCALER})

    def fix_or_report(self, node, message, build, fix=None):
        # lightning's MixedPrecision plugin: its scaler serves the fp16 autocast of the device
        # the library picks (CUDA, or the CPU of a TPU host), which stays fp16: without the
        # scaler that training ran unscaled (gradients underflow)
        if self.library_leaves(node, "scaler", lambda: message + self.say("library")):
            return None
        return super().fix_or_report(node, message, build, fix)

    def _kept(self, symbol) -> bool:
        # The scaler goes with an fp16 autocast that TPU201 makes bf16. One made only for an
        # fp16 chosen elsewhere (deepspeed's ZeRO: `if get_autocast_dtype() == torch.float16:
        # self.scaler = GradScaler(...)`, in a file that enters no autocast) serves an fp16
        # that stays fp16: it stays too.
        return symbol in self.fp16_only and not self.ctx.memo(
            "enters_autocast", lambda: _enters_autocast(self.ctx))

    def _is_scaler(self, expr: cst.BaseExpression) -> bool:
        symbol = self.ctx.values.symbol(expr)
        if symbol is not None and symbol in self.symbols:
            return not self._kept(symbol)
        # a scaler given to a function (`def train(model, scaler)`, called with one)
        return self.ctx.values.is_kind(expr, K.SCALER) and not any(
            self._kept(s) for s in self.symbols)

    def _method(self, call: cst.BaseExpression) -> str | None:
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
            if call.func.attr.value in SCALER_METHODS and self._is_scaler(call.func.value):
                return call.func.attr.value
        return None

    def _used_beyond_methods(self, symbol) -> bool:
        """Is the scaler's variable read other than as the receiver of its methods (passed
        to a function, returned, tested)?"""
        uses = _SymbolUses(self.ctx.values, symbol)
        scan(self.ctx.module, uses)
        return uses.other > 0

    def _presence_tested(self) -> str | None:
        """The first test by which the program asks whether its scaler exists, if any."""
        def find():
            tests = _PresenceTests(self)
            scan(self.ctx.module, tests)
            return tests.test
        return self.ctx.memo("scaler_presence_tested", find)

    def _constructor(self, node, targets):
        value = node.value
        if not (isinstance(value, cst.Call) and self.ctx.qualify(value.func) in GRAD_SCALERS):
            return None
        if _disabled(value):
            return None
        symbols = [self.ctx.values.symbol(t) for t in targets]
        text = self.ctx.short(node)
        if any(self._kept(s) for s in symbols):
            self.ctx.report(self.rule, node, self.say("scaler_unpaired", code=text),
                            applied=False, fix=FixKind.NONE)
            return None
        if any(self._used_beyond_methods(s) for s in symbols if s is not None):
            tested = self._presence_tested()
            if tested is not None:
                # The program asks whether a scaler exists (`autocast(enabled=scaler is not
                # None)`): None would answer "no" where the original said "yes" (autocast off,
                # fp32, silently). A disabled scaler is there and scales nothing.
                return self.fix_or_report(
                    node, self.say("scaler_disabled", code=text, test=tested),
                    lambda: StatementPlan([node.with_changes(
                        value=self.ctx.expr("torch.amp.GradScaler(enabled=False)"))]),
                )
            # Still passed around (`train(model, scaler)`): keep the name, as None.
            return self.fix_or_report(
                node, self.say("scaler_none", code=text),
                lambda: StatementPlan([node.with_changes(value=cst.Name("None"))]),
            )
        return self.fix_or_report(
            node, self.say("scaler_removed", code=text),
            lambda: StatementPlan([], f'removed "{text}": bf16 needs no loss scaling'),
        )

    def visit_Assign(self, node: cst.Assign):
        return self._constructor(node, [t.target for t in node.targets])

    def visit_AnnAssign(self, node: cst.AnnAssign):
        return self._constructor(node, [node.target]) if node.value is not None else None

    def visit_Expr(self, node: cst.Expr):
        method = self._method(node.value)
        if method in ("update", "unscale_", "load_state_dict"):
            text = self.ctx.short(node.value)
            why = {
                "update": self.say("why_update"),
                "unscale_": self.say("why_unscale"),
                "load_state_dict": self.say("why_load_state_dict"),
            }[method]
            return self.fix_or_report(
                node.value, self.say("method_removed", code=text, why=why),
                lambda: StatementPlan([], f'removed "{text}": {why} (bf16)'),
            )
        return None

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        method = self._method(original)
        if method == "scale" and updated.args:
            return self.fix_or_report(
                original, self.say("scale", code=self.ctx.short(original)),
                lambda: updated.args[0].value,
            )
        if method == "step" and updated.args:
            optimizer = updated.args[0].value
            # scaler.step(opt, *args, **kwargs) passes the rest to opt.step: kept.
            rest = with_commas(list(updated.args[1:]))
            return self.fix_or_report(
                original, self.say("step", code=self.ctx.short(original)),
                lambda: cst.Call(func=cst.Attribute(value=optimizer, attr=cst.Name("step")),
                                 args=rest),
            )
        if method == "get_scale":
            return self.fix_or_report(original, self.say("get_scale", code=self.ctx.short(original)),
                                      lambda: cst.Float("1.0"))
        return None

    def leave_Dict(self, original: cst.Dict, updated: cst.Dict):
        # {"model": ..., "scaler": scaler.state_dict()}: the checkpoint keeps everything else.
        drop = [i for i, e in enumerate(original.elements)
                if isinstance(e, cst.DictElement) and self._method(e.value) == "state_dict"]
        if not drop:
            return None
        def build():
            kept = [e for i, e in enumerate(updated.elements) if i not in drop]
            if kept and drop[-1] == len(original.elements) - 1:
                # The new last element takes the old last one's comma (and its layout).
                kept[-1] = kept[-1].with_changes(comma=updated.elements[-1].comma)
            return updated.with_changes(elements=kept)

        return self.fix_or_report(
            original.elements[drop[0]],
            self.say("state_dict", code=self.ctx.short(original.elements[drop[0]])), build)
