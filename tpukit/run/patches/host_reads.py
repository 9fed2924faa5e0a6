"""The tensor methods that copy device data to the host (a sync that waits for the device),
recorded at the user line that called them, with their size and the time waited."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable

from tpukit.run.frames import user_frame
from tpukit.run.patches.base import Patch
from tpukit.run.steps import HostRead

# `__format__`: an f-string or str.format of a tensor (`f"{loss:.3f}"`, a meter's `{val:6.2f}`)
HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__",
              "__format__")
SCALAR_READS = ("item", "__bool__", "__int__", "__float__", "__index__")  # one element


class HostReadPatch(Patch):
    def install(self, probe) -> None:
        import torch

        reading = [False]  # inside a read already (`.cpu()` calling `.to()`): count it once
        for name in HOST_READS:
            if hasattr(torch.Tensor, name):
                self.replace(torch.Tensor, name,
                             _wrap_read(probe, reading, name, getattr(torch.Tensor, name)))
        self.replace(torch.Tensor, "to", _wrap_read(probe, reading, "to", torch.Tensor.to))


def _wrap_read(probe, reading: list, method: str, original: Callable) -> Callable:
    counters = probe.counters

    @functools.wraps(original)
    def read(tensor, *args, **kwargs):
        if (reading[0] or not getattr(tensor, "is_xla", False)
                or (method == "to" and not _to_host(args, kwargs))):
            return original(tensor, *args, **kwargs)
        reading[0] = True
        where = user_frame(sys._getframe(1))
        # the graph this read runs, if new (graph_capture.py)
        capture = probe.graph_capture.before_read(tensor, where) if probe.graph_capture else None
        began, compiled = time.perf_counter(), counters.compile_ns()
        probe.activity.begin("host read", where, probe.graph_capture.new_graph
                             if probe.graph_capture is not None and capture else None)
        try:
            return original(tensor, *args, **kwargs)
        finally:
            probe.activity.end()
            # the compiles the read triggered are reported as compiles, not as waiting
            spent = counters.compile_ns() - compiled
            waited = max(0.0, time.perf_counter() - began - spent / 1e9)
            reading[0] = False
            if probe.graph_capture is not None:
                probe.graph_capture.after(capture, spent != 0)
            if where is not None:
                nbytes = tensor.element_size() * (1 if method in SCALAR_READS
                                                  else tensor.numel())
                probe.current.reads.append(HostRead(method, where[0], where[1], nbytes, waited))
            if spent:
                probe.compiled("host read", where)  # (a storm stops the run here)

    return read


def _to_host(args: tuple, kwargs: dict) -> bool:
    device = kwargs.get("device", args[0] if args else None)
    if isinstance(device, str):
        return device.startswith("cpu")
    return getattr(device, "type", None) == "cpu"
