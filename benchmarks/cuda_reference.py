"""Is the CPU reference of `tpukit verify` (the original under the runtime layer sent to the
CPU, CUDA hidden) what the original computes on a real CUDA GPU? On a CUDA host, runs each
script twice through verify's own step recorder (tpukit/verify/child.py): natively on the GPU,
and with CUDA hidden under `--shim cpu`; prints both loss series and their largest relative
difference per script.

    python benchmarks/cuda_reference.py [--steps 5] [--out DIR]

The scripts: fixtures/verify/train.py (guarded device choice) and its `--amp --scaler` form
(fp16 autocast and GradScaler on the GPU, float32 on the CPU), and fixtures/shim/prog/train.py
(`--device cuda`, a package with device='cuda', events, streams, AMP).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "verify-fixture": (ROOT / "fixtures" / "verify" / "train.py", []),
    "verify-fixture-amp": (ROOT / "fixtures" / "verify" / "train.py", ["--amp", "--scaler"]),
    "shim-fixture": (ROOT / "fixtures" / "shim" / "prog" / "train.py",
                     ["--device", "cuda", "--steps", "6", "--library-calls"]),
}


def losses(script: Path, args: list[str], steps: int, out: Path, hide_cuda: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "fixtures" / "shim" / "site"), os.environ.get("PYTHONPATH", "")])}
    shim = "none"
    if hide_cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
        shim = "cpu"
    proc = subprocess.run([sys.executable, "-m", "tpukit.verify.child", "--out", str(out),
                           "--steps", str(steps), "--shim", shim, str(script), *args],
                          cwd=script.parent, env=env, capture_output=True, text=True, timeout=600)
    if not out.exists():
        return {"outcome": "error", "error": proc.stderr[-2000:], "losses": []}
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}"
          + (f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else ""))
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for name, (script, script_args) in CASES.items():
            gpu = losses(script, script_args, args.steps, Path(work) / f"{name}-gpu.json", False)
            cpu = losses(script, script_args, args.steps, Path(work) / f"{name}-cpu.json", True)
            a, b = gpu.get("losses", []), cpu.get("losses", [])
            diffs = [abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b)]
            results[name] = {"gpu": gpu.get("losses"), "cpu": cpu.get("losses"),
                             "gpu_devices": gpu.get("devices"), "cpu_devices": cpu.get("devices"),
                             "gpu_outcome": gpu.get("outcome"), "cpu_outcome": cpu.get("outcome"),
                             "errors": [r.get("error") for r in (gpu, cpu) if r.get("error")],
                             "max_rel_diff": max(diffs) if diffs else None}
            r = results[name]
            print(f"{name}: gpu {r['gpu_outcome']} on {r['gpu_devices']}, cpu {r['cpu_outcome']} "
                  f"on {r['cpu_devices']}; max rel. diff {r['max_rel_diff']}")
            print(f"  gpu {a}\n  cpu {b}")
            for error in r["errors"]:
                print(f"  error: {error}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cuda_reference.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
