"""`tpukit run`: set the environment, install the probe, run the script, report.

Text output goes to stderr so that the script's own stdout stays what `python SCRIPT` prints;
json/sarif/github go to stdout after the script (or to --output), and --json PATH writes the
JSON report to a file whatever --format says.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tpukit.findings import Finding, Location
from tpukit.render import Format, Report, render

DEBUG_ENV = ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE")


class UsageError(Exception):
    """Bad command line: exit 2 with one line."""


@dataclass
class RunRequest:
    script: str | None
    module: str | None = None
    args: list[str] = field(default_factory=list)
    max_steps: int | None = None
    warmup: int = 2
    fmt: Format = Format.TEXT
    json_path: Path | None = None
    output: Path | None = None
    fail_on: list[str] = field(default_factory=list)
    check_cuda: bool = True


def choose_device(env: dict) -> str | None:
    """Sets PJRT_DEVICE when the user did not; returns a notice for the user, if any."""
    if env.get("PJRT_DEVICE"):
        return None
    chips = glob("/dev/accel*") + glob("/dev/vfio/[0-9]*")
    if chips and importlib.util.find_spec("libtpu") is not None:
        env["PJRT_DEVICE"] = "TPU"
        return None
    env["PJRT_DEVICE"] = "CPU"
    return "tpukit: no TPU here: running on XLA:CPU (set PJRT_DEVICE to choose)"


def start_cuda_check(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tpukit.run.cuda_check", script],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def cuda_check_result(check: subprocess.Popen) -> list[dict]:
    try:
        out, _ = check.communicate(timeout=120)
        return json.loads(out) if check.returncode == 0 else []
    except (subprocess.TimeoutExpired, json.JSONDecodeError):
        check.kill()
        return []


def _cuda_finding(script: str, idioms: list[dict]) -> Finding:
    from tpukit.rules import load_rules

    rule = load_rules()["TPU704"]
    first = min(idioms, key=lambda f: (f["line"], f["col"]))
    codes = sorted({f["code"] for f in idioms})
    message = (f"{script} still has {len(idioms)} CUDA idiom(s) ({', '.join(codes)}; first at line "
               f"{first['line']}: {first['message'].split('.')[0]}): run `tpukit migrate {script}` "
               "first")
    return Finding("TPU704", rule.severity, message, Location(script, first["line"], first["col"]),
                   name=rule.name)


def _debug_log_path(env: dict) -> tuple[Path, bool]:
    """(file, ours): the PT_XLA_DEBUG_FILE to read; a temporary one unless the user set it."""
    if env.get("PT_XLA_DEBUG_FILE"):
        return Path(env["PT_XLA_DEBUG_FILE"]), False
    fd, name = tempfile.mkstemp(prefix="tpukit-xla-debug-", suffix=".txt")
    os.close(fd)
    return Path(name), True


def run_command(request: RunRequest) -> int:
    display = request.script or f"-m {request.module}"
    if request.script is not None:
        path = Path(request.script)
        if not path.exists():
            raise UsageError(f"{request.script}: no such file")
        if path.is_dir():
            raise UsageError(f"{request.script}: is a directory, not a Python script")
    check = start_cuda_check(request.script) if request.check_cuda and request.script else None
    notice = choose_device(os.environ)
    if notice:
        print(notice, file=sys.stderr, flush=True)

    from tpukit.run.debuglog import DebugLog

    log = None
    log_path, ours = None, False
    if "torch_xla" not in sys.modules:  # the debug file is read once, at torch_xla's import
        log_path, ours = _debug_log_path(os.environ)
        os.environ["PT_XLA_DEBUG_LEVEL"] = "2"
        os.environ["PT_XLA_DEBUG_FILE"] = str(log_path)
        log = DebugLog(log_path, skip_existing=not ours)
    try:
        import torch_xla  # noqa: F401  (the runtime the script will use)
    except ImportError as exc:
        if ours and log_path is not None:
            log_path.unlink(missing_ok=True)
        raise UsageError(f"torch_xla is not importable ({exc}): pip install 'tpukit[xla]'") from exc
    idioms = cuda_check_result(check) if check is not None else []
    cuda = [_cuda_finding(request.script, idioms)] if idioms else []
    for finding in cuda:  # said before the script runs
        print(f"tpukit: warning: {finding.message}", file=sys.stderr, flush=True)
    from tpukit.run.analysis import analyse
    from tpukit.run.probe import Probe, StopRun
    from tpukit.run.script import run_target

    probe = Probe(log, request.max_steps)
    probe.install()
    start = time.perf_counter()
    try:
        outcome = run_target(request.script, request.module, request.args, (StopRun,))
        try:
            probe.finish()
        except StopRun:
            pass
    finally:
        probe.uninstall()
        wall = time.perf_counter() - start
        if log is not None:
            log.close()
        if ours and log_path is not None:
            log_path.unlink(missing_ok=True)
    analysis = analyse(probe, request.warmup, request.script or request.module)
    summary = {
        "script": display,
        "args": request.args,
        "device": os.environ.get("PJRT_DEVICE", ""),
        "outcome": outcome.kind,
        "exit_code": outcome.exit_code,
        "error": outcome.error,
        "wall_s": round(wall, 6),
        **analysis.summary,
    }
    findings = cuda + analysis.findings
    failed = analysis.failures(request.fail_on)
    summary["failed_on"] = failed
    report = Report("run", findings, [], summary, _summary_line(summary), show_applied=True,
                    excerpts=True)
    if request.json_path is not None:
        from tpukit.atomic import atomic_write
        from tpukit.render.json_format import as_dict

        atomic_write(request.json_path, json.dumps(as_dict(report), indent=2) + "\n")
    if request.fmt is Format.TEXT:
        _print_summary(summary, sys.stderr)
        render(report, request.fmt, sys.stderr, sys.stderr)
    elif request.output is not None:
        from tpukit.atomic import atomic_write

        buffer = io.StringIO()
        render(report, request.fmt, buffer, sys.stderr)
        atomic_write(request.output, buffer.getvalue())
    else:
        sys.stdout.flush()
        render(report, request.fmt, sys.stdout, sys.stderr)
    if outcome.kind in ("error", "exit", "interrupted") and outcome.exit_code != 0:
        return outcome.exit_code
    return 1 if failed else 0


def _summary_line(summary: dict) -> str:
    median = summary["step_time_median_s"]
    median_text = f"median step {median * 1000:.1f} ms" if median is not None else "no steady-state steps"
    stopped = " (stopped by --max-steps)" if summary["stopped_early"] else ""
    line = (f"run: {summary['steps']} step(s){stopped}, {median_text}; "
            f"{summary['distinct_graphs']} graph(s) compiled in {summary['compile_s']:.2f} s, "
            f"{summary['recompiles_after_warmup']} after warm-up; {summary['fallbacks']} CPU "
            f"fallback(s); {summary['host_syncs']} host read(s)")
    if summary["failed_on"]:
        line += f"; failing on: {', '.join(summary['failed_on'])}"
    return line


def _median_text(summary: dict) -> str:
    main = summary["main_loop"]
    loop = next((l for l in summary["loops"] if l.get("line") == main.get("line")
                 and l.get("path") == main.get("path")), None)
    where = f" of the loop ending at line {main['line']}" if main.get("line") else ""
    count = loop["steady_steps"] if loop else summary["steady_steps"]
    return f"{summary['step_time_median_s'] * 1000:.1f} ms (median of {count} steps{where})"


def _print_summary(summary: dict, stream) -> None:
    table = Table(title=f"tpukit run: {summary['script']} on {summary['device']}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    median = summary["step_time_median_s"]
    rows = [
        ("outcome", f"{summary['outcome']} (exit {summary['exit_code']})"),
        ("steps", f"{summary['steps']} in {len(summary['loops'])} loop(s) "
                  f"({summary['warmup']} warm-up each"
                  f"{', stopped by --max-steps' if summary['stopped_early'] else ''})"),
        ("steady-state step time", _median_text(summary) if median is not None
         else "n/a (no step after warm-up)"),
        ("compilations", f"{summary['compiles']} ({summary['compile_s']:.2f} s), "
                         f"{summary['distinct_graphs']} distinct graph(s)"),
        ("recompiles after warm-up", str(summary["recompiles_after_warmup"])),
        ("CPU fallbacks", str(summary["fallbacks"])),
        ("host reads", f"{summary['host_syncs']} ({summary['host_transfers']} transfers)"),
        ("wall time", f"{summary['wall_s']:.2f} s"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console(file=stream, highlight=False).print(table)
