"""TPU408 compile-backend: `torch.compile` lowers through torch_xla: `backend="openxla"`.

Its messages and tables: rules/TPU408-compile-backend.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import find_keyword, keyword_arg, string_value, with_commas
from tpukit.migrate.transforms.base import Transform, transform


COMPILE_MODES_WITHOUT_MEANING = {"reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}


@transform("TPU408")
class CompileBackend(Transform):
    uses = frozenset({"values"})
    table_keys = frozenset({"drop_modes"})
    def _compiles(self, call: cst.Call) -> bool:
        """`torch.compile(...)`, or `model.compile(...)` on an nn.Module (which hands its
        arguments to torch.compile)."""
        if self.ctx.qualify(call.func) == "torch.compile":
            return True
        return (isinstance(call.func, cst.Attribute) and call.func.attr.value == "compile"
                and K.MODULE in self.ctx.values.kinds(call.func.value))

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if not self._compiles(original):
            return None
        backend = find_keyword(original, "backend")
        if backend is not None and string_value(backend.value) == "openxla":
            return None
        mode = find_keyword(original, "mode")
        if self.mapping.get("drop_modes"):
            return self._drop_mode(original, updated, mode)
        if self.library_leaves(original, "compile", lambda: self.say(
                "library", code=self.ctx.short(original))):
            return None
        message = self.say("compile", code=self.ctx.short(original))
        if mode is not None:
            value = string_value(mode.value)
            why = (self.say("mode_cuda_only") if value in COMPILE_MODES_WITHOUT_MEANING
                   or value is None else self.say("mode_same"))
            message += self.say("mode_dropped", mode=self.ctx.code(mode.value), why=why)

        def build():
            args = [a for a in updated.args if not (a.keyword and a.keyword.value in ("backend", "mode"))]
            args.append(keyword_arg("backend", self.ctx.expr('"openxla"')))
            return updated.with_changes(args=with_commas(args))

        return self.fix_or_report(original, message, build)

    def _drop_mode(self, original: cst.Call, updated: cst.Call, mode: cst.Arg | None):
        """TorchTPU keeps torch.compile's PyTorch form; its backend rejects CUDA-only modes."""
        if mode is None or string_value(mode.value) not in COMPILE_MODES_WITHOUT_MEANING:
            return None
        return self.fix_or_report(
            original, self.say("mode", code=self.ctx.short(original),
                               mode=self.ctx.code(mode.value)),
            lambda: updated.with_changes(args=with_commas(
                [a for a in updated.args if not (a.keyword and a.keyword.value == "mode")])))

    def leave_Decorator(self, original: cst.Decorator, updated: cst.Decorator):
        if self.mapping.get("drop_modes"):
            return None  # a bare `@torch.compile` has no mode to drop
        if self.ctx.qualify(original.decorator) != "torch.compile":
            return None  # `@torch.compile(...)` is a call: leave_Call above
        if self.library_leaves(original.decorator, "decorator", lambda: self.say(
                "library", code=self.ctx.short(original.decorator))):
            return None
        return self.fix_or_report(
            original.decorator, self.say("decorator"),
            lambda: updated.with_changes(decorator=self.ctx.expr(
                f'{self.ctx.code(original.decorator)}(backend="openxla")')))
