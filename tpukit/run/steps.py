"""What the probe records: one Step per training iteration, with the host reads in it, and the
listeners told when a step begins and ends."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpukit.run.debuglog import GraphEvent
from tpukit.run.shapes import Shape


# New graphs one step may compile before the run is stopped as a compile storm: a training
# step compiles a handful (forward and backward, the optimizer, a read or two); an adaptive
# loop with a host read per iteration compiled ~1,150 before its first step, until XLA:CPU
# ran out of memory mappings and died (torchdiffeq's ode_demo).
STORM_GRAPHS = 300


class StopRun(BaseException):
    """Raised at a step boundary to end the script after --max-steps (not an Exception, so
    the script's own `except Exception:` does not swallow it)."""

    outcome, exit_code = "max-steps", 0


class CompileStorm(StopRun):
    """Raised after a compile when one step has compiled more new graphs than any training
    step needs (Probe.storm_graphs), or when the process nears the kernel's limit on memory
    mappings (which XLA:CPU reaches after ~1,300 graphs, and then dies in LLVM): the run stops
    while it can still say why."""

    outcome, exit_code = "compile-storm", 1


@dataclass
class HostRead:
    method: str  # item, cpu, __bool__, ...
    path: str
    line: int
    nbytes: int
    wait_s: float = 0.0  # time in the read (the pending graph's run, the copy), less compiling


@dataclass
class Step:
    index: int  # 1-based
    start: float
    end: float = 0.0
    boundary: str = ""  # what ended it: torch_xla.sync, MpDeviceLoader, xm.optimizer_step, end
    boundary_at: tuple[str, int] | None = None
    compiles: int = 0
    compile_s: float = 0.0
    cache_hits: int = 0  # graphs loaded from the persistent compilation cache instead
    executions: int = 0
    transfers: int = 0  # torch_xla's TransferFromDevice count
    fallbacks: dict[str, int] = field(default_factory=dict)
    graphs: list[GraphEvent] = field(default_factory=list)
    reads: list[HostRead] = field(default_factory=list)
    shapes: dict[str, Shape] = field(default_factory=dict)
    origins: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> user line
    inputs_seen: bool = False
    complete: bool = True
    # Gradient accumulation: the barriers after a backward that no optimizer step followed yet
    # (each micro-step's) do not end the step; the optimizer step's does.
    micro_steps: int = 0
    optimizer_steps: int = 0
    # "train", or "eval": in a script that made an optimizer, a batch with no backward and no
    # optimizer step (an evaluation's): reported as what it is, not counted as a training step
    # (`steps`, --max-steps)
    kind: str = "train"
    # The user's collate_fn that made this step's batches (name, path, line of its def): where
    # a fix for a batch shape that varies goes.
    collate: tuple[str, str, int] | None = None

    @property
    def wall_s(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return {
            "step": self.index,
            "wall_s": round(self.wall_s, 6),
            "complete": self.complete,
            "boundary": self.boundary,
            "boundary_at": ({"path": self.boundary_at[0], "line": self.boundary_at[1]}
                            if self.boundary_at else None),
            "compiles": self.compiles,
            "compile_s": round(self.compile_s, 6),
            "cache_hits": self.cache_hits,
            "graphs_compiled": [g.graph_hash for g in self.graphs if g.kind == "compile"],
            "executions": self.executions,
            "host_transfers": self.transfers,
            "host_read_bytes": sum(r.nbytes for r in self.reads),
            "fallbacks": self.fallbacks,
            "shapes": {k: {"shape": list(v[0]), "dtype": v[1]} for k, v in self.shapes.items()},
            "micro_steps": self.micro_steps,
            "optimizer_steps": self.optimizer_steps,
            "kind": self.kind,
        }


class StepListener:
    """Told when a step begins and ends (the profiler starts and stops its trace there)."""

    def step_begins(self, index: int) -> None:
        pass

    def step_ended(self, index: int, final: bool) -> None:
        pass

    def close(self) -> None:
        pass


class _FanOut(StepListener):
    def __init__(self, listeners: list[StepListener]) -> None:
        self.listeners = listeners

    def step_begins(self, index: int) -> None:
        for listener in self.listeners:
            listener.step_begins(index)

    def step_ended(self, index: int, final: bool) -> None:
        for listener in self.listeners:
            listener.step_ended(index, final)

    def close(self) -> None:
        for listener in self.listeners:
            listener.close()


def fan_out(*listeners: StepListener | None) -> StepListener | None:
    """One listener that tells each given one (None: no listener at all)."""
    present = [listener for listener in listeners if listener is not None]
    if len(present) <= 1:
        return present[0] if present else None
    return _FanOut(present)
