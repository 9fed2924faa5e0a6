"""The probe's changes to torch and torch_xla, each a small unit that installs itself onto a
probe and uninstalls itself, leaving torch as it found it.

A patch calls back into the probe it was installed on (its step accounting, its shape capture),
never the other way round: the probe only lists them (see `all_patches`)."""

from __future__ import annotations

from typing import Any

_INHERITED = object()


class Patch:
    """Monkeypatches and hook handles, undone in reverse by `uninstall`."""

    def __init__(self) -> None:
        self._originals: list[tuple[Any, str, Any]] = []
        self._handles: list[Any] = []

    def install(self, probe) -> None:
        raise NotImplementedError

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._originals):
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._originals.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def replace(self, owner: Any, name: str, replacement: Any) -> None:
        # _INHERITED: the attribute came from a base class (torch._C.TensorBase): delete ours.
        self._originals.append((owner, name, owner.__dict__.get(name, _INHERITED)))
        setattr(owner, name, replacement)

    def hook(self, handle: Any) -> None:
        self._handles.append(handle)


def all_patches() -> list[Patch]:
    """Every patch the probe installs, in the order it installs them."""
    from tpukit.run.patches.boundaries import (LoaderPatch, OptimizerStepPatch, SpawnPatch,
                                               SyncPatch)
    from tpukit.run.patches.host_reads import HostReadPatch
    from tpukit.run.patches.inputs import AttentionPatch, BatchPatch, ForwardHooks
    from tpukit.run.patches.training import BackwardPatch, OptimizerPatch

    return [SyncPatch(), OptimizerStepPatch(), LoaderPatch(), BatchPatch(), HostReadPatch(),
            SpawnPatch(), BackwardPatch(), OptimizerPatch(), AttentionPatch(), ForwardHooks()]
