"""The runtime layer's SyncBatchNorm (layer.py installs it with the torch.distributed patches)."""

from __future__ import annotations

import functools

import torch


def sync_batchnorm(layer, dist) -> None:
    """SyncBatchNorm's kernels are CUDA's (DDP refuses it on any other device: "SyncBatchNorm
    layers only work with GPU modules"). In one process it is BatchNorm: there the conversion
    leaves the module as it is. With more processes it is left to fail: each would normalize
    with its own batch's statistics, another training."""
    sync = torch.nn.SyncBatchNorm
    convert = sync.convert_sync_batchnorm  # a classmethod: bound to the class
    note, backend = layer.sites.note, layer.backend

    def convert_sync_batchnorm(module, process_group=None):
        first = next(module.parameters(), None)
        world = dist.get_world_size() if dist.is_initialized() else 1
        if first is not None and first.device.type == backend.device_type and world == 1:
            note("SyncBatchNorm.convert_sync_batchnorm", "left BatchNorm: SyncBatchNorm's "
                 "kernels are CUDA's, and in one process it computes what BatchNorm does")
            return module
        return convert(module, process_group)

    functools.update_wrapper(convert_sync_batchnorm, convert)
    layer.replace(sync, "convert_sync_batchnorm", staticmethod(convert_sync_batchnorm))
