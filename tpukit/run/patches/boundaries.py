"""The step boundaries: `torch_xla.sync` (which `xm.mark_step()` calls), `xm.optimizer_step`,
MpDeviceLoader's iteration; and the launches (`torch_xla.launch`, `xmp.spawn`), run in this
process at world size 1 so that the probe sees their steps."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from tpukit.run.frames import user_frame
from tpukit.run.patches.base import Patch


class SyncPatch(Patch):
    """A step ends at every outermost `torch_xla.sync()`."""

    def install(self, probe) -> None:
        import torch_xla
        import torch_xla.torch_xla as core

        sync = self._wrap(probe, torch_xla.sync)
        self.replace(torch_xla, "sync", sync)
        self.replace(core, "sync", sync)

    @staticmethod
    def _wrap(probe, original: Callable) -> Callable:
        in_boundary = False

        @functools.wraps(original)
        def sync(*args, **kwargs):
            nonlocal in_boundary
            if in_boundary:
                return original(*args, **kwargs)
            in_boundary = True
            where = user_frame(sys._getframe(1))
            graphs = probe.graph_capture
            if graphs is not None:  # the graph this barrier runs, if new (graph_capture.py)
                capture = graphs.before_sync(sys._getframe(1), where)
            compiled = probe.counters.compile_ns()
            probe.activity.begin("graph barrier", where,
                                 graphs.new_graph if graphs is not None and capture else None)
            try:
                result = original(*args, **kwargs)
            finally:
                probe.activity.end()
                in_boundary = False
            spent = probe.counters.compile_ns() != compiled
            if graphs is not None:
                graphs.after(capture, spent)
            probe.optimizer_pending = False
            if spent:
                probe.compiled("graph barrier", where)  # (a storm stops the run here)
            probe.close_step(probe.boundary_label or "torch_xla.sync", where)
            return result

        return sync


class OptimizerStepPatch(Patch):
    """`xm.optimizer_step` labels the sync it makes; a script that never syncs between two of
    them gets its steps cut there."""

    def install(self, probe) -> None:
        import torch_xla.core.xla_model as xm

        original = xm.optimizer_step

        @functools.wraps(original)
        def optimizer_step(*args, **kwargs):
            where = user_frame(sys._getframe(1))
            if probe.optimizer_pending:  # two optimizer steps and no sync between them
                probe.cut_at_optimizer = True
            outer, probe.boundary_label = probe.boundary_label, "xm.optimizer_step"
            try:
                result = original(*args, **kwargs)
            finally:
                probe.boundary_label = outer
            probe.optimizer_pending = True
            if probe.cut_at_optimizer:
                probe.close_step("xm.optimizer_step", where)
            return result

        self.replace(xm, "optimizer_step", optimizer_step)


class LoaderPatch(Patch):
    """MpDeviceLoader's `next` labels the sync it makes and records the batch it yields."""

    def install(self, probe) -> None:
        import torch_xla.distributed.parallel_loader as pl

        original = pl.PerDeviceLoader.next
        capture = probe.capture

        @functools.wraps(original)
        def next_batch(loader):
            outer, probe.boundary_label = probe.boundary_label, "MpDeviceLoader"
            try:
                batch = original(loader)
            finally:
                probe.boundary_label = outer
            capture.record_batch(batch, user_frame(sys._getframe(1)))
            return batch

        self.replace(pl.PerDeviceLoader, "next", next_batch)


class SpawnPatch(Patch):
    """`torch_xla.launch` and `xmp.spawn` end in `pjrt.spawn`: run its function here, once."""

    def install(self, probe) -> None:
        from torch_xla._internal import pjrt

        original = pjrt.spawn

        @functools.wraps(original)
        def spawn(fn, nprocs=None, start_method="spawn", args=()):
            where = user_frame(sys._getframe(1))
            path, line = where or ("<unknown>", 0)
            probe.launches.append({"path": path, "line": line, "requested": nprocs,
                                   "processes": 1})
            print(f"tpukit: {path}:{line}: the launch runs its function in this process at world "
                  "size 1, so tpukit sees its steps (on a TPU the script alone starts one process "
                  "per device)", file=sys.stderr, flush=True)
            return original(fn, 1, start_method, args)

        self.replace(pjrt, "spawn", spawn)
