"""`tpukit run --profile`: an XProf trace of chosen steps, cut at the probe's step boundaries.

torch_xla's profiler (`start_trace`/`stop_trace`) records host events (Python, tracing,
compilation, execution launches, transfers) and, on a TPU, the device ops. Each profiled step
is a root TraceMe named `train_step` with its step number (what `xp.StepTrace` makes, without
the extra sync StepTrace does on exit: the script's own sync ends the step), so xprof's
overview page breaks the trace down per step. The trace is stopped after the device finished
the last profiled step (`wait_device_ops`), and the export does not count in any step's time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from tpukit.run.steps import StepListener

DEFAULT_STEPS = 3


def parse_steps(text: str) -> tuple[int, int]:
    """"A:B" -> (A, B), 1-based and inclusive; "A" -> (A, A)."""
    first, sep, last = text.partition(":")
    try:
        a = int(first)
        b = int(last) if sep else a
    except ValueError:
        raise ValueError(f"--profile-steps takes A:B (step numbers from 1), not {text!r}") from None
    if a < 1 or b < a:
        raise ValueError(f"--profile-steps {text}: need 1 <= A <= B")
    return a, b


def default_logdir(now: datetime | None = None) -> Path:
    return Path("tpukit-profile") / (now or datetime.now()).strftime("%Y%m%d-%H%M%S")


@dataclass
class Profiler(StepListener):
    logdir: Path
    first: int
    last: int
    captured: list[int] = field(default_factory=list)
    error: str | None = None
    _tracing: bool = False
    _step_trace: object | None = None
    _step_index: int = 0

    def step_begins(self, index: int) -> None:
        if self.error or not self.first <= index <= self.last:
            return
        import torch_xla
        import torch_xla.debug.profiler as xp

        if not self._tracing:
            try:
                self.logdir.mkdir(parents=True, exist_ok=True)
                xp.start_trace(str(self.logdir))
            except (OSError, RuntimeError) as exc:  # another trace running, unwritable dir
                self.error = f"could not start the trace: {exc}"
                return
            self._tracing = True
        self._step_index = index
        self._step_trace = torch_xla._XLAC.profiler.TraceMe("train_step", _r=1, step_num=index)
        self._step_trace.__enter__()

    def step_ended(self, index: int, final: bool) -> None:
        if not self._tracing:
            return
        self._end_step_trace()
        self.captured.append(index)
        if index >= self.last or final:
            self._stop()

    def close(self) -> None:
        if self._tracing:  # the script ended (or failed) inside the window
            if self._step_trace is not None:  # the script's tail after its last step boundary
                self.captured.append(self._step_index)
            self._end_step_trace()
            self._stop()

    def _end_step_trace(self) -> None:
        if self._step_trace is not None:
            trace, self._step_trace = self._step_trace, None
            trace.__exit__(None, None, None)

    def _stop(self) -> None:
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.profiler as xp

        self._tracing = False
        try:
            xm.wait_device_ops()  # the last step's graphs finish inside the trace
            xp.stop_trace()
        except RuntimeError as exc:
            self.error = f"could not stop the trace: {exc}"

    def run_dir(self) -> Path | None:
        """The directory this capture wrote (plugins/profile/<timestamp>/), newest first."""
        runs = sorted((self.logdir / "plugins" / "profile").glob("*/*.xplane.pb"),
                      key=lambda p: p.stat().st_mtime)
        return runs[-1].parent if runs else None


def viewer_commands(logdir: Path) -> list[str]:
    """The commands that open the trace, for the tools this environment has."""
    from importlib.metadata import PackageNotFoundError, version

    commands = [f"tensorboard --logdir {logdir}"]
    try:
        major_minor = tuple(int(p) for p in version("xprof").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        major_minor = (0, 0)
    # xprof 2.24 made `xprof` a CLI with subcommands; the server is `xprof server`.
    commands.append(f"xprof server --logdir {logdir}" if major_minor >= (2, 24)
                    else f"xprof --logdir {logdir}")
    return commands


def summarise(profiler: Profiler, timeout: float = 180) -> dict:
    """The trace's summary (see xprof_summary.py), read in a subprocess: xprof's converter
    logs to stderr from C++, and a converter crash must not take the report with it."""
    summary: dict = {
        "logdir": str(profiler.logdir), "steps": profiler.captured,
        "window": [profiler.first, profiler.last], "run_dir": None, "xplane": [],
        "open_with": viewer_commands(profiler.logdir), "error": profiler.error,
    }
    run = profiler.run_dir()
    if run is None:
        if summary["error"] is None:
            summary["error"] = (f"no step of {profiler.first}:{profiler.last} ran: nothing was "
                                "traced (choose other steps with --profile-steps)")
        return summary
    summary["run_dir"] = str(run)
    summary["xplane"] = [str(p) for p in sorted(run.glob("*.xplane.pb"))]
    try:
        proc = subprocess.run([sys.executable, "-m", "tpukit.run.xprof_summary", str(run)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        summary["error"] = f"xprof's converter took more than {timeout:.0f} s"
        return summary
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        summary["error"] = f"xprof's converter failed: {last}"
        return summary
    summary.update(json.loads(proc.stdout))
    return summary
