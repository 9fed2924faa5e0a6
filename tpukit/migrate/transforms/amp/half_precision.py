"""TPU202 half-precision: `.half()` and float16 casts become bfloat16 in a training script.

Its messages and tables: rules/TPU202-half-precision.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.transforms.amp.common import FP16
from tpukit.migrate.transforms.base import Transform, transform


@transform("TPU202")
class HalfPrecision(Transform):
    """`.half()` and float16 casts of models and inputs: bfloat16 on TPU. Applied in a training
    script (it calls `.backward()`), as fp16 AMP becomes bf16 autocast there; elsewhere (a
    library, an export script) a finding, applied with --unsafe-fixes: a float16 there may be
    the format of a file it writes."""

    def fix_or_report(self, node, message, build, fix=None):
        if self.ctx.package_module or ".backward(" not in self.ctx.source:
            if not (self.ctx.unsafe_fixes and not self.ctx.cuda_only):
                message += self.say("not_training")
            return super().fix_or_report(node, message, build, fix=FixKind.UNSAFE)
        return super().fix_or_report(node, message + self.say("training"), build)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        func = original.func
        if isinstance(func, cst.Attribute) and func.attr.value == "half" and not original.args:
            if self.ctx.qualify(func.value):
                return None
            return self.fix_or_report(
                original, self.say("half", code=self.ctx.short(original)),
                lambda: updated.with_changes(func=updated.func.with_changes(attr=cst.Name("bfloat16"))),
            )
        if isinstance(func, cst.Attribute) and func.attr.value in ("to", "type"):
            for i, (old, new) in enumerate(zip(original.args, updated.args)):
                if self.ctx.qualify(old.value) in FP16 and (old.keyword is None or old.keyword.value == "dtype"):
                    replacement = self.fix_or_report(
                        old.value, self.say("cast", code=self.ctx.short(original)),
                        lambda: cst.parse_expression(f"{self.ctx.torch_name()}.bfloat16"),
                    )
                    if replacement is None:
                        return None
                    args = list(updated.args)
                    args[i] = new.with_changes(value=replacement)
                    return updated.with_changes(args=args)
        return None
