"""Runs in a subprocess (`python -m tpukit.doctor.probe`): imports torch and torch_xla, and
compiles and runs a small matmul on the XLA device. Prints one JSON object on stdout.

Kept out of doctor's own process because importing torch_xla can crash, and a broken
runtime can hang; the parent gives it a timeout.
"""

from __future__ import annotations

import json
import sys
import time


def probe(smoke: bool) -> dict:
    result: dict = {"stage": "import torch"}
    try:
        import torch

        result["torch"] = torch.__version__
        result["stage"] = "import torch_xla"
        import torch_xla
        import torch_xla.runtime as xr

        result["torch_xla"] = getattr(torch_xla, "__version__", "?")
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        result["import_error"] = f"{type(exc).__name__}: {exc}"
        return result
    result["stage"] = "device"
    result["pjrt_device"] = xr.device_type()
    if not smoke:
        return result
    try:
        import torch_xla.debug.metrics as met

        device = torch_xla.device()
        result["device"] = str(device)
        result["hardware"] = torch_xla._XLAC._xla_real_devices()[:8]
        result["stage"] = "smoke test"
        a = torch.randn(256, 256)
        start = time.perf_counter()
        device_result = (a.to(device) @ a.to(device)).cpu()  # traces, compiles, runs
        result["first_run_s"] = time.perf_counter() - start
        start = time.perf_counter()
        (a.to(device) @ a.to(device)).cpu()  # the same graph again: from the compile cache
        result["cached_run_s"] = time.perf_counter() - start
        compile_time = met.metric_data("CompileTime")
        result["compiles"] = compile_time[0] if compile_time else 0
        result["compile_s"] = (compile_time[1] / 1e9) if compile_time else 0.0
        result["max_abs_error"] = float((device_result - a @ a).abs().max())
        result["stage"] = "done"
    except Exception as exc:  # noqa: BLE001
        result["smoke_error"] = f"{type(exc).__name__}: {exc}"
    return result


def main() -> None:
    print(json.dumps(probe(smoke="--no-smoke" not in sys.argv)))


if __name__ == "__main__":
    main()
