"""What XLA:CPU's compile options do to a port's time to first step, side by side.

XLA:CPU spends minutes compiling a real model's graphs (a ViT, a UNet, GPT-2), which makes
`tpukit run` on a machine without a TPU a slow smoke test. This runs real scripts of the
public-script corpus (benchmarks/corpus/real_scripts.toml: extracted from the mirrors at their
pinned commits, tiny offline data, migrated with `tpukit migrate`) under `tpukit run
--max-steps N --json` once per setting, alternating the settings in each round, and prints per
script and setting the median time to the end of the first step (from the process start: the
first graphs' compiles), the median compile seconds, the steady step time, and each setting's
ratio to the default. The losses of the first step are printed too: a setting that changes
them is not safe.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/xla_cpu_compile.py \\
        --site DEPS --only examples-vae,examples-dcgan,nanogpt-train --rounds 2

`--settings` picks among SETTINGS by name. Run it on quiet cores: the ratios are what matter.
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_scripts as rs  # noqa: E402

SETTINGS = {
    "default": {},
    "O0": {"XLA_FLAGS": "--xla_backend_optimization_level=0"},
    "cheap-llvm": {"XLA_FLAGS": "--xla_llvm_disable_expensive_passes=true"},
    "O0+cheap-llvm": {"XLA_FLAGS": "--xla_backend_optimization_level=0 "
                                   "--xla_llvm_disable_expensive_passes=true"},
}


def prepare(entry: dict, mirrors: Path, work: Path, python: str, sites: list[Path]) -> tuple:
    """The migrated tree of `entry` under `work`: (folder to run in, script, args, env)."""
    port = work / "port"
    rs.extract(mirrors, entry, port)
    cwd_rel = entry.get("cwd", str(Path(entry["path"]).parent))
    rs.RECIPES[entry.get("data", "none")](port / cwd_rel, entry)
    seed_dir = None
    shim = rs.OFFLINE_SHIMS.get(entry.get("data", "none"), "")
    if entry.get("seed") or shim:
        seed_dir = work / "seed"
        seed_dir.mkdir()
        (seed_dir / "sitecustomize.py").write_text(
            (rs.SITECUSTOMIZE if entry.get("seed") else "") + shim)
    env = rs.base_env(entry, port, sites, seed_dir)
    rs.tpukit(python, "migrate", "--exit-zero", "-q", *entry.get("migrate", [entry["path"]]),
              cwd=port, env=env)
    args = [str(a) for a in entry.get("args", [])] + [str(a) for a in entry.get("port_args", [])]
    return port / cwd_rel, os.path.relpath(entry["path"], cwd_rel), args, env


def run_once(python: str, folder: Path, script: str, args: list[str], env: dict,
             setting: dict, steps: int, timeout: float, out: Path, pattern: str) -> dict:
    report = out / "run.json"
    report.unlink(missing_ok=True)
    full = {**env, "PJRT_DEVICE": "CPU", **setting}
    start = time.perf_counter()
    proc = subprocess.run([python, "-m", "tpukit", "run", "--json", str(report), "--max-steps",
                           str(steps), script, *args], cwd=folder, env=full, capture_output=True,
                          text=True, timeout=timeout)
    wall = time.perf_counter() - start
    try:
        summary = json.loads(report.read_text())["summary"]
    except (OSError, json.JSONDecodeError, KeyError):
        return {"ok": False, "wall": wall, "error": (proc.stderr.strip().splitlines() or [""])[-1]}
    records = summary.get("step_records") or []
    first_end = None
    if records:
        first_end = wall - sum(r.get("wall_s", 0.0) for r in records[1:])
    return {"ok": proc.returncode == 0 and bool(records), "wall": wall, "first_step": first_end,
            "compile_s": summary.get("compile_s"), "step_s": summary.get("step_time_median_s"),
            "losses": rs.read_losses(proc.stdout + proc.stderr, pattern) if pattern else []}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--site", type=Path, action="append", default=[])
    parser.add_argument("--only", required=True, help="corpus script names, comma-separated")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    settings = [s for s in args.settings.split(",") if s]
    entries = {e["name"]: e for e in rs.load_manifest()}
    print(f"# XLA:CPU compile settings, {time.strftime('%Y-%m-%d %H:%M')}, {args.rounds} rounds, "
          f"--max-steps {args.steps}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}")
    print(f"{'script':<22} {'setting':<15} {'first step s':>12} {'compile s':>10} "
          f"{'step s':>8} {'ratio':>6}  first loss")
    for name in names:
        work = Path(tempfile.mkdtemp(prefix=f"xla-cpu-{name}-"))
        try:
            folder, script, script_args, env = prepare(entries[name], args.mirrors, work,
                                                       args.python, args.site)
            results: dict[str, list[dict]] = {s: [] for s in settings}
            for _ in range(args.rounds):
                for setting in settings:
                    results[setting].append(run_once(args.python, folder, script, script_args,
                                                     env, SETTINGS[setting], args.steps,
                                                     args.timeout, work,
                                                     entries[name].get("loss", "")))
            base = None
            for setting in settings:
                runs = [r for r in results[setting] if r["ok"] and r["first_step"] is not None]
                if not runs:
                    print(f"{name:<22} {setting:<15} failed: {results[setting][-1].get('error')}")
                    continue
                first = statistics.median(r["first_step"] for r in runs)
                compile_s = statistics.median(r["compile_s"] or 0.0 for r in runs)
                steps = [r["step_s"] for r in runs if r["step_s"]]
                step = statistics.median(steps) if steps else float("nan")
                base = first if setting == "default" else base
                ratio = f"{first / base:.2f}" if base else "-"
                losses = {r["losses"][0] for r in runs if r["losses"]}
                print(f"{name:<22} {setting:<15} {first:>12.1f} {compile_s:>10.1f} {step:>8.3f} "
                      f"{ratio:>6}  {', '.join(f'{x:.6g}' for x in sorted(losses)) or '-'}",
                      flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
