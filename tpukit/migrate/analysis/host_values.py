"""Values on the host (NumPy arrays, Python lists and numbers): a rewrite into a torch tensor
method (`masked_fill_`, `index_select`) must not touch them.

`mm = np.zeros_like(ids); mm[ids == k] = 1` is NumPy (transformers' processors), and
`buff = buff.cpu().numpy(); buff[a:b]` slices an array (deepspeed's data analyzer): what the
dataflow says a variable holds (a NumPy call's result, `.numpy()`, `.tolist()`, `.item()`),
wherever it was bound, and whatever it is called.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K

HOST_KINDS = frozenset({K.NUMPY, K.NUMBER})


def host_value(ctx, expr: cst.BaseExpression) -> bool:
    """Whether `expr` holds a host value (and no tensor) by the file's dataflow."""
    kinds = ctx.values.kinds(expr)
    return bool(kinds & HOST_KINDS) and K.TENSOR not in kinds
