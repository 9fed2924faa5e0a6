"""Migrated fixture vs hand-written reference port, side by side, on XLA (XLA:CPU here).

For every fixture with a `reference_xla.py`, runs the migrated script (`xla.py`, what
`tpukit migrate` produced) and the reference alternately, `--repeat` times each, in one
invocation, and prints median wall time, compilations, MarkSteps and the wall-time ratio
migrated/reference (target <= 1.05).

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/ports.py [--steps 20] [--repeat 3] [--only NAME]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "benchmarks" / "xla_metrics_runner.py"
TARGET = 1.05


def measure(script: Path, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
        proc = subprocess.run(
            [sys.executable, str(RUNNER), str(script), "--steps", str(steps), "--out", out],
            cwd=out, env=env, capture_output=True, text=True, timeout=1800,
        )
    if proc.returncode != 0:
        sys.exit(f"{script} failed:\n{proc.stderr[-2000:]}")
    return json.loads(re.search(r"^XLA_METRICS (.*)$", proc.stdout, re.M).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", action="append", default=[])
    args = parser.parse_args()
    names = sorted(p.parent.name for p in (ROOT / "fixtures").glob("*/reference_xla.py"))
    names = [n for n in names if not args.only or n in args.only]
    print(f"{args.steps} steps, median of {args.repeat} runs each, interleaved; "
          f"PJRT_DEVICE={os.environ.get('PJRT_DEVICE', 'CPU')}")
    header = f"{'fixture':22} {'migrated s':>10} {'ref s':>8} {'ratio':>6} {'compiles m/r':>13} {'marksteps m/r':>14}"
    print(header)
    print("-" * len(header))
    ratios = []
    for name in names:
        folder = ROOT / "fixtures" / name
        runs = {"migrated": [], "reference": []}
        for _ in range(args.repeat):  # interleaved, so drift on a noisy machine hits both
            runs["migrated"].append(measure(folder / "xla.py", args.steps))
            runs["reference"].append(measure(folder / "reference_xla.py", args.steps))
        m = statistics.median(r["wall_s"] for r in runs["migrated"])
        r = statistics.median(r["wall_s"] for r in runs["reference"])
        ratios.append(m / r)
        mig, ref = runs["migrated"][0], runs["reference"][0]
        print(f"{name:22} {m:10.2f} {r:8.2f} {m / r:6.2f} {mig['compiles']:>6}/{ref['compiles']:<6} "
              f"{mig['mark_steps']:>7}/{ref['mark_steps']:<6}")
    worst = max(ratios)
    print(f"worst ratio {worst:.2f}, median ratio {statistics.median(ratios):.2f} "
          f"(target <= {TARGET:.2f}: {'met' if worst <= TARGET else 'NOT met'})")


if __name__ == "__main__":
    main()
