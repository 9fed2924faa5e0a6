"""Checkpoints: state dicts are saved with xm.save (to CPU, on the master only); loads map
CUDA storage to the CPU."""
