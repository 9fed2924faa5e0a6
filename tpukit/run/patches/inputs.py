"""What a step receives: the DataLoader's batches, the outermost module's forward inputs (and
the attention modules under it), `scaled_dot_product_attention`'s calls. Recorded by the
probe's ShapeCapture (capture.py)."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable

from tpukit.run.frames import user_frame, user_function
from tpukit.run.patches.base import Patch


class BatchPatch(Patch):
    def install(self, probe) -> None:
        from torch.utils.data import dataloader

        original = dataloader._BaseDataLoaderIter.__next__
        capture, main = probe.capture, threading.main_thread()

        @functools.wraps(original)
        def next_batch(iterator):
            batch = original(iterator)
            if threading.current_thread() is main:  # MpDeviceLoader's workers are not
                capture.record_batch(batch, user_frame(sys._getframe(1)))
                probe.current.collate = user_function(getattr(iterator, "_collate_fn", None))
            return batch

        self.replace(dataloader._BaseDataLoaderIter, "__next__", next_batch)


class ForwardHooks(Patch):
    """Global forward hooks: every module's forward, the outermost one's inputs."""

    def install(self, probe) -> None:
        import torch.nn.modules.module as module_hooks

        capture = probe.capture
        self.hook(module_hooks.register_module_forward_pre_hook(capture.forward_pre))
        self.hook(module_hooks.register_module_forward_hook(capture.forward_post,
                                                            always_call=True))


class AttentionPatch(Patch):
    def install(self, probe) -> None:
        import torch.nn.functional as F

        self.replace(F, "scaled_dot_product_attention",
                     _wrap_attention(probe.capture, F.scaled_dot_product_attention))


def _wrap_attention(capture, original: Callable) -> Callable:
    @functools.wraps(original)
    def scaled_dot_product_attention(query, *args, **kwargs):
        module = capture.modules[-1] if capture.modules else None
        capture.attention.called(query, module, user_frame(sys._getframe(1)))
        return original(query, *args, **kwargs)

    return scaled_dot_product_attention
