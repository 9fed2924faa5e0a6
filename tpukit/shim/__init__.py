"""The runtime layer: CUDA calls in code `tpukit migrate` does not rewrite (installed
packages, a device that arrives from argv or a config file) land on the TPU.

`tpukit run` installs it by default (`--no-shim` turns it off). A plain run uses it with
`python -m tpukit.shim train.py ARGS`, or from code:

    import tpukit.shim
    layer = tpukit.shim.install()   # before the code that calls CUDA; layer.uninstall() undoes it

What it redirects, what it refuses and why: README "The runtime layer"; each redirect does at
run time what `tpukit migrate` writes for the same call (tpukit/shim/layer.py). It never
changes the host's answer to "is there CUDA": `torch.cuda.is_available()` stays what the host
says, so no library enters a CUDA-only kernel path (triton, flash-attn, bitsandbytes).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["Shim", "install"]


class Shim:
    """An installed layer and the call sites it acted on."""

    def __init__(self, program_roots: list[Path], to: str = "xla") -> None:
        from tpukit.shim.layer import BACKENDS, Layer
        from tpukit.shim.sites import CallSites

        roots = tuple(str(Path(r).resolve()).rstrip("/") + "/" for r in program_roots)
        self.sites = CallSites(roots)
        self.layer = Layer(self.sites, BACKENDS[to]())

    def install(self) -> "Shim":
        self.layer.install()
        return self

    def uninstall(self) -> None:
        self.layer.uninstall()

    def records(self):
        return self.sites.records()


def install(program: str | Path | None = None, to: str = "xla") -> Shim:
    """Installs the layer over torch; `program`: the folder (or a file in it) of the code the
    user runs (default: the current directory); calls made there are named as the program's.
    `to`: "xla" (the TPU, XLA:CPU without one), or "cpu" (an original CUDA script run as the
    reference on a host without CUDA)."""
    root = Path(program) if program is not None else Path.cwd()
    if root.is_file():
        root = root.parent
    return Shim([root], to).install()
