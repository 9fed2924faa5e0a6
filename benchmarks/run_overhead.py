"""`tpukit run SCRIPT` vs `python SCRIPT` on the same migrated fixture, side by side.

Runs both alternately `--repeat` times in one invocation (same machine state for both) and
prints the medians of:
- the whole process's wall time (imports, compiles, steps): the target, ratio <= 1.05;
- the script's own run time (torch_xla already imported) minus XLA compile time, which removes
  the compile-time noise (on XLA:CPU one compile of the same graph varies by seconds between
  runs) and leaves what tpukit's probe adds per step;
- the XLA compile time itself (tpukit turns on PT_XLA_DEBUG_LEVEL=2 analysis).
The `tpukit` rows are the default run, graph diffs on (each barrier's and host read's graph
hashed, a new one lowered to HLO: graph_capture.py); the `explain` rows run `tpukit run --explain-graphs`
(torch_xla's dump of every graph), for its cost.
The python side runs under benchmarks/xla_metrics_runner.py (runpy, then one read of
torch_xla's metrics at the end) to get its compile time.

    .venv/bin/python benchmarks/run_overhead.py [--fixture gpt_manual_batches] [--steps 20] [--repeat 5]
        [--base /tmp/base-worktree]   # an earlier commit's tpukit, side by side
    .venv/bin/python benchmarks/run_overhead.py --shim [--steps 200] [--repeat 5]

`--shim` measures the runtime layer instead (tpukit/shim): fixtures/shim/prog/train.py, whose
every step calls three patched APIs (`.to(device)` twice, a package's factory with a device),
run by `tpukit run` with `--device cuda` (each call redirected), with `--device xla` (the
layer's no-CUDA path) and with `--device xla --no-shim` (no layer): the medians of the run's
time less its compile time, and the ratios to the run without the layer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "benchmarks" / "xla_metrics_runner.py"
TARGET = 1.05


def timed(command: list[str], cwd: str, env: dict | None = None) -> tuple[float, str]:
    env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU"), **(env or {})}
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def plain(script: Path, args: list[str], cwd: str) -> tuple[float, float, float]:
    wall, out = timed([sys.executable, str(RUNNER), str(script), *args], cwd)
    metrics = json.loads(re.search(r"^XLA_METRICS (.*)$", out, re.MULTILINE).group(1))
    return wall, metrics["wall_s"] - metrics["compile_s"], metrics["compile_s"]


def probed(script: Path, args: list[str], cwd: str, options: tuple[str, ...] = (),
           env: dict | None = None) -> tuple[float, float, float]:
    report = Path(cwd) / "run.json"
    wall, _ = timed([str(Path(sys.executable).with_name("tpukit")), "run", "--json", str(report),
                     *options, str(script), *args], cwd, env)
    summary = json.loads(report.read_text())["summary"]
    return wall, summary["wall_s"] - summary["compile_s"], summary["compile_s"]


def shim_overhead(steps: int, repeat: int) -> None:
    folder = ROOT / "fixtures" / "shim" / "prog"
    env = {"PYTHONPATH": str(ROOT / "fixtures" / "shim" / "site")}
    base = ["--steps", str(steps), "--barrier"]
    variants = {"layer, --device cuda": ((), ["--device", "cuda"]),
                "layer, --device xla": ((), ["--device", "xla"]),
                "no layer, --device xla": (("--no-shim",), ["--device", "xla"])}
    runs = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(repeat):
            for name, (options, device) in variants.items():
                runs[name].append(probed(folder / "train.py", [*base, *device], out,
                                         ("--no-cuda-check", *options), env))
    print(f"runtime layer: fixtures/shim/prog/train.py, {steps} steps of 3 patched calls each, "
          f"{repeat} runs each, interleaved; PJRT_DEVICE={os.environ.get('PJRT_DEVICE', 'CPU')}")
    reference = statistics.median(r[1] for r in runs["no layer, --device xla"])
    for name, results in runs.items():
        t = statistics.median(r[1] for r in results)
        print(f"run - compile s  {name:24} median {t:7.3f} "
              f"({' '.join(f'{r[1]:.3f}' for r in results)})  ratio to no layer {t / reference:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixture", default="gpt_manual_batches")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--base", type=Path, default=None,
                        help="a checkout of another tpukit (a worktree of an earlier commit), run "
                             "side by side as `base` (PYTHONPATH) to measure what a change costs")
    parser.add_argument("--shim", action="store_true",
                        help="measure the runtime layer (tpukit/shim) instead; see above")
    args = parser.parse_args()
    if args.shim:
        shim_overhead(args.steps, args.repeat)
        return
    folder = ROOT / "fixtures" / args.fixture
    script = folder / "xla.py"
    script_args = list(tomllib.loads((folder / "fixture.toml").read_text()).get("args", []))
    if "--steps" in script_args:
        script_args[script_args.index("--steps") + 1] = str(args.steps)
    # tpukit as a user runs it (graph diffs on), and the dump mode (--explain-graphs: every
    # graph's HLO dumped, with each op's line), for its cost.
    variants = {"tpukit": ((), None), "explain": (("--explain-graphs",), None),
                "nodiffs": (("--no-graph-diffs",), None)}
    if args.base is not None:
        variants["base"] = ((), {"PYTHONPATH": str(args.base.resolve())})
    python_runs, runs = [], {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as out:
        extra = ["--out", out] if "--out" in script.read_text() else []
        for _ in range(args.repeat):
            python_runs.append(plain(script, [*script_args, *extra], out))
            for name, (options, env) in variants.items():
                runs[name].append(probed(script, [*script_args, *extra], out, options, env))
    print(f"fixture {args.fixture} ({' '.join(script_args)}), {args.repeat} runs each, "
          f"interleaved; PJRT_DEVICE={os.environ.get('PJRT_DEVICE', 'CPU')}")
    for i, label in enumerate(("process wall s", "run - compile s", "compile s")):
        p = statistics.median(r[i] for r in python_runs)
        print(f"{label:16} python median {p:7.2f} ({' '.join(f'{r[i]:.2f}' for r in python_runs)})")
        for name, results in runs.items():
            t = statistics.median(r[i] for r in results)
            print(f"{'':16} {name:7} median {t:7.2f} ({' '.join(f'{r[i]:.2f}' for r in results)})")
            target = i == 0 and name == "tpukit"
            verdict = f" (target <= {TARGET}) -> {'OK' if t / p <= TARGET else 'OVER'}" if target else ""
            print(f"{'':16} ratio {name}/python {t / p:.3f}{verdict}")


if __name__ == "__main__":
    main()
