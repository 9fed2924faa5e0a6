"""The step probe: wraps torch_xla's step boundaries and the tensor reads that sync the host.

A step ends at every outermost `torch_xla.sync()` (which `xm.mark_step()`, MpDeviceLoader's
iteration and `xm.optimizer_step(barrier=True)` all call). A sync that finds nothing to do
(no graph ran, no batch or forward since the last one) does not start a new step. A script
that never syncs but calls `xm.optimizer_step()` gets its steps cut there.

Per step the probe records the wall time, torch_xla's counter deltas (compilations and their
time, executions, host transfers, `aten::` CPU fallbacks), the graphs compiled and executed
with the Python frames that caused them (PT_XLA_DEBUG_FILE, see debuglog.py), the shapes of
the batches the loop received and of the outermost module's forward inputs, and each
device-to-host read at the user line that made it. The lines that call CPU fallbacks are found
by a TorchFunctionMode armed only for the first step and for the step after a new fallback
appears: it costs a few microseconds per torch call, so it stays off in steady state.

`torch_xla.launch` and `xmp.spawn` (both end in `torch_xla._internal.pjrt.spawn`) would run
the training in child processes the probe cannot see: the probe runs their target in this
process at world size 1 instead (what `debug_single_process=True` does) and records the launch.
"""

from __future__ import annotations

import time

from tpukit.run.activity import Activity
from tpukit.run.capture import ShapeCapture
from tpukit.run.counters import Counters, XlaCounters
from tpukit.run.debuglog import DebugLog
from tpukit.run.frames import LIBRARY_ROOTS, is_user_file, user_frame  # noqa: F401
from tpukit.run.patches import Patch, all_patches
from tpukit.run.patches.host_reads import HOST_READS  # noqa: F401
from tpukit.run.steps import (STORM_GRAPHS, CompileStorm, HostRead, Step,  # noqa: F401
                              StepListener, StopRun, fan_out)
from tpukit.run.untrained import UntrainedCheck

MAX_TRACED_STEPS = 8


class Probe:
    """Step accounting: the patches (patches/) call `close_step` at each boundary; the probe
    closes the current step with its counter deltas and graphs, or lets it go on."""

    def __init__(self, debug_log: DebugLog | None, max_steps: int | None = None,
                 listener: StepListener | None = None, storm_graphs: int = STORM_GRAPHS) -> None:
        self.log = debug_log
        self.max_steps = max_steps
        self.listener = listener
        self.capture = ShapeCapture(self)
        self.attention = self.capture.attention
        self.steps: list[Step] = []
        self.fallback_lines: dict[str, dict[tuple[str, int], int]] = {}
        # a fallback line inside a module's forward -> (path, line, forward) of the user line
        # that called the module
        self.fallback_callers: dict[tuple[str, int], tuple[str, int, str]] = {}
        self.stopped_early = False
        self.counters: XlaCounters | None = None  # set by install
        self._patches: list[Patch] = []
        # Step boundaries, set by the patches:
        self.boundary_label = ""  # set while inside MpDeviceLoader / xm.optimizer_step
        self.optimizer_pending = False
        self.cut_at_optimizer = False
        self.optimizers_made = False  # a torch.optim.Optimizer was made: steps are its steps
        self.backward_ran = False  # a backward ran since the last boundary
        self._stepped = False  # an optimizer stepped since the last step ended
        self._traced_steps = 0
        self._trace_next = True
        self._tracer = None
        self.launches: list[dict] = []  # launches run in this process (torch_xla.launch, ...)
        self.graph_dump = None  # a graphs.GraphDump with --explain-graphs
        self.graph_capture = None  # a graph_capture.GraphCapture otherwise
        self.activity = Activity()  # what a barrier or read is doing now (activity.py)
        self.untrained = UntrainedCheck()  # optimizers whose step updates nothing
        self.storm_graphs = storm_graphs  # 0: never stopped for compiling
        # (call, path, line) -> compiles there in the current step; what stopped the run
        self.compiling: dict[tuple[str, str, int], int] = {}
        self.storm: dict | None = None
        self.storm_watch = None  # storm_watch.StormWatch, set by install

    @property
    def models(self) -> set[str]:
        """Class names of the outermost modules called."""
        return self.capture.models

    @models.setter
    def models(self, value: set[str]) -> None:
        self.capture.models = value

    # -- installation ---------------------------------------------------------------------
    def install(self) -> None:
        self.counters = XlaCounters()
        for patch in all_patches():
            patch.install(self)
            self._patches.append(patch)
        self._base = self.counters.snapshot()
        self.current = Step(1, time.perf_counter())
        from tpukit.run.storm_watch import StormWatch

        self.storm_watch = StormWatch(self)
        self.activity.tick = self.storm_watch
        self._begin(1)
        self._arm_tracer()
        self._set_ir_debug()

    def uninstall(self) -> None:
        self._disarm_tracer()
        if self.listener is not None:
            self.listener.close()
        for patch in reversed(self._patches):
            patch.uninstall()
        self._patches.clear()

    # -- steps ----------------------------------------------------------------------------
    def compiled(self, call: str, where: tuple[str, int] | None) -> None:
        """A barrier or host read at `where` compiled a graph: a storm stops the run here."""
        key = (call, *(where or ("", 0)))
        self.compiling[key] = self.compiling.get(key, 0) + 1
        graphs = sum(self.compiling.values())
        near_limit = self.activity.mappings
        if self.storm is not None or not self.storm_graphs or (
                graphs < self.storm_graphs and near_limit is None):
            return
        (call, path, line), at = max(self.compiling.items(), key=lambda kv: kv[1])
        self.storm = {"step": self.current.index, "graphs": graphs, "call": call, "path": path,
                      "line": line, "at_line": at, "limit": self.storm_graphs,
                      "mappings": near_limit}
        raise CompileStorm()

    def optimizer_stepped(self) -> None:
        self._stepped = True
        self.current.optimizer_steps += 1

    def close_step(self, boundary: str, where: tuple[str, int] | None, final: bool = False) -> None:
        if not final and self.optimizers_made and self.backward_ran and not self._stepped:
            # A micro-step of gradient accumulation (a barrier after each micro-batch's
            # backward): the step is the optimizer step, one training iteration.
            self.current.micro_steps += 1
            self.backward_ran = False
            return
        now = time.perf_counter()
        counters = self.counters.snapshot()
        step = self.current
        events = self.log.read_new() if self.log else []
        for event in events:
            event.step = step.index
            step.graphs.append(event)
        if self.graph_dump is not None:  # a step's worth at a time: the dump grows every step
            self.graph_dump.read_new()
        if self.graph_capture is not None:
            self.graph_capture.step_ended(events, step.index)
        base: Counters = self._base
        # The debug log names each launch in the step that made it; torch_xla's counter ticks
        # when a graph finishes, which can be after the next step started.
        step.executions = (sum(g.kind == "execute" for g in step.graphs) if self.log
                           else counters.executions - base.executions)
        step.compiles = counters.compiles - base.compiles
        step.compile_s = (counters.compile_ns - base.compile_ns) / 1e9
        step.cache_hits = counters.cache_hits - base.cache_hits
        step.transfers = counters.transfers - base.transfers
        step.fallbacks = {n: v - base.fallbacks.get(n, 0) for n, v in counters.fallbacks.items()
                          if v - base.fallbacks.get(n, 0)}
        # Executions are not evidence of work in this step: XLA runs graphs asynchronously
        # and counts each one when it finishes, often after the sync that launched it.
        idle = not (step.graphs or step.compiles or step.cache_hits or step.reads
                    or step.fallbacks or step.inputs_seen)
        # MpDeviceLoader syncs before it yields each batch, the first included: what ran
        # before the loop (set-up, or an epoch's eval and checkpoint) ends there with no batch
        # and no forward. It is no step of its own: it counts in the first batch's step, so
        # that steps are the loop's iterations (--max-steps N runs N of them).
        before_loop = boundary == "MpDeviceLoader" and not step.inputs_seen
        if idle or before_loop:  # the step goes on
            return
        step.end, step.boundary, step.boundary_at, step.complete = now, boundary, where, not final
        if self.optimizers_made and not (self.backward_ran or self._stepped or step.micro_steps
                                         or step.optimizer_steps):
            step.kind = "eval"
        self.backward_ran = self._stepped = False
        self.steps.append(step)
        self.compiling = {}
        self._disarm_tracer()
        if self.listener is not None:
            self.listener.step_ended(step.index, final)
            counters = self.counters.snapshot()  # what the listener did (profile export) is no step's
        self._base = counters
        new_ops = [op for op in step.fallbacks if op not in self.fallback_lines]
        self._trace_next = bool(new_ops)
        if final:
            return
        self.current = Step(step.index + 1, time.perf_counter())
        self._begin(step.index + 1)
        self._arm_tracer()
        self._set_ir_debug()
        if self.max_steps and sum(s.kind == "train" for s in self.steps) >= self.max_steps:
            self.stopped_early = True
            raise StopRun()

    def _begin(self, index: int) -> None:
        if self.listener is not None:
            self.listener.step_begins(index)
            self.current.start = time.perf_counter()

    def finish(self) -> None:
        """Close the steps at the end of the script (what ran after the last boundary)."""
        if self.storm_watch is not None:
            self.storm_watch.disarm()
        if self._patches:
            self.close_step("end", None, final=True)

    # -- fallback tracer ------------------------------------------------------------------------
    def _arm_tracer(self) -> None:
        if not self._trace_next or self._traced_steps >= MAX_TRACED_STEPS:
            return
        if self.graph_dump is not None:
            # torch_xla gives each op of the dump one Python frame, the innermost: under the
            # tracer that is the tracer's own, for every op of the step, not the user's line.
            return
        from tpukit.run.tracer import FallbackTracer

        self._traced_steps += 1
        self._tracer = FallbackTracer(self.counters, self.record_fallback)
        self._tracer.__enter__()
        self._set_ir_debug()

    def _disarm_tracer(self) -> None:
        if self._tracer is not None:
            tracer, self._tracer = self._tracer, None
            try:
                tracer.__exit__(None, None, None)
            except Exception:  # the script left a mode of its own above ours: leave it be
                pass
            self._set_ir_debug()

    def _set_ir_debug(self) -> None:
        """Each op's Python line (IR debug) in the graphs graph_capture lowers, where it wants
        them (graph_capture.GraphCapture.wants_lines), and never under the fallback tracer,
        where an op's innermost frame is the tracer's own."""
        if self.graph_capture is not None and self.graph_capture.managed:
            import torch_xla

            torch_xla._XLAC._set_ir_debug(self._tracer is None
                                          and self.graph_capture.wants_lines(self.current.index))

    def record_fallback(self, ops: list[str], where: tuple[str, int],
                        caller: tuple[str, int, str] | None = None) -> None:
        if caller is not None:
            self.fallback_callers.setdefault(where, caller)
        for op in ops:
            lines = self.fallback_lines.setdefault(op, {})
            lines[where] = lines.get(where, 0) + 1
