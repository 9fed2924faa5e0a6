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
from pathlib import Path

from tpukit.errors import UsageError
from tpukit.findings import Explanation, Finding, FixKind, Location, said
from tpukit.suppress import split_files
from tpukit.render import Format, Report, render
from tpukit.render.run_summary import print_profile, print_summary, summary_line
from tpukit.run.steps import STORM_GRAPHS

# Outcomes whose exit code is the run's: the script's own, or the signal's (130, 143).
STOPPED = ("error", "exit", "interrupted", "terminated", "compile-storm")


@dataclass
class RunRequest:
    script: str | None
    stopped_mid_loop: bool = field(default=False, init=False)  # set by run_command
    module: str | None = None
    args: list[str] = field(default_factory=list)
    max_steps: int | None = None
    storm_graphs: int = STORM_GRAPHS  # new graphs in one step that stop the run (0: never)
    warmup: int = 2
    fmt: Format = Format.TEXT
    json_path: Path | None = None
    output: Path | None = None
    fail_on: list[str] = field(default_factory=list)
    check_cuda: bool = True
    profile: bool = False
    logdir: Path | None = None
    profile_steps: tuple[int, int] | None = None  # 1-based, inclusive
    tpu_generation: str | None = None
    bucket_budget: int = 4
    html: Path | None = None
    target: str | None = None  # None: see torchtpu.resolve_target
    eager_mode: str | None = None
    explain_graphs: bool = False  # dump every graph's HLO to diff recompiled graphs
    graph_diffs: bool = True  # else no graph_capture (--no-graph-diffs)
    shim: bool = True  # the runtime layer (tpukit/shim), else --no-shim
    compile_cache: str | None = None  # --compile-cache DIR
    use_compile_cache: bool = True  # else --no-compile-cache
    cache: object = field(default=None, init=False)  # compile_cache.CacheChoice, by run_command
    ported: dict = field(default_factory=dict, init=False)  # set by run_command


def choose_device(env: dict) -> str | None:
    """Sets PJRT_DEVICE when the user did not; returns a notice for the user, if any."""
    if env.get("PJRT_DEVICE"):
        return None
    from tpukit.run.torchtpu import tpu_chips

    if tpu_chips() and importlib.util.find_spec("libtpu") is not None:
        env["PJRT_DEVICE"] = "TPU"
        return None
    env["PJRT_DEVICE"] = "CPU"
    return "tpukit: no TPU here: running on XLA:CPU (set PJRT_DEVICE to choose)"


# Flags for XLA:CPU's compiler, added where PJRT_DEVICE is CPU only (never on a TPU): XLA:CPU is
# a smoke test, where the time to the first steps is what counts. benchmarks/xla_cpu_compile.py
# (2026-12-05, 3 rounds, OMP_NUM_THREADS=1, medians): LLVM -O0 took the compile seconds of dcgan
# 37.3 -> 11.2 s, ResNet-18 (examples-imagenet) 19.0 -> 5.1, nanoGPT 4.6 -> 1.6; time to the
# end of the first step 0.43x, 0.55x and 1.07x (nanoGPT's first step is mostly not compiling);
# the same first losses in every run; steady steps 1.2x-1.6x slower (a long XLA:CPU run can
# set TPUKIT_XLA_CPU_FLAGS=0). XLA's cheaper LLVM passes (`--xla_llvm_disable_expensive_passes`)
# were slower than the default on dcgan and nanoGPT in the same benchmark: not used.
XLA_CPU_FLAGS: tuple[str, ...] = ("--xla_backend_optimization_level=0",)


def xla_cpu_compile_flags(env: dict) -> str | None:
    """On XLA:CPU, adds XLA_CPU_FLAGS to XLA_FLAGS (a flag the user set is theirs, and
    TPUKIT_XLA_CPU_FLAGS=0 adds none); returns what was added, else None."""
    if env.get("PJRT_DEVICE") != "CPU" or env.get("TPUKIT_XLA_CPU_FLAGS") == "0":
        return None
    present = env.get("XLA_FLAGS", "")
    added = [f for f in XLA_CPU_FLAGS if f.split("=")[0] not in present]
    if not added:
        return None
    env["XLA_FLAGS"] = " ".join([present, *added]).strip()
    return " ".join(added)


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


def _span_text(script: str, found: dict) -> str | None:
    """The code a finding covers, from the script's text at its span (`self.model.cuda()`),
    quoted; None where the file cannot be read or the span runs over several lines."""
    try:
        lines = Path(script).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    line, col, end_line, end_col = (found.get(k) for k in ("line", "col", "end_line", "end_col"))
    if end_line != line or not end_col or not 0 < line <= len(lines):
        return None
    return f"`{lines[line - 1][col - 1:end_col - 1]}`"


def _cuda_finding(script: str, idioms: list[dict]) -> Finding:
    from tpukit.rules import load_rules

    rule = load_rules()["TPU704"]
    first = min(idioms, key=lambda f: (f["line"], f["col"]))
    codes = sorted({f["code"] for f in idioms})
    what = _span_text(script, first) or first["code"]
    head = (f"{script} still has {len(idioms)} CUDA idiom(s) ({', '.join(codes)}; first at line "
            f"{first['line']}: {what})")
    why = Explanation("the run measures a port that is not the one you will ship (on a TPU "
                      "without the runtime layer, it fails there)",
                      f"run `tpukit migrate {script}` first")
    return Finding.from_rule(rule, Location(script, first["line"], first["col"]), said(head, why),
                             fix=FixKind.NONE, explanation=why)


def _debug_log_path(env: dict) -> tuple[Path, bool]:
    """(file, ours): the PT_XLA_DEBUG_FILE to read; a temporary one unless the user set it."""
    if env.get("PT_XLA_DEBUG_FILE"):
        return Path(env["PT_XLA_DEBUG_FILE"]), False
    fd, name = tempfile.mkstemp(prefix="tpukit-xla-debug-", suffix=".txt")
    os.close(fd)
    return Path(name), True


def _graph_dump(env: dict):
    """--explain-graphs: torch_xla writes each graph's HLO, with the Python line of every
    instruction, to a file of ours (read once, at torch_xla's import)."""
    from tpukit.run.graphs import GraphDump

    base = Path(tempfile.mkdtemp(prefix="tpukit-graphs-")) / "graphs.hlo"
    env["XLA_SAVE_TENSORS_FILE"] = str(base)
    env["XLA_SAVE_TENSORS_FMT"] = "hlo"
    env["XLA_HLO_DEBUG"] = "1"
    env["XLA_IR_DEBUG"] = "1"
    return GraphDump(base)


def run_command(request: RunRequest) -> int:
    display = request.script or f"-m {request.module}"
    if request.script is not None:
        path = Path(request.script)
        if not path.exists():
            raise UsageError(f"{request.script}: no such file")
        if path.is_dir():
            raise UsageError(f"{request.script}: is a directory, not a Python script")
    from tpukit.run.torchtpu import resolve_target

    target = resolve_target(request.target, request.script)
    if request.eager_mode is not None and target != "torchtpu":
        raise UsageError("--eager-mode goes with the torchtpu target (--target torchtpu)")
    if target == "torchtpu":
        return _run_on_torchtpu(request, display)
    if request.html is not None and importlib.util.find_spec("plotly") is None:
        raise UsageError("--html needs plotly: pip install 'tpukit[profile]'")
    if request.profile and importlib.util.find_spec("xprof") is None:
        print("tpukit: warning: xprof is not installed: the trace is captured but not summarised "
              "(pip install 'tpukit[profile]')", file=sys.stderr, flush=True)
    check = start_cuda_check(request.script) if request.check_cuda and request.script else None
    notice = choose_device(os.environ)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    if "torch_xla" not in sys.modules:  # XLA_FLAGS is read when torch_xla starts its runtime
        added = xla_cpu_compile_flags(os.environ)
        if added:
            print(f"tpukit: XLA:CPU compiles with {added}: graphs compile about 3x faster, steps "
                  "run up to 1.6x slower (TPUKIT_XLA_CPU_FLAGS=0 keeps XLA's default)",
                  file=sys.stderr, flush=True)

    from tpukit.run import compile_cache

    started = "torch_xla" in sys.modules and \
        sys.modules["torch_xla"]._XLAC._xla_computation_cache_is_initialized()
    request.cache = compile_cache.choose(os.environ, request.compile_cache,
                                         request.use_compile_cache, started)
    from tpukit.run.debuglog import DebugLog

    log = None
    log_path, ours = None, False
    dump = None
    if "torch_xla" not in sys.modules:  # the debug file is read once, at torch_xla's import
        log_path, ours = _debug_log_path(os.environ)
        os.environ["PT_XLA_DEBUG_LEVEL"] = "2"
        os.environ["PT_XLA_DEBUG_FILE"] = str(log_path)
        log = DebugLog(log_path, skip_existing=not ours)
        if request.explain_graphs:
            dump = _graph_dump(os.environ)
    elif request.explain_graphs:
        print("tpukit: warning: --explain-graphs: torch_xla was imported before tpukit run, so "
              "its graphs cannot be dumped", file=sys.stderr, flush=True)
    try:
        import torch_xla  # noqa: F401  (the runtime the script will use)
    except ImportError as exc:
        if ours and log_path is not None:
            log_path.unlink(missing_ok=True)
        raise UsageError(f"torch_xla is not importable ({exc}): pip install 'tpukit[xla]'") from exc
    idioms = cuda_check_result(check) if check is not None else []
    cuda = [_cuda_finding(request.script, idioms)] if idioms else []
    # the script's lines the migrate rules would still change: a redirected call there is one
    # `tpukit migrate` ports (the runtime layer's findings say so, with the rule)
    request.ported = {(str(Path(request.script).resolve()), f["line"]): f["code"]
                      for f in sorted(idioms, key=lambda f: f["code"], reverse=True)}
    for finding in cuda:  # said before the script runs
        print(f"tpukit: warning: {finding.message}", file=sys.stderr, flush=True)
    from tpukit.run.probe import Probe, StopRun, fan_out
    from tpukit.run.script import Outcome, run_target

    profiler = _profiler(request)
    start = time.perf_counter()
    live = None
    if request.json_path is not None:  # a report that a kill (even SIGKILL) leaves readable
        from tpukit.run.live import LiveReport

        live = LiveReport(request.json_path, lambda: _report(
            request, probe, display, Outcome(0, "running"), time.perf_counter() - start, cuda,
            partial=True, shim=shim))
    shim = _install_shim(request) if request.shim else None
    probe = Probe(log, request.max_steps, fan_out(profiler, live), request.storm_graphs)
    probe.graph_dump = dump
    if dump is None and log is not None and request.graph_diffs:
        from tpukit.run.graph_capture import GraphCapture

        # each op's Python line (IR debug), turned on where graph_capture wants it, unless the
        # user set XLA_IR_DEBUG or XLA_HLO_DEBUG: then as they said, for the whole run
        said = any(name in os.environ for name in ("XLA_IR_DEBUG", "XLA_HLO_DEBUG"))
        probe.graph_capture = GraphCapture(managed=not said)
    probe.install()
    probe.activity.watch(live.write if live is not None else None)
    try:
        import random

        import tpukit

        random.setstate(tpukit.RANDOM_STATE_AT_START)  # what the script would have found
        outcome = run_target(request.script, request.module, request.args, (StopRun,))
        try:
            probe.finish()
        except StopRun:
            pass
    finally:
        probe.activity.stop()
        probe.uninstall()
        if shim is not None:
            shim.uninstall()
        wall = time.perf_counter() - start
        if log is not None:
            log.close()
        if ours and log_path is not None:
            log_path.unlink(missing_ok=True)
        if dump is not None:
            dump.read_new()
            dump.remove()
    report, failed = _report(request, probe, display, outcome, wall, cuda, profiler=profiler,
                             shim=shim)
    summary = report.summary.to_dict()
    _emit(request, report, lambda: print_summary(summary, sys.stderr))
    if summary["profile"] is not None:
        print_profile(summary["profile"], sys.stderr)
    if request.html is not None:
        print(f"tpukit: HTML report: {request.html}", file=sys.stderr)
    # Stopped mid-loop by --max-steps, the script's loaders and the runtime may still have
    # work in flight (MpDeviceLoader's threads): the caller ends the process without the
    # interpreter's teardown, which aborted one run ("terminate called without an active
    # exception", exit -6) after its report said exit 0.
    # A script that raised (or exited) while an MpDeviceLoader still fed it: the loader's
    # threads are alive at teardown, which can abort the same way (exit 134 after a report
    # that said exit 1): the script's own exit code, without the teardown.
    request.stopped_mid_loop = outcome.kind == "max-steps" or (
        outcome.kind in STOPPED and outcome.exit_code != 0 and loader_threads_alive())
    if outcome.kind in STOPPED and outcome.exit_code != 0:
        return outcome.exit_code
    return 1 if failed else 0


def loader_threads_alive() -> bool:
    """Is a torch_xla device loader's worker thread (MpDeviceLoader, ParallelLoader) still
    running (a thread keeps its target until its run ends), or a daemonic worker process (a
    DataLoader's: multiprocessing drops a started process's target)? A loader thread that ended
    just before this check leaves the DataLoader's worker processes to the interpreter's
    teardown."""
    import multiprocessing
    import threading

    if any(getattr(getattr(t, "_target", None), "__module__", "").startswith("torch_xla.")
           for t in threading.enumerate() if t.is_alive()):
        return True
    return any(p.daemon for p in multiprocessing.active_children())


def _install_shim(request: RunRequest):
    """The runtime layer over torch, before the probe's patches (it is uninstalled after
    them); the program is the script's folder (the working directory for -m)."""
    from tpukit.shim import install

    return install(request.script)


def _report(request: RunRequest, probe, display: str, outcome, wall: float, cuda: list,
            profiler=None, partial: bool = False, shim=None) -> tuple[Report, list[str]]:
    """The run's report and the --fail-on kinds it fails on; `partial`: while the script still
    runs (what --json holds until the run ends); `shim`: the runtime layer, whose call sites
    are findings (TPU707, TPU708)."""
    from tpukit.run.analysis import analyse
    from tpukit.run.summary import RunSummary

    analysis = analyse(probe, request.warmup, request.script or request.module,
                       os.environ.get("PJRT_DEVICE", ""))
    sites = probe.attention.best()
    advice = _advice(request, probe, analysis, sites)
    stats = analysis.stats
    profile = None
    if profiler is not None:
        from tpukit.run.profile import summarise

        profile = summarise(profiler)
    # `# tpukit: ignore[...]` comments in the user's files silence findings at their lines: out of
    # the report and of --fail-on, listed in the summary
    layer = []
    if shim is not None:
        from tpukit.shim.report import findings as shim_findings

        layer = shim_findings(shim.records(), request.ported)
    from tpukit.run.crash import crash_findings

    crash = crash_findings(getattr(outcome, "exception", None))
    cache, cached = _cache_report(request, probe, analysis)
    kept, suppressed = split_files(cuda + layer + crash + analysis.findings + advice["findings"]
                                   + cached)
    kept_ids = {id(f) for f in kept}
    analysis.findings = [f for f in analysis.findings if id(f) in kept_ids]
    failed = analysis.failures(request.fail_on)
    summary = RunSummary(
        script=display,
        args=request.args,
        device=os.environ.get("PJRT_DEVICE", ""),
        outcome=outcome.kind,
        exit_code=outcome.exit_code,
        error=outcome.error,
        wall_s=round(wall, 6),
        partial=partial,
        stats=stats,
        launches=probe.launches,
        attention=[site.to_dict() for site in sites],
        tpu_generation=advice["generation"],
        profile=profile,
        # Where the run's time went, as shares of its wall time (fallbacks' own time is
        # unmeasured).
        time_shares={
            "compile": round(stats.compile_s / wall, 4) if wall > 0 else 0.0,
            "host_wait": round(stats.host_wait_s / wall, 4) if wall > 0 else 0.0,
        },
        failed_on=failed,
        suppressed=suppressed,
        in_progress=probe.activity.in_progress() if partial else None,
        stopped_in=probe.activity.stopped_in,
        mappings=probe.activity.mappings,
        compile_cache=cache,
    )
    return Report("run", kept, [], summary, summary_line(summary.to_dict()),
                  show_applied=True, excerpts=True), failed


def _cache_report(request: RunRequest, probe, analysis) -> tuple[dict | None, list]:
    """The report's `compile_cache` object and its TPU711 findings (None, [] without the
    XLA runtime's counters)."""
    from tpukit.run import compile_cache

    if request.cache is None or probe.counters is None:
        return None, []
    hits_after = sum(s.cache_hits for s in probe.steps if analysis.loops.steady(s))
    cache = compile_cache.summary(request.cache, compile_cache.counts(probe.counters.value),
                                  compile_cache.load_seconds(probe.counters.metric),
                                  hits_after)
    return cache, compile_cache.findings(cache, os.environ.get("PJRT_DEVICE", ""),
                                         request.script or request.module)


def _run_on_torchtpu(request: RunRequest, display: str) -> int:
    from tpukit.run.torchtpu import run_torchtpu

    if request.profile or request.html is not None or request.fail_on:
        raise UsageError("--profile, --html and --fail-on read torch_xla's step analysis: they "
                         "go with the xla target")
    try:
        summary, outcome = run_torchtpu(request)
    except ValueError as exc:
        raise UsageError(f"{display}: {exc}") from None
    line = (f"run (torchtpu, eager mode {summary['eager_mode']}): {outcome.kind} (exit "
            f"{outcome.exit_code}) in {summary['wall_s']:.2f} s; recompile, fallback and "
            "host-sync analysis needs the xla target")
    _emit(request, Report("run", [], [], summary, line), lambda: None)
    return outcome.exit_code if outcome.kind in STOPPED else 0


def _emit(request: RunRequest, report: Report, print_summary) -> None:
    """The report to --json, --html, and in --format to stderr (text), -o or stdout."""
    from tpukit.atomic import atomic_write

    if request.json_path is not None:
        from tpukit.render.json_format import as_dict

        atomic_write(request.json_path, json.dumps(as_dict(report), indent=2) + "\n")
    if request.html is not None:
        from tpukit.render.html import write_html

        write_html(request.html, report)
    if request.fmt is Format.TEXT:
        print_summary()
        render(report, request.fmt, sys.stderr, sys.stderr)
    elif request.output is not None:
        buffer = io.StringIO()
        render(report, request.fmt, buffer, sys.stderr)
        atomic_write(request.output, buffer.getvalue())
    else:
        sys.stdout.flush()
        render(report, request.fmt, sys.stdout, sys.stderr)


def _profiler(request: RunRequest):
    if not request.profile:
        return None
    from tpukit.run.profile import DEFAULT_STEPS, Profiler, default_logdir

    first, last = request.profile_steps or (request.warmup + 1, request.warmup + DEFAULT_STEPS)
    return Profiler(request.logdir or default_logdir(), first, last)


def tpu_generation(requested: str | None, device: str) -> tuple[str, bool]:
    """(generation, assumed): the one asked for, the TPU's own, or v5e when there is none."""
    from tpukit.run.advisors import DEFAULT_GENERATION

    if requested:
        return requested, False
    if device == "TPU":
        try:
            from torch_xla._internal import tpu

            found = generation_of(tpu.get_tpu_type())  # "v5litepod-8", "v6e-8", "v4-8", ...
        except Exception:  # noqa: BLE001  (no metadata server: fall back to the default)
            found = None
        if found:
            return found, False
    return DEFAULT_GENERATION, True


def generation_of(accelerator_type: str) -> str | None:
    name = accelerator_type.lower().split("-")[0]
    for prefix, generation in (("v5litepod", "v5e"), ("v5e", "v5e"), ("v5p", "v5p"),
                               ("v6e", "v6e"), ("tpu7", "v7"), ("v7", "v7"), ("v4", "v4"),
                               ("v3", "v3"), ("v2", "v2")):
        if name.startswith(prefix):
            return generation
    return None


def _advice(request: RunRequest, probe, analysis, sites: list) -> dict:
    from tpukit.run.advisors import bucket_findings, head_dim_findings

    generation, assumed = tpu_generation(request.tpu_generation, os.environ.get("PJRT_DEVICE", ""))
    script = request.script or request.module
    findings = head_dim_findings(sites, generation, assumed, script)
    findings += bucket_findings(probe.steps, analysis.loops, request.bucket_budget, script)
    return {"generation": generation, "findings": findings}
