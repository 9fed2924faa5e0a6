"""The probe's changes to torch and torch_xla, each a small unit that installs itself onto a
probe and uninstalls itself, leaving torch as it found it.

A patch calls back into the probe it was installed on (its step accounting, its shape capture),
never the other way round: the probe only lists them (see `all_patches`)."""

from __future__ import annotations

from tpukit.run.patches.base import Patch
from tpukit.run.patches.boundaries import LoaderPatch, OptimizerStepPatch, SpawnPatch, SyncPatch
from tpukit.run.patches.host_reads import HostReadPatch
from tpukit.run.patches.inputs import AttentionPatch, BatchPatch, ForwardHooks
from tpukit.run.patches.training import BackwardPatch, OptimizerPatch

__all__ = ["Patch", "all_patches"]


def all_patches() -> list[Patch]:
    """Every patch the probe installs, in the order it installs them."""
    return [SyncPatch(), OptimizerStepPatch(), LoaderPatch(), BatchPatch(), HostReadPatch(),
            SpawnPatch(), BackwardPatch(), OptimizerPatch(), AttentionPatch(), ForwardHooks()]
