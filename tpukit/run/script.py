"""Run a script or module as `__main__`, exactly like `python SCRIPT ARGS` / `python -m MOD`."""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path

_OUR_FILES = (str(Path(runpy.__file__).resolve()), str(Path(__file__).resolve().parents[1]) + "/")


@dataclass
class Outcome:
    exit_code: int
    kind: str  # "ok" | "exit" | "error" | "interrupted" | "terminated" | "max-steps"
    error: str = ""  # the exception's last line, for the report
    # the script's own exception (kind "error"), for the findings that explain it (crash.py)
    exception: BaseException | None = field(default=None, repr=False, compare=False)


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, a CI job's limit, a preempted TPU VM), raised in the script like
    Ctrl-C's KeyboardInterrupt, so its own `except KeyboardInterrupt` and `finally` blocks run
    and the report is still written."""


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While the script runs, SIGTERM raises Terminated in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _ours(filename: str) -> bool:
    resolved = str(Path(filename).resolve()) if not filename.startswith("<") else filename
    return resolved == _OUR_FILES[0] or resolved.startswith(_OUR_FILES[1]) or "<frozen runpy>" in filename


def _strip(te: traceback.TracebackException, seen: set[int]) -> None:
    if id(te) in seen:
        return
    seen.add(id(te))
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if not _ours(f.filename)])
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _strip(chained, seen)


def print_script_traceback(exc: BaseException, stream=None) -> None:
    """The traceback python would print, without tpukit's and runpy's frames."""
    te = traceback.TracebackException.from_exception(exc)
    _strip(te, set())
    stream = stream or sys.stderr
    stream.write("".join(te.format()))
    stream.flush()


def exit_code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_target(script: str | None, module: str | None, args: list[str], stop_types: tuple) -> Outcome:
    """Runs the target with sys.argv, sys.path[0] and __file__ as python sets them."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    # sys.path[0] is the script's folder (the cwd for -m), not tpukit's console script's.
    first = os.getcwd() if module else str(Path(script).resolve().parent)
    if sys.path:
        sys.path[0] = first
    else:
        sys.path.append(first)
    try:
        with sigterm_as_interrupt():
            if module:
                sys.argv = [module, *args]  # runpy replaces argv[0] with the module's path
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                sys.argv = [script, *args]
                runpy.run_path(script, run_name="__main__")
        return Outcome(0, "ok")
    except SystemExit as exc:
        return Outcome(exit_code_of(exc), "exit")
    except Terminated:
        return Outcome(143, "terminated", "SIGTERM")  # 128 + 15, as a shell says it
    except KeyboardInterrupt:
        return Outcome(130, "interrupted", "KeyboardInterrupt")
    except stop_types as exc:  # tpukit's own stop: --max-steps, or a compile storm
        return Outcome(getattr(exc, "exit_code", 0), getattr(exc, "outcome", "max-steps"))
    except BaseException as exc:  # the script's own failure: print it as python would
        print_script_traceback(exc)
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return Outcome(1, "error", last, exc)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
