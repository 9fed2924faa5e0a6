"""Device strings, shared by the device rules: can a variable hold one, the target's device
type in its place, and the import that makes that string valid."""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import dotted, with_string


def holds_a_device_string(ctx, expr: cst.BaseExpression) -> bool:
    """Can the variable `expr` reads (a name, an attribute, `str(device)`) hold a device
    string such as "cuda"? Decided by where its value goes, not by its name: not when it is a
    process group's backend, nor the name of an attribute (`getattr(torch, device)` reads
    `torch.cuda`)."""
    if isinstance(expr, cst.Call) and dotted(expr.func) == "str" and len(expr.args) == 1:
        expr = expr.args[0].value  # 'cuda' in str(device)
    if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
        return False  # `"cuda" == "cuda"` compares two constants
    values = ctx.values
    return not (values.uses_of(K.BACKEND, expr) or K.BACKEND in values.kinds(expr)
                or values.used_as_attribute_name(expr))


def device_string(ctx, expr: cst.BaseExpression) -> cst.BaseExpression:
    """The target's device type ('xla', 'tpu') in place of a CUDA device string."""
    if isinstance(expr, cst.SimpleString):
        return with_string(expr, ctx.device_type)
    return ctx.expr(f'"{ctx.device_type}"')


def need_device_module(ctx) -> None:
    """Device strings work once the target's module is imported (`torch_xla`, `torch_tpu`)."""
    ctx.need_import(ctx.device_module)
