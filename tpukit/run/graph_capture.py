"""Graph diffs by default: the HLO of each graph a step barrier or a host read compiles,
captured before it runs, so that a recompile whose inputs kept their shapes is explained by
what differs in the graph, and a graph that grows by how much.

Dumping every graph (`--explain-graphs`, XLA_SAVE_TENSORS_FILE) lowers each step's graph to
HLO text: 1.18x wall time on XLA:CPU. Here, before each outermost `torch_xla.sync()`, the
tensors the user's code holds (the locals of its frames, and the parameters, gradients and
optimizer state of the modules and optimizers among them) are hashed with `_get_graph_hash`
(before a host read: the tensor read), and only a hash not seen before is lowered
(`_get_xla_tensors_hlo`): steady state pays one hash per barrier and read. torch_xla's debug
log names each compiled graph by a hash of its own (not the same number), so a capture whose
call compiled something is tied to the next compile event at its line, in order. Only plain
XLA tensors are hashed, and nothing while dynamo traces: `_get_graph_hash` of a FakeTensor
(varlen_seq_model's host read under torch.compile's tracing) aborts the process in a CHECK.
IR debug (each op's Python line, `_set_ir_debug`; XLA_HLO_DEBUG is not needed for
`_get_xla_tensors_hlo` to carry it, measured) records a Python frame per op: on for a whole
run (XLA_HLO_DEBUG=1) it doubled the median step of gpt_manual_batches on XLA:CPU (8.9 ms vs
4.4 ms). It is on for the first
LINED_STEPS steps, in the step after one that compiled (a loop's warm-up), and, once a line
that ran graphs in WARM earlier steps compiles again (a recompile: a loop's first steps and an
evaluation's first graph are none), for the rest of the run; never under the fallback tracer
(an op's innermost frame is the tracer's own). A
graph first lowered without lines is lowered again when it runs with them (a branch taken every
4th step: its graph from step 4, lined at step 8).
"""

from __future__ import annotations

import time
import warnings

from tpukit.run.frames import is_user_file
from tpukit.run.graphs import Op, parse_graph

_DEPTH = 2  # containers looked into: a list of tensors, a dict of lists
_ITEMS = 1024  # a container longer than this is data, not what a step holds
_GRAPHS = 256  # graphs lowered at most (each kept as a list of ops)
LINED_STEPS = 3  # IR debug on for these first steps (the warm-up)
WARM = 2  # steps a line runs graphs in before a compile there is a recompile

Capture = tuple[tuple[str, int], object]  # (the user line, our hash of its graph)


class GraphCapture:
    def __init__(self, managed: bool = True) -> None:
        self.managed = managed  # IR debug is turned on and off here (not where the user set it)
        self.graphs = LoweredGraphs()  # the debug log's graph hash -> its HLO's ops
        self.seconds = 0.0  # time spent hashing and lowering
        self._ops: dict[object, Lowered] = {}  # our hash -> its HLO
        self._lined: set[object] = set()  # our hashes lowered with each op's Python line
        self._compiled: list[Capture] = []  # this step's captures whose call compiled
        self.armed = False  # a line past its warm-up recompiled: lines from now on
        self._runs: dict[tuple[str, int], int] = {}  # line -> earlier steps it ran graphs in
        self._compiled_last = False  # the last step compiled something
        self.new_graph = False  # the last capture's graph was not seen before

    def wants_lines(self, step: int) -> bool:
        """IR debug for step `step` (the probe turns it off under its fallback tracer)."""
        return step <= LINED_STEPS or self.armed or self._compiled_last

    def before_sync(self, frame, where: tuple[str, int] | None) -> Capture | None:
        """At a barrier (`frame`: its caller's), before the graph runs."""
        return self._capture(lambda: held_tensors(frame), where)

    def before_read(self, tensor, where: tuple[str, int] | None) -> Capture | None:
        """At a host read of `tensor`, before its graph runs."""
        return self._capture(lambda: [tensor], where)

    def after(self, capture: Capture | None, compiled: bool) -> None:
        """The call `capture` was taken before has run; `compiled`: XLA compiled for it."""
        if capture is not None and compiled:
            self._compiled.append(capture)

    def _capture(self, tensors_of, where) -> Capture | None:
        if where is None:
            return None
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated names met among a script's globals
                import torch_xla

                xlac = torch_xla._XLAC
                if _tracing():
                    return None
                tensors = [t for t in tensors_of() if _plain(t)]
                if tensors:
                    # only the tensors with ops pending, what the sync runs: `_get_graph_hash`
                    # changed the others (a tensor whose IR was a device_data node came out
                    # holding a device buffer instead, seen with `_get_xla_tensor_debug_info`),
                    # and a capture must leave XLA's state as it found it
                    pending = xlac._check_tensor_need_materialization(tensors)
                    tensors = [t for t, needed in zip(tensors, pending) if needed]
                if not tensors:
                    return None
                own = xlac._get_graph_hash(tensors)
                self.new_graph = own not in self._ops
                lined = xlac._get_ir_debug()
                if own not in self._ops or (lined and own not in self._lined):
                    if own not in self._ops and len(self._ops) >= _GRAPHS:
                        return None
                    # in place: the graphs already tied to it see the lines too
                    self._ops.setdefault(own, Lowered()).set(xlac._get_xla_tensors_hlo(tensors))
                    if lined:
                        self._lined.add(own)
                return where, own
        except Exception:  # a diagnosis aid: never the reason a user's run fails
            return None
        finally:
            self.seconds += time.perf_counter() - start

    def step_ended(self, events, step: int) -> None:
        """Tie this step's captures that compiled to the compile events of their lines, in
        order (`events`: the debug-log graph events read as step `step` ended)."""
        compiles: dict[tuple[str, int], list[str]] = {}
        ran: set[tuple[str, int]] = set()
        for event in events:
            line = next(((f, n) for _, f, n in event.frames if is_user_file(f)), None)
            if line is not None:
                ran.add(line)
            if event.kind == "compile" and line is not None and event.graph_hash:
                compiles.setdefault(line, []).append(event.graph_hash)
        if any(self._runs.get(line, 0) >= WARM for line in compiles):
            self.armed = True
        for line in ran:
            self._runs[line] = self._runs.get(line, 0) + 1
        self._compiled_last = bool(compiles)
        for where, own in self._compiled:
            hashes = compiles.get(where)
            if hashes:
                self.graphs.setdefault(hashes.pop(0), self._ops[own])
        self._compiled = []


class Lowered:
    """One graph's HLO text, parsed when a diff first asks for its ops: most graphs are never
    diffed (a run's first graphs, each compiled once), and parsing is half of lowering's cost."""

    __slots__ = ("_text", "_ops")

    def __init__(self) -> None:
        self._text, self._ops = "", None

    def set(self, text: str) -> None:
        self._text, self._ops = text, None

    def ops(self) -> list[Op]:
        if self._ops is None:
            self._ops, self._text = parse_graph(self._text.splitlines()), ""
        return self._ops


class LoweredGraphs(dict):
    """Graph hash -> its ops (`graphs[h]`, as GraphDump.graphs), each parsed when read."""

    def __getitem__(self, key) -> list[Op]:
        return dict.__getitem__(self, key).ops()

    def get(self, key, default=None):
        return self[key] if key in self else default


def _tracing() -> bool:
    import torch

    return torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active()


def _plain(tensor) -> bool:
    """A tensor torch_xla can hash: a plain Tensor or Parameter on the XLA device, not a
    subclass (FakeTensor, FunctionalTensor, DTensor), whose hash aborts in a CHECK."""
    import torch

    return type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.device.type == "xla"


def held_tensors(frame) -> list:
    """The XLA tensors the user's frames hold, from `frame` outwards: their locals (a
    script's top level: its globals), looked into modules (parameters, buffers, gradients),
    optimizers (state) and containers; each once, in the order found. (`_get_graph_hash`
    covers the tensors a sync would run, those with no device data yet: a list that collects
    each step's loss kept one hash over four steps, measured on XLA:CPU.)

    A loop over a stack, not a recursive closure: a closure that calls itself is a reference
    cycle, which kept the tensors found alive until Python's cycle collector ran; a tensor
    the script had dropped was then still live at the next barrier, whose graph computed it
    too: a graph more to compile whenever the collector ran late (PyTorch-GAN's gan.py: a new
    graph at step 6, and slower steps)."""
    import torch

    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    values: list = []
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            values.extend((value, 0) for value in list(frame.f_locals.values()))
        frame = frame.f_back
    values.reverse()  # popped from the end: in the order found
    while values:
        value, depth = values.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        tensors: list = []
        if isinstance(value, torch.Tensor):
            tensors = [value, value.grad if value.requires_grad and value.is_leaf else None]
        elif isinstance(value, torch.nn.Module):
            for tensor in value.parameters():
                tensors += [tensor, tensor.grad]
            tensors += list(value.buffers())
        elif isinstance(value, torch.optim.Optimizer):
            for state in value.state.values():
                tensors += [item for item in state.values() if isinstance(item, torch.Tensor)]
            for group in value.param_groups:
                for tensor in group["params"]:
                    tensors += [tensor, tensor.grad]
        elif depth < _DEPTH and isinstance(value, (list, tuple, dict)) and len(value) <= _ITEMS:
            items = list(value.values() if isinstance(value, dict) else value)
            values.extend((item, depth + 1) for item in reversed(items))
        for tensor in tensors:
            if tensor is not None and _plain(tensor):
                found.setdefault(id(tensor), tensor)
    return list(found.values())
