"""TPU201 amp-autocast: CUDA fp16 autocast becomes `torch.autocast("xla", dtype=torch.bfloat16)`.

Its messages and tables: rules/TPU201-amp-autocast.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import find_keyword, keyword_arg, string_value, with_commas
from tpukit.migrate.transforms.amp.common import CUDA_AUTOCAST, DEVICE_AUTOCAST, FP16
from tpukit.migrate.transforms.base import Transform, transform


@transform("TPU201")
class Autocast(Transform):
    """`torch.cuda.amp.autocast(...)`, `torch.autocast("cuda", ...)`, `torch.amp.autocast(
    device_type="cuda", dtype=torch.float16)` -> `torch.autocast("xla", dtype=torch.bfloat16)`,
    as a `with` item, a decorator or a value held in a variable; `enabled=` is kept."""
    uses = frozenset({"values"})
    table_keys = frozenset({"device_type", "imports"})

    claims = frozenset(CUDA_AUTOCAST)

    def _is_fp16(self, expr: cst.BaseExpression | None) -> bool:
        return expr is not None and self.ctx.qualify(expr) in FP16

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        """`amp_dtype = torch.float16`, later `torch.autocast(..., dtype=amp_dtype)` (timm's
        train.py, through functools.partial): the dtype autocast computes in, bfloat16 on TPU."""
        if not self._is_fp16(original.value) or not any(
                self.ctx.values.uses_of(K.AUTOCAST_DTYPE, t.target) for t in original.targets):
            return None
        if self.ctx.owner_leaves("TPU201", "float16_dtype"):
            return None  # a library's choice for its CUDA path
        return self.fix_or_report(
            original.value, self.say("float16_held", code=self.ctx.short(original)),
            lambda: updated.with_changes(
                value=cst.parse_expression(f"{self.ctx.torch_name()}.bfloat16")))

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        name = self.ctx.qualify(original.func)
        if name in CUDA_AUTOCAST:
            enabled = find_keyword(updated, "enabled")
            if enabled is None and updated.args and updated.args[0].keyword is None:
                enabled = keyword_arg("enabled", updated.args[0].value)
            kept = [a for a in updated.args if a.keyword and a.keyword.value == "cache_enabled"]
            return self._rewrite(original, updated, [enabled, *kept])
        if name not in DEVICE_AUTOCAST:
            return None
        device = find_keyword(original, "device_type")
        positional = [a for a in original.args if a.keyword is None]
        device_expr = device.value if device else (positional[0].value if positional else None)
        dtype = find_keyword(original, "dtype")
        if device_expr is None:
            return None
        literal = string_value(device_expr)
        if literal == "cuda":
            # device and dtype are replaced; enabled=/cache_enabled= are kept.
            kept = [a for a in updated.args
                    if a.keyword and a.keyword.value not in ("device_type", "dtype")]
            return self._rewrite(original, updated, kept)
        if literal is None and self._is_fp16(dtype.value if dtype else None):
            if self.ctx.owner_leaves("TPU201", "float16_autocast"):
                # accelerate's mixed-precision context: `state.device.type`, the CPU of a
                # MULTI_CPU run, whose fp16 autocast would have become bfloat16 there
                self.ctx.report(self.rule, original, self.say(
                    "float16_library", code=self.ctx.short(original)),
                    applied=False, fix=FixKind.NONE)
                return None
            # device_type held in a variable (already 'xla' after TPU101/TPU104): fix the dtype.
            return self.fix_or_report(
                original, self.say("float16", code=self.ctx.short(original)),
                lambda: updated.with_changes(args=[
                    a.with_changes(value=cst.parse_expression(f"{self.ctx.torch_name()}.bfloat16"))
                    if a.keyword and a.keyword.value == "dtype" else a
                    for a in updated.args
                ]),
            )
        return None

    def _rewrite(self, original: cst.Call, updated: cst.Call, kept: list):
        torch = self.ctx.torch_name()

        def build():
            for module in self.mapping.get("imports", ()):  # the module that registers the device
                self.ctx.need_import(module)
            args = [cst.Arg(cst.parse_expression(f'"{self.mapping["device_type"]}"')),
                    keyword_arg("dtype", cst.parse_expression(f"{torch}.bfloat16"))]
            args += [a for a in kept if a is not None]
            return updated.with_changes(
                func=cst.parse_expression(f"{torch}.autocast"), args=with_commas(args)
            )

        return self.fix_or_report(original, self.say("autocast", code=self.ctx.short(original)),
                                  build)
