"""Shape buckets, proven: the variable-length fixture without buckets, then with the buckets
`tpukit run` advised applied through tpukit.buckets, side by side.

1. `tpukit run --json` on fixtures/run/varlen.py (each batch padded to its longest sample)
   gives the TPU706 advice: k buckets (--bucket-budget) and the padding they cost.
2. The script runs `--repeat` times each way, alternately, under plain python
   (benchmarks/xla_metrics_runner.py reads torch_xla's metrics at the end): as it is, and with
   `--buckets <advice>`, which pads with `BucketCollate`.
Printed: compiles and XLA compile time, the script's run time and the process wall time
(medians, every run listed), the ratios, and the last losses of both (they must agree: padded
labels are -100).

    .venv/bin/python benchmarks/buckets.py [--steps 60] [--repeat 3] [--budget 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from run_overhead import timed as run  # same folder: a timed subprocess that exits on failure

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "run" / "varlen.py"
RUNNER = ROOT / "benchmarks" / "xla_metrics_runner.py"
PJRT_DEVICE = os.environ.get("PJRT_DEVICE", "CPU")  # what run_overhead.timed runs on


def advice(steps: int, budget: int, cwd: str) -> dict:
    report = Path(cwd) / "advice.json"
    run([str(Path(sys.executable).with_name("tpukit")), "run", "--json", str(report),
         "--bucket-budget", str(budget), str(SCRIPT), "--steps", str(steps)], cwd)
    found = [f for f in json.loads(report.read_text())["findings"] if f["code"] == "TPU706"]
    if not found:
        sys.exit("tpukit run gave no TPU706 advice for the fixture")
    return found[0]["extra"]


def measured(args: list[str], cwd: str) -> dict:
    wall, out = run([sys.executable, str(RUNNER), str(SCRIPT), *args], cwd)
    metrics = json.loads(next(l for l in out.splitlines() if l.startswith("XLA_METRICS "))[12:])
    losses = next(l for l in out.splitlines() if l.startswith("losses")).split()[1:]
    return {"process_s": wall, "script_s": metrics["wall_s"], "compiles": metrics["compiles"],
            "compile_s": metrics["compile_s"], "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cwd:
        extra = advice(args.steps, args.budget, cwd)
        buckets = ",".join(map(str, extra["buckets"]))
        plain_runs, bucket_runs = [], []
        for _ in range(args.repeat):
            plain_runs.append(measured(["--steps", str(args.steps)], cwd))
            bucket_runs.append(measured(["--steps", str(args.steps), "--buckets", buckets], cwd))
    print(f"fixtures/run/varlen.py --steps {args.steps}, PJRT_DEVICE={PJRT_DEVICE}, "
          f"{args.repeat} runs each, interleaved")
    print(f"advice (k={args.budget}): {extra['distinct_sizes']} distinct lengths -> buckets "
          f"{extra['buckets']}, padding +{extra['padding_overhead']:.1%} (powers of two "
          f"{extra['powers_of_two']}: +{extra['powers_of_two_overhead']:.1%})")
    print(f"{'':14} {'no buckets':>12} {'buckets':>12} {'ratio':>8}")
    for key, label in (("compiles", "compiles"), ("compile_s", "compile s"),
                       ("script_s", "script s"), ("process_s", "process s")):
        p = statistics.median(r[key] for r in plain_runs)
        b = statistics.median(r[key] for r in bucket_runs)
        print(f"{label:14} {p:12.2f} {b:12.2f} {b / p:8.3f}   "
              f"(no buckets: {' '.join(f'{r[key]:.2f}' for r in plain_runs)}; "
              f"buckets: {' '.join(f'{r[key]:.2f}' for r in bucket_runs)})")
    same = plain_runs[-1]["losses"] == bucket_runs[-1]["losses"]
    print(f"last losses: no buckets {plain_runs[-1]['losses']}, buckets "
          f"{bucket_runs[-1]['losses']} ({'equal' if same else 'DIFFERENT'})")


if __name__ == "__main__":
    main()
