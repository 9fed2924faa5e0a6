"""TPU301 device-loader: A DataLoader that a loop iterates is wrapped in `MpDeviceLoader`;
pin_memory is dropped.

Its messages and tables: rules/TPU301-device-loader.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.bindings import Assigned, Iterated
from tpukit.migrate.analysis.steps import (DATALOADERS, ITER_WRAPPERS, is_device_loader, is_loader,
                                           loader_in_iter)
from tpukit.migrate.context import dotted
from tpukit.migrate.context import find_keyword
from tpukit.migrate.guards import scope_moves_to_cuda
from tpukit.migrate.nodes import scan
from tpukit.migrate.transforms.base import Transform, transform


def _yields(body: cst.BaseSuite) -> bool:
    """Does the loop body hand its items on (`yield`), outside nested functions?"""
    finder = _YieldFinder()
    scan(body, finder)
    return finder.found


class _YieldFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found = False

    def visit_Yield(self, node: cst.Yield) -> None:
        self.found = True

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def _replace_innermost(expr, depth: int, replacement):
    if depth == 0:
        return replacement
    first = expr.args[0]
    inner = _replace_innermost(first.value, depth - 1, replacement)
    return expr.with_changes(args=[first.with_changes(value=inner), *expr.args[1:]])


@transform("TPU301")
class DeviceLoader(Transform):
    """A DataLoader that a loop iterates is wrapped in MpDeviceLoader; pin_memory dropped."""
    uses = frozenset({"bindings", "device_facts", "steps", "values"})


    def statement_triggers(self, source: str) -> set[str]:
        # a loop over a loader holds the loader's name, whatever the rule's own words
        return super().statement_triggers(source) | self.ctx.values.names_of({K.LOADER})

    def _wrapper_chain(self, expr) -> tuple[cst.BaseExpression, int] | None:
        """`tqdm(enumerate(loader))` -> (loader, 2): a host loader inside wrappers."""
        depth = 0
        while isinstance(expr, cst.Call) and dotted(expr.func) in ITER_WRAPPERS and expr.args:
            expr, depth = expr.args[0].value, depth + 1
        if depth and is_loader(self.ctx, expr) and not is_device_loader(expr) and not (
                self.ctx.values.kinds(expr) & {K.PREPARED, K.DEVICE_LOADER}):
            return expr, depth
        return None

    def _held_wrappers(self) -> dict[int, tuple[cst.BaseExpression, int]]:
        """id() of the wrapper calls (`pbar = tqdm(loader)`) whose variable a loop iterates:
        the loader goes inside the wrapper, which the loop body may still use
        (`pbar.set_description(...)`); wrapping the variable would drain and close it first."""
        def compute():
            values, found = self.ctx.values, {}
            for scope in (values.module_scope, *values.scopes.values()):
                for bindings in scope.names.values():
                    for binding in bindings:
                        if not isinstance(binding, Iterated):
                            continue
                        expr = binding.iterable
                        while isinstance(expr, cst.Call) and dotted(expr.func) in ITER_WRAPPERS \
                                and expr.args:
                            expr = expr.args[0].value
                        held = values.bindings(expr) if isinstance(expr, cst.Name) else []
                        for bound in held:
                            chain = isinstance(bound, Assigned) and not bound.path and \
                                self._wrapper_chain(bound.value)
                            if chain:
                                found[id(bound.value)] = chain
            return found

        if self.ctx.library_code:
            return {}
        return self.ctx.memo("TPU301.held_wrappers", compute)

    def _iterates_held(self, loader: cst.BaseExpression) -> bool:
        """Does the loop iterate a variable holding a wrapper of a loader that is (or will
        be, leave_Call) a device loader inside it?"""
        held = self.ctx.values.bindings(loader) if isinstance(loader, cst.Name) else []
        wrappers = self._held_wrappers()

        def device_fed(value) -> bool:
            if id(value) in wrappers:
                return True
            depth = 0
            while isinstance(value, cst.Call) and dotted(value.func) in ITER_WRAPPERS \
                    and value.args:
                value, depth = value.args[0].value, depth + 1
            return depth > 0 and is_device_loader(value)

        return bool(held) and all(isinstance(b, Assigned) and not b.path
                                  and device_fed(b.value) for b in held)

    def leave_For(self, original: cst.For, updated: cst.For):
        found = loader_in_iter(self.ctx, original)
        if found is None:
            return None
        loader, path = found
        if self._iterates_held(loader):
            return None  # the loader inside its wrapper's call is wrapped (leave_Call)
        if is_device_loader(loader) or self.ctx.values.kinds(loader) & {K.PREPARED, K.DEVICE_LOADER}:
            return None  # its batches are on the device already
        if _yields(original.body):
            # lightning's _FabricDataLoader: `for item in self._dataloader: yield move(item)`
            # is a loader itself (here, the one for non-XLA strategies): the loop that
            # consumes its batches is where the device loader goes, not inside it.
            return None
        if self.ctx.library_hands_off():
            # mmengine's EpochBasedTrainLoop.run_epoch: the runner's model is on the device
            # mmengine picked (the CPU on a TPU host); the loader would start the runtime there
            self.ctx.report(self.rule, original.iter,
                            self.say("library", code=self.ctx.short(loader)),
                            applied=False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        if self.ctx.owner_leaves("TPU301", "own_device") and not scope_moves_to_cuda(self.ctx):
            # fairscale's pipe benchmark: `device = torch.device("cuda") if
            # torch.cuda.is_available() else torch.device("cpu")` stays (library code), so its
            # batches stay on the CPU of a TPU host: a device loader to that device would start
            # the XLA runtime for nothing
            self.ctx.report(self.rule, original.iter,
                            self.say("library_own_device", code=self.ctx.short(loader)),
                            applied=False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        device = self.ctx.device_expr()

        def build():
            wrapped = cst.Call(
                func=self.ctx.expr("pl.MpDeviceLoader"),
                args=[cst.Arg(loader, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                      cst.Arg(device)],
            )
            return updated.with_changes(iter=_replace_innermost(updated.iter, len(path), wrapped))

        return self.fix_or_report(original.iter, self.say("loader", code=self.ctx.short(loader)),
                                  build)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        held = self._held_wrappers().get(id(original))
        if held is not None:
            loader, depth = held
            device = self.ctx.device_expr()

            def build():
                inner = updated
                for _ in range(depth - 1):
                    inner = inner.args[0].value
                wrapped = cst.Call(func=self.ctx.expr("pl.MpDeviceLoader"), args=[
                    cst.Arg(inner.args[0].value,
                            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    cst.Arg(device)])
                return _replace_innermost(updated, depth, wrapped)

            return self.fix_or_report(loader, self.say("loader", code=self.ctx.short(loader)),
                                      build)
        name = self.ctx.qualify(original.func)
        if name in DATALOADERS:
            pin = find_keyword(original, "pin_memory")
            if pin is None:
                return None
            def build():
                args = [a for a, o in zip(updated.args, original.args) if o is not pin]
                if args and original.args[-1] is pin:
                    args[-1] = args[-1].with_changes(comma=updated.args[-1].comma)
                return updated.with_changes(args=args)
            return self.fix_or_report(pin, self.say("pin_memory_argument"), build)
        func = original.func
        if (isinstance(func, cst.Attribute) and func.attr.value == "pin_memory"
                and not original.args and not self.ctx.qualify(func.value)):
            return self.fix_or_report(
                original, self.say("pin_memory", code=self.ctx.short(original)),
                lambda: updated.func.value)
        return None
