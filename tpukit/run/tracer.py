"""Finds the user line of each CPU fallback: torch_xla counts `aten::` fallbacks but does not
say who called them. Armed for one step at a time by the probe (see probe.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from torch.overrides import TorchFunctionMode

from tpukit.run.counters import XlaCounters
from tpukit.run.frames import module_caller, user_frame


class FallbackTracer(TorchFunctionMode):
    """`record(ops, (path, line), caller)` for each torch call at a user line that ran
    fallbacks; `caller`: (path, line, forward) of the loop line that called the module whose
    forward that line is, or None."""

    def __init__(self, counters: XlaCounters,
                 record: Callable[[list[str], tuple[str, int], tuple | None], None]) -> None:
        super().__init__()
        self.counters = counters
        self.record = record

    def __torch_function__(self, func, types, args=(), kwargs=None):
        before = self.counters.fallback_counts()
        result = func(*args, **(kwargs or {}))
        after = self.counters.fallback_counts()
        if after != before:
            ops = [op for op, n in after.items() if n != before.get(op, 0)]
            frame = sys._getframe(1)
            where = user_frame(frame)
            if where is not None:
                self.record(ops, where, module_caller(frame))
        return result
