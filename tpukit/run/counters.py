"""torch_xla's counters and metrics that the probe takes a step's deltas of."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counters:
    executions: int
    compiles: int
    compile_ns: float
    transfers: int
    fallbacks: dict[str, int]
    cache_hits: int = 0  # graphs loaded from the persistent compilation cache (not compiled)


class XlaCounters:
    """Reads torch_xla's counters (imported on first use: torch_xla must be importable)."""

    def __init__(self) -> None:
        import torch_xla
        import torch_xla.debug.metrics as met

        self._counter = torch_xla._XLAC._xla_counter_value
        self._counter_names = torch_xla._XLAC._xla_counter_names
        self._metric = met.metric_data

    def snapshot(self) -> Counters:
        compiles, compile_ns = self._compile_time()
        transfers = self._metric("TransferFromDeviceTime")
        return Counters(
            executions=self._counter("ExecuteComputation") or 0,
            compiles=compiles,
            compile_ns=compile_ns,
            transfers=transfers[0] if transfers else 0,
            fallbacks=self.fallback_counts(),
            cache_hits=self._counter("PersistentCacheHit") or 0,
        )

    def value(self, name: str) -> int:
        """A counter of torch_xla's by name (0 before it first counts)."""
        return self._counter(name) or 0

    def metric(self, name: str):
        """A metric of torch_xla's by name: (count, total, ...) or None."""
        return self._metric(name)

    def compile_ns(self) -> float:
        """XLA's compile time so far (a host read subtracts the compiles it triggered)."""
        return self._compile_time()[1]

    def fallback_counts(self) -> dict[str, int]:
        """The `aten::` CPU fallback counters by op."""
        return {n: self._counter(n) or 0 for n in self._counter_names() if n.startswith("aten::")}

    def _compile_time(self) -> tuple[int, float]:
        compile_time = self._metric("CompileTime")
        return (compile_time[0], compile_time[1]) if compile_time else (0, 0.0)
