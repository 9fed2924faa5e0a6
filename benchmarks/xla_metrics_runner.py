"""Run a training script as `__main__` and print torch_xla's counters as one JSON line.

    PJRT_DEVICE=CPU python benchmarks/xla_metrics_runner.py SCRIPT [ARGS...]

Used by tests/test_ports.py and benchmarks/ports.py to compare a migrated script with its
hand-written reference port: compilations, step barriers (MarkStep), CPU fallbacks
(`aten::*` counters) and wall time, measured in the same way for both.
"""

from __future__ import annotations

import json
import runpy
import sys
import time


def main() -> None:
    script, args = sys.argv[1], sys.argv[2:]
    sys.argv = [script, *args]
    import torch_xla  # noqa: F401  (imported before the clock starts: wall_s is the script's run)

    start = time.perf_counter()
    runpy.run_path(script, run_name="__main__")
    wall = time.perf_counter() - start
    import torch_xla.debug.metrics as met

    compile_time = met.metric_data("CompileTime")
    report = {
        "wall_s": wall,
        "compiles": compile_time[0] if compile_time else 0,
        "compile_s": compile_time[1] / 1e9 if compile_time else 0.0,
        "mark_steps": met.counter_value("MarkStep") or 0,
        "executions": met.counter_value("ExecuteComputation") or 0,
        "fallbacks": {n: met.counter_value(n) for n in met.counter_names() if n.startswith("aten::")},
    }
    print("XLA_METRICS " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
