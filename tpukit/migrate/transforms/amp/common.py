"""The autocast and float16 names the mixed-precision rules share."""

from __future__ import annotations

CUDA_AUTOCAST = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
DEVICE_AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}
FP16 = {"torch.float16", "torch.half"}
