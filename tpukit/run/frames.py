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
    return not str(Path(filename).resolve()).startswith(LIBRARY_ROOTS)


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
