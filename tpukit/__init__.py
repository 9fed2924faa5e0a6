"""tpukit: migrate PyTorch CUDA training code to TPUs and explain why it is slow there."""

import random as _random

__version__ = "0.1.0"

# Python's global random state when tpukit's first module loaded (a sitecustomize's seed, the
# interpreter's own): `tpukit run` and `python -m tpukit.shim` give it back to the script, which
# must draw what `python SCRIPT` draws (rich, which tpukit imports, takes 24 bits at import).
RANDOM_STATE_AT_START = _random.getstate()
