"""`tpukit run --json PATH` while the script runs: PATH holds the report of the steps so far.

A run that is killed (SIGKILL, an OOM kill, a preempted TPU VM) never reaches its final report:
the partial one it leaves (`"partial": true`, outcome "running") is what `tpukit report PATH`
renders. Each write is atomic (temp file + rename), so a kill mid-write leaves the previous
one. Writing analyses every step so far, so writes are spaced: the first step's at once, then
at least MIN_INTERVAL_S apart and never more than ~1/COST_SHARE of the run's time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from tpukit.run.steps import StepListener

MIN_INTERVAL_S = 0.5
COST_SHARE = 20  # a write costs at most 1/20 of the time between writes


class LiveReport(StepListener):
    def __init__(self, path: Path, build: Callable[[], tuple]) -> None:
        self.path = path
        self.build = build  # () -> (Report, failed kinds)
        self._next = 0.0  # perf_counter time from which the next write may happen

    def step_ended(self, index: int, final: bool) -> None:
        now = time.perf_counter()
        if final or now < self._next:
            return  # the final report follows at once
        self.write()
        cost = time.perf_counter() - now
        self._next = time.perf_counter() + max(MIN_INTERVAL_S, COST_SHARE * cost)

    def write(self) -> None:
        from tpukit.atomic import atomic_write
        from tpukit.render.json_format import as_dict

        report, _failed = self.build()
        atomic_write(self.path, json.dumps(as_dict(report), indent=2) + "\n")
