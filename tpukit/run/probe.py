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

import functools
import inspect
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpukit.run.attention import AttentionSites
from tpukit.run.debuglog import DebugLog, GraphEvent
from tpukit.run.shapes import Shape, signature

# Tensor methods that copy device data to the host (a sync that waits for the device).
# `__format__`: an f-string or str.format of a tensor (`f"{loss:.3f}"`, a meter's `{val:6.2f}`)
HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__",
              "__format__")
MAX_TRACED_STEPS = 8
_INHERITED = object()


class StopRun(BaseException):
    """Raised at a step boundary to end the script after --max-steps (not an Exception, so
    the script's own `except Exception:` does not swallow it)."""


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.add(str(Path(__file__).resolve().parents[1]))  # tpukit itself
    return tuple(sorted(str(Path(r).resolve()) + "/" for r in roots))


LIBRARY_ROOTS = _library_roots()


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    return not str(Path(filename).resolve()).startswith(LIBRARY_ROOTS)


def user_frame(frame) -> tuple[str, int] | None:
    """The innermost frame of the user's own code (not torch, torch_xla, stdlib or tpukit)."""
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


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
            "graphs_compiled": [g.graph_hash for g in self.graphs if g.kind == "compile"],
            "executions": self.executions,
            "host_transfers": self.transfers,
            "host_read_bytes": sum(r.nbytes for r in self.reads),
            "fallbacks": self.fallbacks,
            "shapes": {k: {"shape": list(v[0]), "dtype": v[1]} for k, v in self.shapes.items()},
            "micro_steps": self.micro_steps,
            "optimizer_steps": self.optimizer_steps,
        }


@dataclass
class _Counters:
    executions: int
    compiles: int
    compile_ns: float
    transfers: int
    fallbacks: dict[str, int]


class Probe:
    def __init__(self, debug_log: DebugLog | None, max_steps: int | None = None,
                 listener: StepListener | None = None) -> None:
        self.log = debug_log
        self.max_steps = max_steps
        self.listener = listener
        self.attention = AttentionSites()
        self.steps: list[Step] = []
        self.fallback_lines: dict[str, dict[tuple[str, int], int]] = {}
        self.stopped_early = False
        self._patches: list[tuple[Any, str, Any]] = []
        self._hooks: list[Any] = []
        self._main = threading.main_thread()
        self._modules: list[Any] = []  # the forward calls running now, outermost first
        self._reading = False
        self._in_boundary = False
        self._label = ""  # set while inside MpDeviceLoader / xm.optimizer_step
        self._optimizer_pending = False
        self._cut_at_optimizer = False
        self._optimizers = False  # a torch.optim.Optimizer was made: steps are its steps
        self._backward = False  # a backward ran since the last boundary
        self._stepped = False  # an optimizer stepped since the last step ended
        self._traced_steps = 0
        self._trace_next = True
        self._tracer = None
        self._params: dict[type, list[str]] = {}
        self.launches: list[dict] = []  # launches run in this process (torch_xla.launch, ...)
        self.graph_dump = None  # a graphs.GraphDump with --explain-graphs
        self.models: set[str] = set()  # class names of the outermost modules called

    # -- installation ---------------------------------------------------------------------
    def install(self) -> None:
        import torch
        import torch.nn.modules.module as module_hooks
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met
        import torch_xla.distributed.parallel_loader as pl
        import torch_xla.torch_xla as core
        from torch.utils.data import dataloader
        from torch_xla._internal import pjrt

        self._counter = torch_xla._XLAC._xla_counter_value
        self._counter_names = torch_xla._XLAC._xla_counter_names
        self._metric = met.metric_data
        sync = self._wrap_sync(torch_xla.sync)
        self._patch(torch_xla, "sync", sync)
        self._patch(core, "sync", sync)
        self._patch(xm, "optimizer_step", self._wrap_optimizer_step(xm.optimizer_step))
        self._patch(pl.PerDeviceLoader, "next", self._wrap_loader_next(pl.PerDeviceLoader.next))
        self._patch(dataloader._BaseDataLoaderIter, "__next__",
                    self._wrap_batch(dataloader._BaseDataLoaderIter.__next__))
        for name in HOST_READS:
            if hasattr(torch.Tensor, name):
                self._patch(torch.Tensor, name, self._wrap_read(name, getattr(torch.Tensor, name)))
        self._patch(torch.Tensor, "to", self._wrap_read("to", torch.Tensor.to))
        self._patch(pjrt, "spawn", self._wrap_spawn(pjrt.spawn))
        self._patch(torch.Tensor, "backward", self._noting("_backward", torch.Tensor.backward))
        self._patch(torch.optim.Optimizer, "__init__",
                    self._noting("_optimizers", torch.optim.Optimizer.__init__))
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._hooks.append(register_optimizer_step_post_hook(self._optimizer_stepped))
        import torch.nn.functional as F

        self._patch(F, "scaled_dot_product_attention",
                    self._wrap_attention(F.scaled_dot_product_attention))
        self._hooks.append(module_hooks.register_module_forward_pre_hook(self._forward_pre))
        self._hooks.append(module_hooks.register_module_forward_hook(self._forward_post,
                                                                     always_call=True))
        self._base = self._counters()
        self.current = Step(1, time.perf_counter())
        self._begin(1)
        self._arm_tracer()

    def uninstall(self) -> None:
        self._disarm_tracer()
        if self.listener is not None:
            self.listener.close()
        for owner, name, original in reversed(self._patches):
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._patches.clear()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        # _INHERITED: the attribute came from a base class (torch._C.TensorBase): delete ours.
        self._patches.append((owner, name, owner.__dict__.get(name, _INHERITED)))
        setattr(owner, name, replacement)

    # -- counters -------------------------------------------------------------------------
    def _counters(self) -> _Counters:
        compile_time = self._metric("CompileTime")
        transfers = self._metric("TransferFromDeviceTime")
        return _Counters(
            executions=self._counter("ExecuteComputation") or 0,
            compiles=compile_time[0] if compile_time else 0,
            compile_ns=compile_time[1] if compile_time else 0.0,
            transfers=transfers[0] if transfers else 0,
            fallbacks=self._fallback_counts(),
        )

    def _compile_ns(self) -> float:
        compile_time = self._metric("CompileTime")
        return compile_time[1] if compile_time else 0.0

    def _fallback_counts(self) -> dict[str, int]:
        return {n: self._counter(n) or 0 for n in self._counter_names() if n.startswith("aten::")}

    # -- steps ----------------------------------------------------------------------------
    def _close_step(self, boundary: str, where: tuple[str, int] | None, final: bool = False) -> None:
        if not final and self._optimizers and self._backward and not self._stepped:
            # A micro-step of gradient accumulation (a barrier after each micro-batch's
            # backward): the step is the optimizer step, one training iteration.
            self.current.micro_steps += 1
            self._backward = False
            return
        now = time.perf_counter()
        counters = self._counters()
        step = self.current
        for event in self.log.read_new() if self.log else []:
            event.step = step.index
            step.graphs.append(event)
        if self.graph_dump is not None:  # a step's worth at a time: the dump grows every step
            self.graph_dump.read_new()
        base = self._base
        # The debug log names each launch in the step that made it; torch_xla's counter ticks
        # when a graph finishes, which can be after the next step started.
        step.executions = (sum(g.kind == "execute" for g in step.graphs) if self.log
                           else counters.executions - base.executions)
        step.compiles = counters.compiles - base.compiles
        step.compile_s = (counters.compile_ns - base.compile_ns) / 1e9
        step.transfers = counters.transfers - base.transfers
        step.fallbacks = {n: v - base.fallbacks.get(n, 0) for n, v in counters.fallbacks.items()
                          if v - base.fallbacks.get(n, 0)}
        # Executions are not evidence of work in this step: XLA runs graphs asynchronously
        # and counts each one when it finishes, often after the sync that launched it.
        idle = not (step.graphs or step.compiles or step.reads or step.fallbacks
                    or step.inputs_seen)
        # MpDeviceLoader syncs before it yields each batch, the first included: what ran
        # before the loop (set-up, or an epoch's eval and checkpoint) ends there with no batch
        # and no forward. It is no step of its own: it counts in the first batch's step, so
        # that steps are the loop's iterations (--max-steps N runs N of them).
        before_loop = boundary == "MpDeviceLoader" and not step.inputs_seen
        if idle or before_loop:  # the step goes on
            return
        step.end, step.boundary, step.boundary_at, step.complete = now, boundary, where, not final
        self._backward = self._stepped = False
        self.steps.append(step)
        self._disarm_tracer()
        if self.listener is not None:
            self.listener.step_ended(step.index, final)
            counters = self._counters()  # what the listener did (profile export) is no step's
        self._base = counters
        new_ops = [op for op in step.fallbacks if op not in self.fallback_lines]
        self._trace_next = bool(new_ops)
        if final:
            return
        self.current = Step(step.index + 1, time.perf_counter())
        self._begin(step.index + 1)
        self._arm_tracer()
        if self.max_steps and len(self.steps) >= self.max_steps:
            self.stopped_early = True
            raise StopRun()

    def _begin(self, index: int) -> None:
        if self.listener is not None:
            self.listener.step_begins(index)
            self.current.start = time.perf_counter()

    def finish(self) -> None:
        """Close the steps at the end of the script (what ran after the last boundary)."""
        if self._patches:
            self._close_step("end", None, final=True)

    def _wrap_sync(self, original: Callable) -> Callable:
        probe = self

        @functools.wraps(original)
        def sync(*args, **kwargs):
            if probe._in_boundary:
                return original(*args, **kwargs)
            probe._in_boundary = True
            try:
                result = original(*args, **kwargs)
            finally:
                probe._in_boundary = False
            probe._optimizer_pending = False
            probe._close_step(probe._label or "torch_xla.sync", user_frame(sys._getframe(1)))
            return result

        return sync

    def _wrap_spawn(self, original: Callable) -> Callable:
        probe = self

        @functools.wraps(original)
        def spawn(fn, nprocs=None, start_method="spawn", args=()):
            where = user_frame(sys._getframe(1))
            path, line = where or ("<unknown>", 0)
            probe.launches.append({"path": path, "line": line, "requested": nprocs,
                                   "processes": 1})
            print(f"tpukit: {path}:{line}: the launch runs its function in this process at world "
                  "size 1, so tpukit sees its steps (on a TPU the script alone starts one process "
                  "per device)", file=sys.stderr, flush=True)
            return original(fn, 1, start_method, args)

        return spawn

    def _wrap_optimizer_step(self, original: Callable) -> Callable:
        probe = self

        @functools.wraps(original)
        def optimizer_step(*args, **kwargs):
            where = user_frame(sys._getframe(1))
            if probe._optimizer_pending:  # two optimizer steps and no sync between them
                probe._cut_at_optimizer = True
            outer, probe._label = probe._label, "xm.optimizer_step"
            try:
                result = original(*args, **kwargs)
            finally:
                probe._label = outer
            probe._optimizer_pending = True
            if probe._cut_at_optimizer:
                probe._close_step("xm.optimizer_step", where)
            return result

        return optimizer_step

    def _noting(self, flag: str, original: Callable) -> Callable:
        """`original`, setting the probe's `flag` each time it is called."""
        probe = self

        @functools.wraps(original)
        def noted(*args, **kwargs):
            setattr(probe, flag, True)
            return original(*args, **kwargs)

        return noted

    def _optimizer_stepped(self, optimizer, args, kwargs) -> None:
        self._stepped = True
        self.current.optimizer_steps += 1

    def _wrap_loader_next(self, original: Callable) -> Callable:
        probe = self

        @functools.wraps(original)
        def next_batch(loader):
            outer, probe._label = probe._label, "MpDeviceLoader"
            try:
                batch = original(loader)
            finally:
                probe._label = outer
            probe._record_batch(batch)
            return batch

        return next_batch

    def _wrap_batch(self, original: Callable) -> Callable:
        probe = self

        @functools.wraps(original)
        def next_batch(iterator):
            batch = original(iterator)
            if threading.current_thread() is probe._main:  # MpDeviceLoader's workers are not
                probe._record_batch(batch)
                probe.current.collate = _user_function(getattr(iterator, "_collate_fn", None))
            return batch

        return next_batch

    def _record_batch(self, batch: Any) -> None:
        self._record_shapes(signature(batch, "batch"), user_frame(sys._getframe(2)))

    def _record_shapes(self, shapes: dict[str, Shape], where: tuple[str, int] | None) -> None:
        step = self.current
        step.shapes.update(shapes)
        if where is not None:
            step.origins.update(dict.fromkeys(shapes, where))
        step.inputs_seen = True

    # -- forward inputs ---------------------------------------------------------------------
    def _forward_pre(self, module, args) -> None:
        if threading.current_thread() is not self._main:
            return
        if not self._modules:
            self.attention.scan(module)
            names = self._param_names(type(module))
            owner = type(module).__name__
            self.models.add(owner)
            shapes: dict[str, Shape] = {}
            for i, value in enumerate(args):
                name = names[i] if i < len(names) else f"arg{i}"
                shapes.update(signature(value, f"{owner}.forward({name})"))
            self._record_shapes(shapes, user_frame(sys._getframe(1)))
        elif self.attention.by_module:
            self.attention.forward_called(module, user_frame(sys._getframe(1)))
        self._modules.append(module)

    def _forward_post(self, module, args, output) -> None:
        if self._modules and threading.current_thread() is self._main:
            self._modules.pop()

    def _wrap_attention(self, original: Callable) -> Callable:
        probe = self

        @functools.wraps(original)
        def scaled_dot_product_attention(query, *args, **kwargs):
            module = probe._modules[-1] if probe._modules else None
            probe.attention.called(query, module, user_frame(sys._getframe(1)))
            return original(query, *args, **kwargs)

        return scaled_dot_product_attention

    def _param_names(self, cls: type) -> list[str]:
        if cls not in self._params:
            try:
                params = list(inspect.signature(cls.forward).parameters.values())[1:]
            except (TypeError, ValueError):
                params = []
            self._params[cls] = [p.name for p in params
                                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return self._params[cls]

    # -- host reads ---------------------------------------------------------------------------
    def _wrap_read(self, method: str, original: Callable) -> Callable:
        probe = self

        @functools.wraps(original)
        def read(tensor, *args, **kwargs):
            if (probe._reading or not getattr(tensor, "is_xla", False)
                    or (method == "to" and not _to_host(args, kwargs))):
                return original(tensor, *args, **kwargs)
            probe._reading = True
            began, compiled = time.perf_counter(), probe._compile_ns()
            try:
                return original(tensor, *args, **kwargs)
            finally:
                # the compiles the read triggered are reported as compiles, not as waiting
                waited = max(0.0, time.perf_counter() - began
                             - (probe._compile_ns() - compiled) / 1e9)
                probe._reading = False
                where = user_frame(sys._getframe(1))
                if where is not None:
                    nbytes = tensor.element_size() * (1 if method in ("item", "__bool__", "__int__",
                                                                     "__float__", "__index__")
                                                      else tensor.numel())
                    probe.current.reads.append(HostRead(method, where[0], where[1], nbytes,
                                                        waited))

        return read

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
        self._tracer = FallbackTracer(self)
        self._tracer.__enter__()

    def _disarm_tracer(self) -> None:
        if self._tracer is not None:
            tracer, self._tracer = self._tracer, None
            try:
                tracer.__exit__(None, None, None)
            except Exception:  # the script left a mode of its own above ours: leave it be
                pass

    def record_fallback(self, ops: list[str], where: tuple[str, int]) -> None:
        for op in ops:
            lines = self.fallback_lines.setdefault(op, {})
            lines[where] = lines.get(where, 0) + 1


class StepListener:
    """Told when a step begins and ends (the profiler starts and stops its trace there)."""

    def step_begins(self, index: int) -> None:
        pass

    def step_ended(self, index: int, final: bool) -> None:
        pass

    def close(self) -> None:
        pass


def _user_function(fn) -> tuple[str, str, int] | None:
    """(name, path, line) of a function or callable object defined in the user's code."""
    code = getattr(fn, "__code__", None) or getattr(getattr(type(fn), "__call__", None),
                                                    "__code__", None)
    if code is None or not is_user_file(code.co_filename):
        return None
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return name, code.co_filename, code.co_firstlineno


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


def _to_host(args: tuple, kwargs: dict) -> bool:
    device = kwargs.get("device", args[0] if args else None)
    if isinstance(device, str):
        return device.startswith("cpu")
    return getattr(device, "type", None) == "cpu"
