"""Compile storms that no barrier or host read of the probe's sees.

`Probe.compiled` stops a storm where a barrier or host read compiles (steps.CompileStorm), in
the main thread, with the line. Graphs also compile where no such hook runs: a CPU fallback
copies its inputs to the host, a library runs a graph of its own (minGPT's sampler, a sequence
one token longer each time, compiled a graph per token at mingpt/model.py:299). Those compiles
went on until XLA:CPU passed the kernel's limit on memory mappings and died of SIGSEGV. So the
activity watcher (activity.py, a thread that runs while the main thread is inside XLA) asks
this watch about once a second: where the current step has compiled `storm_graphs` graphs
that the hooks did not see, or the process nears the mapping limit, it records the storm at
the user's line the main thread is running and raises CompileStorm in the main thread, which
Python delivers as soon as the call it is in returns.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import TYPE_CHECKING

from tpukit.run.frames import user_frame
from tpukit.run.steps import CompileStorm

if TYPE_CHECKING:
    from tpukit.run.probe import Probe


def raise_in_main_thread(exc_type: type[BaseException]) -> None:
    """Have the main thread raise `exc_type` at its next Python instruction."""
    ident = threading.main_thread().ident
    if ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc_type))


class StormWatch:
    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.lock = threading.Lock()
        self.armed = True
        # the step the base count is for, and XLA's compile count when it began (for a later
        # step: when this watch first saw it)
        self.step = probe.current.index
        self.base = probe.counters.snapshot().compiles if probe.counters is not None else 0

    def disarm(self) -> None:
        """The script has ended: no stop from now on."""
        with self.lock:
            self.armed = False

    def __call__(self) -> None:
        """From the watcher thread."""
        probe = self.probe
        with self.lock:
            if not self.armed or probe.storm is not None or not probe.storm_graphs \
                    or probe.counters is None:
                return
            compiles = probe.counters.snapshot().compiles
            step = probe.current.index
            if step != self.step:
                self.step, self.base = step, compiles
                return
            graphs = compiles - self.base
            hooked = sum(probe.compiling.values())  # those Probe.compiled counts and stops
            near = probe.activity.mappings
            if near is None and (graphs < probe.storm_graphs or hooked >= probe.storm_graphs // 2):
                return
            frame = sys._current_frames().get(threading.main_thread().ident)
            path, line = (user_frame(frame) if frame is not None else None) or ("", 0)
            probe.storm = {"step": step, "graphs": graphs, "call": "operation", "path": path,
                           "line": line, "at_line": None, "limit": probe.storm_graphs,
                           "mappings": near}
            raise_in_main_thread(CompileStorm)
