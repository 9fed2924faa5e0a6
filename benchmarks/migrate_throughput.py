"""Wall-clock throughput of ``tpukit migrate --check`` against TorchFix 0.7.0.

What it measures
----------------
Both tools are run, in one invocation of this script, over the same corpus: a
scratch copy of the ``*.py`` files of torch's own ``nn``, ``distributed``,
``cuda``, ``amp`` and ``utils`` subpackages (about 630 files, 210k lines for
torch 2.9). Each run is timed with ``time.perf_counter`` around
``subprocess.run``, so interpreter start-up and imports are included, as a
user in CI would experience them.

* TorchFix runs as a CI check would run it: ``torchfix --jobs J PATH`` (no
  ``--fix``). It lives in its own virtualenv, created on first use under
  ``--cache-dir`` (default ``~/.cache/tpukit-bench/torchfix-venv``) with
  ``pip install torchfix==0.7.0`` and reused afterwards. TorchFix exits 0 even
  when it reports violations; it exits 1 when some files could not be
  processed (still a measured run, reported as such). A traceback without its
  closing "Finished checking N files." line is a failure.
* tpukit runs as ``python -m tpukit migrate --check --quiet -j J PATH`` with
  the interpreter running this script. Exit 0 (nothing to change) and 1
  (changes found) are both normal; 2 is a tool failure.

The report is a table of runs, median and minimum wall seconds per tool, and
the ratio of medians ``tpukit/torchfix`` against the target of <= 0.20x.

How to run
----------
From the repository root, with the project's virtualenv (it must have torch
installed; torch is located, never imported)::

    .venv/bin/python benchmarks/migrate_throughput.py
    .venv/bin/python benchmarks/migrate_throughput.py --repeat 5 --jobs 2 --keep

TorchFix takes about 200 s on a 2-core machine (541 of the 629 files contain
"torch" and get parsed), hence ``--torchfix-repeat``
defaults to 1. ``--only tpukit`` / ``--only torchfix`` time a single tool
(no ratio), for quick iterations.

Exit status: 0 when the measurements were taken (whatever the ratio), 2 on any
failure (torch not found, TorchFix install or crash, tpukit failure).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, Sequence

TORCH_SUBPACKAGES: tuple[str, ...] = ("nn", "distributed", "cuda", "amp", "utils")
TORCHFIX_VERSION = "0.7.0"
TARGET_RATIO = 0.20
RUN_TIMEOUT_S = 1800.0
REPO_ROOT = Path(__file__).resolve().parent.parent
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


class BenchmarkError(Exception):
    """A failure that makes the measurement meaningless (exit status 2)."""


@dataclass
class Timing:
    """Wall-clock seconds of each timed run of one tool."""

    tool: str
    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def minimum(self) -> float:
        return min(self.seconds)


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #


def fail(message: str) -> NoReturn:
    raise BenchmarkError(message)


def tail(text: str, lines: int = 20) -> str:
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join("    " + line for line in kept) or "    (empty)"


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return ANSI_ESCAPE.sub("", lines[-1]).strip() if lines else "(no output)"


def timed_run(cmd: Sequence[str], cwd: Path | None = None) -> RunResult:
    """Run ``cmd`` with captured output, timing it with ``perf_counter``."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            list(cmd),
            cwd=cwd,
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
            timeout=RUN_TIMEOUT_S,
        )
    except FileNotFoundError as exc:
        fail(f"cannot run {cmd[0]}: {exc}")
    except subprocess.TimeoutExpired:
        fail(f"timed out after {RUN_TIMEOUT_S:.0f} s: {' '.join(cmd)}")
    elapsed = time.perf_counter() - start
    return RunResult(proc.returncode, proc.stdout, proc.stderr, elapsed)


def venv_executable(venv: Path, name: str) -> Path:
    scripts = "Scripts" if os.name == "nt" else "bin"
    suffix = ".exe" if os.name == "nt" else ""
    return venv / scripts / f"{name}{suffix}"


# --------------------------------------------------------------------------- #
# Corpus
# --------------------------------------------------------------------------- #


def find_torch_dir() -> Path:
    """Torch's package directory, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        fail(
            f"torch is not installed for {sys.executable}; run this script with "
            "the project's virtualenv (.venv/bin/python)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def torch_version(torch_dir: Path) -> str:
    """Read ``torch/version.py`` as text (importing torch takes seconds)."""
    try:
        text = (torch_dir / "version.py").read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else "unknown"


def count_lines(data: bytes) -> int:
    lines = data.count(b"\n")
    return lines + 1 if data and not data.endswith(b"\n") else lines


def build_corpus(torch_dir: Path, dest: Path) -> tuple[int, int]:
    """Copy the ``*.py`` files of the chosen subpackages; return (files, lines)."""
    files = lines = 0
    for sub in TORCH_SUBPACKAGES:
        root = torch_dir / sub
        if not root.is_dir():
            fail(f"torch subpackage not found: {root}")
        for src in sorted(root.rglob("*.py")):
            if not src.is_file():
                continue
            target = dest / src.relative_to(torch_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            files += 1
            lines += count_lines(src.read_bytes())
    return files, lines


# --------------------------------------------------------------------------- #
# TorchFix
# --------------------------------------------------------------------------- #


def installed_torchfix_version(torchfix: Path) -> str | None:
    if not torchfix.exists():
        return None
    try:
        proc = subprocess.run(
            [str(torchfix), "--version"], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_torchfix(venv: Path) -> Path:
    """Return the ``torchfix`` console script, installing it if needed."""
    torchfix = venv_executable(venv, "torchfix")
    if installed_torchfix_version(torchfix) == TORCHFIX_VERSION:
        print(f"TorchFix {TORCHFIX_VERSION}: reusing {venv}")
        return torchfix

    print(f"TorchFix {TORCHFIX_VERSION}: installing into {venv} ...", flush=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [
            str(venv_executable(venv, "python")),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"torchfix=={TORCHFIX_VERSION}",
        ],
    ]
    venv.parent.mkdir(parents=True, exist_ok=True)
    for step in steps:
        result = timed_run(step)
        if result.returncode != 0:
            fail(
                f"`{' '.join(step)}` exited {result.returncode}:\n"
                f"{tail(result.stderr or result.stdout)}"
            )
    found = installed_torchfix_version(torchfix)
    if found != TORCHFIX_VERSION:
        fail(f"expected torchfix {TORCHFIX_VERSION} in {venv}, found {found!r}")
    return torchfix


def run_torchfix(torchfix: Path, corpus: Path, jobs: int, repeat: int) -> Timing:
    # The same check a CI job runs: report, don't fix. TorchFix exits 0 with
    # violations, 1 when some files failed to process; both are finished runs.
    cmd = [str(torchfix), "--jobs", str(jobs), str(corpus)]
    print(f"$ {' '.join(cmd)}")
    timing = Timing("torchfix")
    for i in range(repeat):
        result = timed_run(cmd)
        stderr = ANSI_ESCAPE.sub("", result.stderr)
        finished = "Finished checking" in stderr
        if result.returncode not in (0, 1) or not finished or "Traceback" in stderr:
            fail(f"torchfix failed (exit {result.returncode}):\n{tail(stderr)}")
        timing.seconds.append(result.seconds)
        print(f"  torchfix run {i + 1}/{repeat}: {result.seconds:.2f} s", flush=True)
        if i == 0:
            out_lines = result.stdout.splitlines()
            violations = sum(1 for line in out_lines if ": TOR" in line)
            summary = " | ".join(s.strip() for s in stderr.splitlines() if s.strip())
            print(f"  torchfix: {summary} ({violations} violations reported)")
            if result.returncode == 1:
                print("  torchfix: exit 1, some files could not be processed")
    return timing


# --------------------------------------------------------------------------- #
# tpukit
# --------------------------------------------------------------------------- #


def tpukit_command(corpus: Path, jobs: int, quiet: bool) -> list[str]:
    cmd = [sys.executable, "-m", "tpukit", "migrate", "--check"]
    if quiet:
        cmd.append("--quiet")
    return cmd + ["-j", str(jobs), str(corpus)]


def rejects_quiet(result: RunResult) -> bool:
    text = result.stderr.lower()
    return result.returncode == 2 and "usage" in text and "--quiet" in text


def run_tpukit(corpus: Path, jobs: int, repeat: int) -> Timing:
    quiet = True
    timing = Timing("tpukit")
    summary_printed = False
    while len(timing.seconds) < repeat:
        cmd = tpukit_command(corpus, jobs, quiet)
        if not timing.seconds:
            print(f"$ {' '.join(cmd)}")
        result = timed_run(cmd, cwd=REPO_ROOT)
        if quiet and rejects_quiet(result):
            print("  tpukit does not accept --quiet; retrying without it")
            quiet = False
            continue
        if "No module named tpukit" in result.stderr:
            fail(
                f"`python -m tpukit` is not runnable with {sys.executable}; is the "
                f"project installed in this virtualenv (`pip install -e .`)?\n"
                f"{tail(result.stderr, 3)}"
            )
        # An uncaught exception also exits 1, which would pass for "changes found".
        crashed = "Traceback (most recent call last)" in result.stderr
        if result.returncode not in (0, 1) or crashed:
            fail(f"tpukit failed (exit {result.returncode}):\n{tail(result.stderr)}")
        timing.seconds.append(result.seconds)
        print(
            f"  tpukit run {len(timing.seconds)}/{repeat}: {result.seconds:.2f} s"
            f" (exit {result.returncode})",
            flush=True,
        )
        if not summary_printed:
            print(f"  tpukit: {last_line(result.stdout)}")
            summary_printed = True
    return timing


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #


def print_report(timings: Sequence[Timing]) -> None:
    print()
    print(f"{'tool':<10}{'runs':>6}{'median s':>12}{'min s':>10}")
    for t in timings:
        print(f"{t.tool:<10}{len(t.seconds):>6}{t.median:>12.2f}{t.minimum:>10.2f}")
    by_tool = {t.tool: t for t in timings}
    if "tpukit" in by_tool and "torchfix" in by_tool:
        ratio = by_tool["tpukit"].median / by_tool["torchfix"].median
        verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
        print(
            f"tpukit/torchfix = {ratio:.2f}x (target <= {TARGET_RATIO:.2f}x, {verdict})"
        )


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time `tpukit migrate --check` against TorchFix "
        f"{TORCHFIX_VERSION} on a copy of torch's own sources."
    )
    parser.add_argument(
        "--repeat", type=positive_int, default=3, help="tpukit runs (default 3)"
    )
    parser.add_argument(
        "--torchfix-repeat",
        type=positive_int,
        default=1,
        help="TorchFix runs (default 1; one takes ~200 s on 2 cores)",
    )
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=os.cpu_count() or 1,
        help="worker processes for both tools (default: os.cpu_count())",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch copy and print its path"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".cache" / "tpukit-bench",
        help="where TorchFix's virtualenv lives (default ~/.cache/tpukit-bench)",
    )
    parser.add_argument(
        "--only",
        choices=("tpukit", "torchfix"),
        help="time a single tool (no ratio)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"machine: os.cpu_count()={os.cpu_count()}, python {platform.python_version()}"
        f" ({sys.executable}), {platform.platform()}"
    )

    scratch = Path(tempfile.mkdtemp(prefix="tpukit-bench-"))
    try:
        torch_dir = find_torch_dir()
        corpus = scratch / "corpus"
        files, lines = build_corpus(torch_dir, corpus)
        print(
            f"corpus: {files} files, {lines} lines"
            f" from torch {torch_version(torch_dir)}"
            f" ({', '.join(TORCH_SUBPACKAGES)}) -> {corpus}"
        )

        timings: list[Timing] = []
        # tpukit first: if it is broken, fail fast instead of after TorchFix's minutes.
        if args.only in (None, "tpukit"):
            timings.append(run_tpukit(corpus, args.jobs, args.repeat))
        if args.only in (None, "torchfix"):
            torchfix = ensure_torchfix(args.cache_dir / "torchfix-venv")
            timings.append(
                run_torchfix(torchfix, corpus, args.jobs, args.torchfix_repeat)
            )
        print_report(timings)
        return 0
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            print(f"scratch kept at {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
