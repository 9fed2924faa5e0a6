"""TPU403 data-parallel: `nn.DataParallel` is removed: one process per TPU device instead.

Its messages and tables: rules/TPU403-data-parallel.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind, Message, Severity
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.nodes import walk
from tpukit.migrate.transforms.base import StatementPlan, Transform, transform


DATA_PARALLEL_NAMES = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                       "torch.nn.parallel.data_parallel.DataParallel"}


@transform("TPU403")
class DataParallel(Transform):
    uses = frozenset({"values"})
    table_keys = frozenset({"keep_returned", "helper"})
    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self._decided: set[int] = set()  # wraps whose assignment statement visit_Assign decided

    def statement_triggers(self, source: str) -> set[str]:
        wrapped = self.ctx.values.names_of({K.DATA_PARALLEL})
        return super().statement_triggers(source) | ({".module"} if wrapped else set())

    def _message(self, node) -> Message:
        return self.say("wrapper", code=self.ctx.short(node))

    def _returned(self, wrap: cst.Call, target: cst.BaseExpression | None) -> bool:
        """Does the enclosing function return the wrapped model (`return DataParallel(net)`,
        or `net = DataParallel(net)` ... `return net`)? Its callers, in this file or another,
        may read `.module` through what the dataflow cannot follow (pix2pix's
        `getattr(self, 'net' + name).module`): where the target keeps the wrapper
        (`keep_returned`: torch_xla, where `nn.DataParallel` without CUDA calls the model as it
        is and keeps `.module` and the "module." checkpoint keys) it stays."""
        if not self.mapping.get("keep_returned") or not self.ctx.functions:
            return False
        function = self.ctx.functions[-1]
        for node in walk(function.body):
            if not isinstance(node, cst.Return) or node.value is None:
                continue
            if node.value is wrap:
                return True
            if (isinstance(target, cst.Name) and isinstance(node.value, cst.Name)
                    and node.value.value == target.value):
                return True
        return False

    def _unresolved_read(self) -> tuple[str, str] | None:
        """A `.module` read, in this file or another of the program, of a value the dataflow
        knows nothing of (pix2pix's `getattr(self, "net" + name).module` in base_model.py,
        reaching a model wrapped in networks.py): where the target keeps the wrapper
        (`keep_returned`) it stays, or that read would fail (AttributeError)."""
        def find():
            own = self.ctx.values.unresolved_module_reads()
            if own:
                return own[0], ""
            elsewhere = self.ctx.values.module_reads_elsewhere
            if elsewhere:
                module, code = elsewhere[0]
                return code, module
            return None
        return self.ctx.memo("data_parallel_unresolved_read", find)

    def _keep(self, node: cst.Call, read: tuple[str, str] | None = None) -> None:
        code = self.ctx.short(node)
        if read is None:
            message = self.say("returned", code=code)
        elif read[1]:
            message = self.say("module_read_elsewhere", code=code, read=read[0], module=read[1])
        else:
            message = self.say("module_read", code=code, read=read[0])
        self.ctx.report(self.rule, node, message,
                        applied=False, fix=FixKind.NONE, severity=Severity.INFO)

    def _kept(self, wrap: cst.Call, target) -> bool:
        if self._returned(wrap, target):
            self._keep(wrap)
            return True
        read = self._unresolved_read() if self.mapping.get("keep_returned") else None
        if read is not None:
            self._keep(wrap, read)
            return True
        return False

    def _holding(self) -> bool:
        """Does this file's wrapper become the holder (and keep its `.module` reads)? Library
        code keeps its own guarded removal."""
        return bool(self.mapping.get("helper") and not self.ctx.library_code
                    and self._unresolved_read() is not None)

    def _held(self, original: cst.Call, updated: cst.Call):
        """Where the target removes the wrapper (TorchTPU: with a TPU, DataParallel would
        scatter over the chips with CUDA's copies) but the program reads `.module` of a model
        the dataflow cannot follow: a holder that keeps `.module` and calls the model as it is
        (DataParallel with no device), so that read still finds the model."""
        if not self._holding():
            return None
        helper = self.mapping.get("helper")
        code, module = self._unresolved_read()
        shown = self.ctx.short(original)
        message = (self.say("held_elsewhere", code=shown, read=code, module=module) if module
                   else self.say("held", code=shown, read=code))

        def build():
            self.ctx.helpers_needed.add(helper)
            return cst.Call(func=cst.Name(helper), args=[updated.args[0].with_changes(
                comma=cst.MaybeSentinel.DEFAULT)])
        return self.fix_or_report(original, message, build)

    def visit_Assign(self, node: cst.Assign):
        value = node.value
        if not (isinstance(value, cst.Call) and self.ctx.qualify(value.func) in DATA_PARALLEL_NAMES
                and value.args and len(node.targets) == 1):
            return None
        target = node.targets[0].target
        if self.ctx.code(target) != self.ctx.code(value.args[0].value):
            return None  # `dp = DataParallel(model)`: the call itself is rewritten below
        self._decided.add(id(value))
        if self._kept(value, target):
            return None
        if self._holding():
            self._decided.discard(id(value))  # leave_Call puts the holder in its place
            return None
        text = self.ctx.short(node)
        return self.fix_or_report(value, self._message(value), lambda: StatementPlan(
            [], f'removed "{text}": one process per TPU device'))

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if (self.ctx.qualify(original.func) not in DATA_PARALLEL_NAMES or not original.args
                or id(original) in self._decided):
            return None
        assigned = self.ctx.assign_targets[-1] if self.ctx.assign_targets else []
        if self._kept(original, assigned[0] if len(assigned) == 1 else None):
            return None
        if self._holding():
            return self._held(original, updated)
        return self.fix_or_report(original, self._message(original), lambda: updated.args[0].value)

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        """`model.module` of a model that was wrapped in DataParallel is the model itself."""
        if original.attr.value != "module":
            return None
        # a model the dataflow says DataParallel wrapped (a method's own `model` parameter is
        # another variable than the one another method wrapped)
        if K.DATA_PARALLEL not in self.ctx.values.kinds(original.value):
            return None
        if self._holding():
            return None  # the holder keeps `.module`
        if not self.ctx.can_fix(self.rule):
            return None
        return updated.value
