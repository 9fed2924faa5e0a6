"""What torch_xla's persistent compilation cache saves a second run of a script, side by side.

Each round makes a fresh cache folder and runs `tpukit run --compile-cache FOLDER --json ...
SCRIPT ARGS` twice: a cold run (every graph compiled and written) and a warm one (every graph
loaded, on a TPU). It prints both runs' compiles, compile seconds, graphs loaded, unreadable
graphs, load seconds and wall time, then the medians over the rounds and the warm/cold ratios.
Meant for a TPU VM; on XLA:CPU the warm run finds every graph unreadable (the CPU client
cannot load an executable) and compiles them all again, which the table shows as failures.

    .venv/bin/python benchmarks/compile_cache.py [--rounds 3] [--max-steps 10] SCRIPT [ARGS...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TPUKIT = [sys.executable, "-m", "tpukit"]
FIELDS = ("compiles", "compile_s", "hits", "failures", "load_s", "wall_s")


def one_run(script: str, args: list[str], cache: Path, report: Path, max_steps: int) -> dict:
    cmd = [*TPUKIT, "run", "--compile-cache", str(cache), "--json", str(report),
           "--max-steps", str(max_steps), script, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1"})
    if not report.exists():
        raise SystemExit(f"tpukit run wrote no report (exit {proc.returncode}):\n{proc.stderr}")
    summary = json.loads(report.read_text())["summary"]
    cache_seen = summary["compile_cache"] or {}
    return {"compiles": summary["compiles"], "compile_s": summary["compile_s"],
            "hits": cache_seen.get("hits", 0), "failures": cache_seen.get("failures", 0),
            "load_s": cache_seen.get("load_s", 0.0), "wall_s": summary["wall_s"],
            "device": summary["device"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    rows: dict[str, list[dict]] = {"cold": [], "warm": []}
    work = Path(tempfile.mkdtemp(prefix="tpukit-cache-bench-"))
    try:
        for n in range(options.rounds):
            cache = work / f"cache-{n}"
            for kind in ("cold", "warm"):
                rows[kind].append(one_run(options.script, options.args, cache,
                                          work / f"{kind}-{n}.json", options.max_steps))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    device = rows["cold"][0]["device"]
    print(f"# {options.script}: {options.rounds} round(s) on {device}, --max-steps "
          f"{options.max_steps}, a fresh cache folder per round")
    print("| run | " + " | ".join(FIELDS) + " |")
    print("|---|" + "---|" * len(FIELDS))
    medians = {}
    for kind, runs in rows.items():
        for n, run in enumerate(runs, 1):
            print(f"| {kind} {n} | " + " | ".join(str(run[f]) for f in FIELDS) + " |")
        medians[kind] = {f: statistics.median(run[f] for run in runs) for f in FIELDS}
    for kind in rows:
        print(f"| {kind} median | " + " | ".join(f"{medians[kind][f]:g}" for f in FIELDS) + " |")
    for field in ("compile_s", "wall_s"):
        cold = medians["cold"][field]
        ratio = medians["warm"][field] / cold if cold else float("nan")
        print(f"warm/cold {field}: {ratio:.2f}")
    if medians["warm"]["failures"]:
        print("the warm runs could not read the cache back (XLA:CPU cannot load a serialized "
              "executable): the saving shows on a TPU only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
