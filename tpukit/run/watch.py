"""A run that dies of a signal still says so: `tpukit run` forks before torch is imported, the
child runs the script, and the parent only waits. A child killed by a signal (SIGSEGV when
LLVM runs out of memory mappings, SIGABRT from a C++ check, SIGKILL from the OOM killer) can
write nothing itself; the parent then marks the last report the child wrote (--json, kept
current while the script runs: live.py) with the signal and what the run was doing, says it
on stderr, and exits as a shell would (128 + the signal's number).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def fork_watched(json_path: Path | None) -> None:
    """Return in the child, which goes on to run the script; the parent never returns."""
    if not hasattr(os, "fork") or os.environ.get("TPUKIT_RUN_WATCHED") or "torch" in sys.modules:
        return  # (forking after torch's import would copy its threads' locks half-held)
    sys.stdout.flush()
    sys.stderr.flush()
    watched = {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)  # (the child unblocks them at once)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _die_with(parent)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
        os.environ["TPUKIT_RUN_WATCHED"] = "1"
        import faulthandler

        if not faulthandler.is_enabled():
            faulthandler.enable()  # a fatal signal's Python traceback: where the run was
        return
    status = _wait(pid, watched)
    if os.WIFSIGNALED(status):
        code = 128 + os.WTERMSIG(status)
        print(f"tpukit: {died(json_path, signal.Signals(os.WTERMSIG(status)).name, code)}",
              file=sys.stderr, flush=True)
    else:
        code = os.WEXITSTATUS(status)
    os._exit(code)


def _die_with(parent: int) -> None:
    """The child dies with its parent (a SIGKILL to `tpukit run`, which nothing can forward):
    Linux's PR_SET_PDEATHSIG, else the script would go on running with nobody waiting."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # (the parent died before the prctl took hold)
        os._exit(128 + int(signal.SIGKILL))


def _wait(pid: int, watched: set) -> int:
    """The child's exit status. A SIGINT or SIGTERM sent to the parent alone (`kill PID`,
    `timeout`) is passed on to the child; one the terminal sent (Ctrl-C reaches the whole
    process group, the child too) is not sent twice."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        info = signal.sigtimedwait(watched, 1.0)
        if info is not None and info.si_signo != signal.SIGCHLD and info.si_code <= 0:
            os.kill(pid, info.si_signo)  # (si_code <= 0: sent by a process, not the kernel)


def died(json_path: Path | None, name: str, code: int) -> str:
    """Mark the child's last report (if any) as died of signal `name`; the words for stderr."""
    said = f"the script died of {name} (exit {code})"
    if json_path is None:
        return f"{said}; `--json PATH` keeps a report of the steps so far for such a death"
    try:
        report = json.loads(Path(json_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"{said} before it wrote a report to {json_path}"
    summary = report.get("summary", {})
    doing = summary.get("in_progress") or summary.get("stopped_in")
    summary.update(outcome="died", exit_code=code, signal=name,
                   died_in=doing, steps_recorded=summary.get("steps"))
    from tpukit.atomic import atomic_write
    from tpukit.run.summary import describe_activity, describe_mappings

    atomic_write(Path(json_path), json.dumps(report, indent=2) + "\n")
    what = f"; {describe_activity(doing)}" if doing else ""
    mappings = f"; {describe_mappings(summary['mappings'])}" if summary.get("mappings") else ""
    return (f"{said} after {summary.get('steps', 0)} step(s) recorded{what}{mappings}; "
            f"{json_path} says so")
