"""Finds the user line of each CPU fallback: torch_xla counts `aten::` fallbacks but does not
say who called them. Armed for one step at a time by the probe (see probe.py)."""

from __future__ import annotations

import sys

from torch.overrides import TorchFunctionMode

from tpukit.run.probe import user_frame


class FallbackTracer(TorchFunctionMode):
    def __init__(self, probe) -> None:
        super().__init__()
        self.probe = probe

    def __torch_function__(self, func, types, args=(), kwargs=None):
        before = self.probe._fallback_counts()
        result = func(*args, **(kwargs or {}))
        after = self.probe._fallback_counts()
        if after != before:
            ops = [op for op, n in after.items() if n != before.get(op, 0)]
            where = user_frame(sys._getframe(1))
            if where is not None:
                self.probe.record_fallback(ops, where)
        return result
