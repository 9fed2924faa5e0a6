"""`tpukit run`: run a script in-process on XLA and explain its recompiles, fallbacks and syncs."""
