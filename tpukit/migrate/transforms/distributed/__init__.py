"""Distributed training: process groups, DDP and DataParallel, launchers, torchrun ranks,
samplers, barriers, torch.compile, and the CUDA-only pieces that have a TPU alternative.

torch_xla runs one process per TPU device, like one process per GPU, so a DDP script keeps
its shape: the process group uses the "xla" backend (`init_method="xla://"` finds the peers
from the launcher's environment), ranks and world size come from `torch_xla.runtime`, and each
process's device is `torch_xla.device()`. The launcher must not touch the XLA runtime before
`torch_xla.launch` (it refuses to start once the runtime is initialised).
"""
