"""tpukit: migrate PyTorch CUDA training code to TPUs and explain why it is slow there."""

__version__ = "0.1.0"
