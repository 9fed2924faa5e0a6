"""Which frames are the user's own code (not torch, torch_xla, the standard library or tpukit):
where a finding points."""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.add(str(Path(__file__).resolve().parents[1]))  # tpukit itself
    return tuple(sorted(str(Path(r).resolve()) + "/" for r in roots))


LIBRARY_ROOTS = _library_roots()


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    path = Path(filename).resolve()
    return not str(path).startswith(LIBRARY_ROOTS) and not _installed(path)


def _installed(path: Path) -> bool:
    """`path` belongs to an installed distribution outside the interpreter's own paths: it
    lies under a `site-packages` or `dist-packages` folder (a user site, another venv), or a
    pip `*.dist-info` RECORD in a folder above it lists the top-level name it lies under
    (`pip install --target DEPS` on PYTHONPATH: torchvision's `save_image` there was named as
    the script's own line). A script beside such a folder stays the user's."""
    parts = path.parts
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    return any(parts[i] in _recorded(Path(*parts[:i])) for i in range(1, len(parts)))


@functools.lru_cache(maxsize=1024)
def _recorded(folder: Path) -> frozenset[str]:
    """The top-level names (packages, modules) the pip RECORDs in `folder` install."""
    names: set[str] = set()
    try:
        records = [e / "RECORD" for e in folder.iterdir()
                   if e.name.endswith(".dist-info") and e.is_dir()]
    except OSError:
        return frozenset()
    for record in records:
        try:
            text = record.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            first = line.split(",", 1)[0].split("/", 1)[0]
            if first and first != ".." and not first.endswith(".dist-info"):
                names.add(first)
    return frozenset(names)


def user_frame(frame) -> tuple[str, int] | None:
    """The innermost frame of the user's own code (not torch, torch_xla, stdlib or tpukit)."""
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


_MODULE_CALLS = ("forward", "__call__", "_call_impl", "_wrapped_call_impl")


def module_caller(frame) -> tuple[str, int, str] | None:
    """Where the innermost user frame is a module's `forward` (an op that fell back inside a
    model): (path, line, the forward's qualified name) of the user line outside every forward
    that called it (the training loop's `model(x)`), else None."""
    inner = None
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            if code.co_name in _MODULE_CALLS:
                inner = inner or getattr(code, "co_qualname", code.co_name)
            elif inner is not None:
                return code.co_filename, frame.f_lineno, inner
            else:
                return None
        frame = frame.f_back
    return None


def user_function(fn) -> tuple[str, str, int] | None:
    """(name, path, line) of a function or callable object defined in the user's code."""
    code = getattr(fn, "__code__", None) or getattr(getattr(type(fn), "__call__", None),
                                                    "__code__", None)
    if code is None or not is_user_file(code.co_filename):
        return None
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return name, code.co_filename, code.co_firstlineno
