"""`torch.inference_mode()` becomes `torch.no_grad()` on XLA: on a lazy XLA tensor the first op
under inference mode fails ("Cannot set version_counter for inference tensor"), so a run dies
at its first validation. `torch.no_grad()` is the XLA form, and it is what inference mode
narrows: no gradients are recorded either way."""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.transforms.base import Transform, transform

INFERENCE_MODE = {"torch.inference_mode", "torch.autograd.grad_mode.inference_mode"}


@transform("TPU122")
class InferenceMode(Transform):
    def _no_grad(self) -> cst.BaseExpression:
        return self.ctx.expr("torch.no_grad")

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) not in INFERENCE_MODE:
            return None
        args = original.args
        on = not args or (len(args) == 1 and isinstance(args[0].value, cst.Name)
                          and args[0].value.value == "True"
                          and (args[0].keyword is None or args[0].keyword.value == "mode"))
        code = self.ctx.short(original)
        if not on:  # inference_mode(False) / inference_mode(flag): not always a no_grad
            self.ctx.report(self.rule, original, self.say("flag", code=code), applied=False)
            return None
        return self.fix_or_report(
            original, self.say("call", code=code),
            lambda: updated.with_changes(func=self._no_grad(), args=()))

    def leave_Decorator(self, original: cst.Decorator, updated: cst.Decorator):
        # @torch.inference_mode, bare (torch 2 takes it as @torch.no_grad is taken)
        if self.ctx.qualify(original.decorator) not in INFERENCE_MODE:
            return None
        return self.fix_or_report(
            original.decorator, self.say("decorator", code=self.ctx.short(original.decorator)),
            lambda: updated.with_changes(decorator=self._no_grad()))
