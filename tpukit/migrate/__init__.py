"""`tpukit migrate`: the libcst rewriter that ports CUDA training code to TPU."""
