"""TPU504 head-dim: An attention head dim that does not fill the TPU's matrix units.

Its messages and tables: rules/TPU504-head-dim.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.transforms.base import Transform, transform


@transform("TPU504")
class HeadDim(Transform):
    """Attention head dims that do not fill the TPU's matrix units (128 wide on v5e and older,
    256 on v6e): the last dimension of the queries given to scaled_dot_product_attention,
    followed back through `.transpose()`/`.view()` to a constant."""
    uses = frozenset({"values"})

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
