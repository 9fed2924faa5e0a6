"""The runtime layer's patches of torch: CUDA devices, the torch.cuda calls that have an XLA
meaning, CUDA autocast and GradScaler, and a clear error for the calls that have none.

Each redirect does what `tpukit migrate` writes for the same call (TPU101/102 devices,
TPU112 synchronize, TPU113 seeds, TPU114 memory statistics, TPU115 events, TPU116 NVTX,
TPU201/203 fp16 autocast and its scaler, TPU305 map_location), at run time. What it never
changes: the host's answer to "is there CUDA" (`torch.cuda.is_available()`,
`device_count()`, `Tensor.is_cuda`), so that no library enters a CUDA-only kernel path."""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import time
import tomllib

import torch

from tpukit.run.patches.base import Patch
from tpukit.shim.batchnorm import sync_batchnorm
from tpukit.shim.sites import CallSites

_DEVICE_TYPES = (str, torch.device, int)


class _CudaToCpu(dict):
    """A torch.load map_location that sends every CUDA location ("cuda", "cuda:3") to the CPU,
    leaves the others where they are, and remembers the CUDA ones it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def get(self, location, default=None):
        if str(location).startswith("cuda"):
            self.seen.append(str(location))
            return "cpu"
        return default if default is not None else location


def catalog() -> dict:
    """rules/catalog/shim.toml."""
    from tpukit.rules import rules_dir

    return _catalog(rules_dir())


@functools.cache
def _catalog(folder) -> dict:
    return tomllib.loads((folder / "catalog" / "shim.toml").read_text(encoding="utf-8"))


def is_cuda(device) -> bool:
    """Does a device argument name CUDA: "cuda", "cuda:N", torch.device("cuda"), or an integer
    index (torch reads a bare index as a CUDA device)?"""
    kind = type(device)
    if kind is str:
        return device == "cuda" or device.startswith("cuda:")
    if kind is torch.device:
        return device.type == "cuda"
    return kind is int


class CudaCallRefused(RuntimeError):
    """A CUDA-only call with no TPU meaning, raised by the runtime layer."""


class XlaBackend:
    """What a redirect does on torch_xla."""

    name = "XLA"
    device_type = "xla"
    synchronized = "ran the pending graph and waited for the XLA device (torch_xla.sync(); xm.wait_device_ops())"
    seeded = "seeded the XLA device's generator"
    memory_read = "read {key} of xm.get_memory_info (0 where the runtime cannot report memory, as on XLA:CPU)"
    peak_reset = "nothing to reset: XLA's peak memory statistic cannot be reset"
    traced = "an XProf trace scope (torch_xla.debug.profiler.Trace)"

    def __init__(self) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm

        self._torch_xla, self._xm = torch_xla, xm
        self._device = None

    def device(self) -> torch.device:
        if self._device is None:
            self._device = self._torch_xla.device()
        return self._device

    def synchronize(self) -> None:
        self._torch_xla.sync()
        self._xm.wait_device_ops()

    def wait(self) -> None:
        self._xm.wait_device_ops()

    def memory(self) -> dict | None:
        """xm.get_memory_info of the device; None where the runtime cannot report it
        (XLA:CPU raises UNIMPLEMENTED)."""
        try:
            return self._xm.get_memory_info(self.device())
        except RuntimeError:
            return None

    def seed(self, seed: int) -> None:
        self._torch_xla.manual_seed(seed)

    def trace(self, name: str):
        import torch_xla.debug.profiler as xp

        return xp.Trace(name)

    def process_group_backend(self) -> str:
        import torch_xla.distributed.xla_backend  # noqa: F401  (registers "xla")

        return "xla"


class CpuBackend:
    """The layer's other target: the CPU, for running an original CUDA script as the reference
    on a host without CUDA (the corpus harness's and `tpukit verify`'s original side). The CPU
    computes eagerly: nothing to wait for; CUDA seeds seed CUDA's generator on a GPU and leave the
    CPU's alone, so here they do nothing; CUDA autocast and GradScaler are left as written (the
    autocast does nothing to CPU tensors: the reference stays float32)."""

    name = "CPU"
    device_type = "cpu"
    synchronized = "nothing to wait for: the CPU computes eagerly"
    seeded = "nothing: CUDA's generator is not the CPU's, whose stream stays as it was"
    memory_read = "0: the CPU has no device memory to count"
    peak_reset = "nothing to reset: the CPU has no device memory statistics"
    traced = "a PyTorch profiler range (torch.profiler.record_function)"

    def device(self) -> torch.device:
        return torch.device("cpu")

    def synchronize(self) -> None:
        pass

    def wait(self) -> None:
        pass

    def memory(self) -> dict | None:
        return None

    def seed(self, seed: int) -> None:
        pass

    def trace(self, name: str):
        return torch.profiler.record_function(name)

    def process_group_backend(self) -> str:
        return "gloo"


BACKENDS = {"xla": XlaBackend, "cpu": CpuBackend}


class Layer(Patch):
    """The patches, each recording its call sites in `sites`."""

    def __init__(self, sites: CallSites, backend=None) -> None:
        super().__init__()
        self.sites = sites
        self.backend = backend or XlaBackend()
        self._ranges: list = []

    # -- the mechanism -------------------------------------------------------------------

    def _device(self, api: str, device, depth: int = 3) -> torch.device:
        self.sites.note(api, f"put on the {self.backend.name} device instead of {_shown(device)}",
                        depth)
        return self.backend.device()

    def _refuse(self, api: str, why: str, depth: int = 3):
        record = self.sites.note(api, why, depth, refused=True)
        where = f"{record.path}:{record.line}"
        if record.program_path and not record.in_program:
            where += f", reached from {record.program_path}:{record.program_line}"
        raise CudaCallRefused(
            f"tpukit runtime layer: {api} has no TPU meaning ({why}); called at {where}. "
            "Ask torch.cuda.is_available() first (False on this host) or remove the call")

    def uninstall(self) -> None:
        while self._ranges:  # ranges pushed and never popped end with the layer
            self._ranges.pop().__exit__(None, None, None)
        super().uninstall()

    def install(self, probe=None) -> None:
        data = catalog()
        for name in data["factories"]:
            self._factory(torch, name, f"torch.{name}")
        for name in data["tensor_factories"]:
            self._factory(torch.Tensor, name, f"Tensor.{name}")
        self._moves()
        self._cuda_api(data["refused"])
        self._amp()
        self._load()
        self._distributed()

    def _factory(self, owner, name: str, api: str) -> None:
        original = getattr(owner, name)
        layer = self

        def factory(*args, **kwargs):
            device = kwargs.get("device")
            if device is not None and is_cuda(device):
                kwargs["device"] = layer._device(f"{api}(device=...)", device)
            return original(*args, **kwargs)

        functools.update_wrapper(factory, original)
        self.replace(owner, name, factory)
        _script_as(factory, original)

    # -- devices: .to / .cuda on tensors and modules ------------------------------------

    def _moves(self) -> None:
        layer = self
        tensor_to = torch.Tensor.to
        module_to = torch.nn.Module.to
        record_stream = torch.Tensor.record_stream

        def moves(api: str, original):
            """`.to(...)`: a CUDA device, positional or `device=`, becomes ours."""
            def to(self, *args, **kwargs):
                if args and type(args[0]) in _DEVICE_TYPES and is_cuda(args[0]):
                    args = (layer._device(api, args[0]), *args[1:])
                elif "device" in kwargs and is_cuda(kwargs["device"]):
                    kwargs["device"] = layer._device(api, kwargs["device"])
                return original(self, *args, **kwargs)
            return to

        def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
            return tensor_to(self, layer._device("Tensor.cuda()", device or "cuda"),
                             non_blocking=non_blocking, memory_format=memory_format)

        def pin_memory(self, device=None):
            layer.sites.note("Tensor.pin_memory()", "left in pageable host memory: there is no "
                             "CUDA host to pin for (the runtime copies to the device itself)")
            return self

        def stream_use(self, stream):
            if isinstance(stream, _Stream):
                return None
            return record_stream(self, stream)

        def module_cuda(self, device=None):
            return module_to(self, layer._device("Module.cuda()", device or "cuda"))

        for owner, name, replacement in (
                (torch.Tensor, "to", moves("Tensor.to(device)", tensor_to)),
                (torch.Tensor, "cuda", cuda),
                (torch.Tensor, "pin_memory", pin_memory),
                (torch.Tensor, "record_stream", stream_use),
                (torch.nn.Module, "to", moves("Module.to(device)", module_to)),
                (torch.nn.Module, "cuda", module_cuda)):
            functools.update_wrapper(replacement, getattr(owner, name))
            self.replace(owner, name, replacement)

    # -- torch.cuda ------------------------------------------------------------------------

    def _cuda_api(self, refused: dict) -> None:
        layer, backend, note = self, self.backend, self.sites.note
        cuda = torch.cuda

        def synchronize(device=None):
            note("torch.cuda.synchronize", backend.synchronized)
            backend.synchronize()

        def seed(api: str, value, depth: int) -> None:
            note(api, backend.seeded, depth)
            backend.seed(int(value))

        def manual_seed(seed_value):
            seed("torch.cuda.manual_seed", seed_value, 3)

        seed_all = cuda.manual_seed_all
        torch_files = layer.sites.torch_root

        def manual_seed_all(seed_value):
            # torch.manual_seed and torch.seed call it for every device type: torch's own
            # bookkeeping, not a CUDA call of the program's
            if torch_files and sys._getframe(1).f_code.co_filename.startswith(torch_files):
                return seed_all(seed_value)
            seed("torch.cuda.manual_seed_all", seed_value, 3)

        def memory_stat(api: str, key: str):
            def stat(device=None):
                note(api, backend.memory_read.format(key=key))
                info = backend.memory()
                return int(info.get(key, 0)) if info else 0
            return stat

        def reset_peak(api: str):
            def reset(device=None):
                note(api, backend.peak_reset)
            return reset

        def mem_get_info(device=None):
            info = backend.memory()
            if not info or "bytes_limit" not in info:
                layer._refuse("torch.cuda.mem_get_info", refused["mem_get_info"] +
                              " (this runtime reports none)")
            note("torch.cuda.mem_get_info", "(bytes_limit - bytes_used, bytes_limit) of "
                 "xm.get_memory_info")
            return info["bytes_limit"] - info["bytes_used"], info["bytes_limit"]

        def set_device(device):
            note("torch.cuda.set_device", f"nothing to do: each process has one "
                 f"{backend.name} device")

        def current_device():
            note("torch.cuda.current_device", f"the index of the process's {backend.name} device")
            return backend.device().index or 0

        def stream_api(api: str):
            def make(*args, **kwargs):
                note(api, f"a stand-in: {backend.name} runs a device's work in one order "
                     "(synchronize() waits for the device; waits and records do nothing)")
                return _Stream(backend)
            return make

        def stream(stream=None):
            note("torch.cuda.stream", f"a context that does nothing: {backend.name} runs a "
                 "device's work in one order")
            return contextlib.nullcontext(stream)

        def set_stream(stream):
            note("torch.cuda.set_stream", f"nothing to do: {backend.name} runs a device's "
                 "work in one order")

        class Event(_TimingEvent):
            def __init__(self, enable_timing=False, blocking=False, interprocess=False,
                         external=False):
                note("torch.cuda.Event", "a host-timed event: record() runs the pending "
                     "graph, waits for the device and reads the clock; elapsed_time() is in ms")
                super().__init__(backend)

        class device:
            def __init__(self, device):
                note("torch.cuda.device", f"a context that does nothing: each process has one "
                     f"{backend.name} device")

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        replacements = {
            "synchronize": synchronize, "manual_seed": manual_seed,
            "manual_seed_all": manual_seed_all, "set_device": set_device,
            "current_device": current_device, "mem_get_info": mem_get_info,
            "memory_allocated": memory_stat("torch.cuda.memory_allocated", "bytes_used"),
            "memory_reserved": memory_stat("torch.cuda.memory_reserved", "bytes_used"),
            "max_memory_allocated": memory_stat("torch.cuda.max_memory_allocated",
                                                "peak_bytes_used"),
            "max_memory_reserved": memory_stat("torch.cuda.max_memory_reserved",
                                               "peak_bytes_used"),
            "reset_peak_memory_stats": reset_peak("torch.cuda.reset_peak_memory_stats"),
            "reset_max_memory_allocated": reset_peak("torch.cuda.reset_max_memory_allocated"),
            "Stream": stream_api("torch.cuda.Stream"),
            "current_stream": stream_api("torch.cuda.current_stream"),
            "default_stream": stream_api("torch.cuda.default_stream"),
            "stream": stream, "set_stream": set_stream, "Event": Event, "device": device,
        }
        for name, why in refused.items():
            if name not in replacements:
                replacements[name] = self._refusal(f"torch.cuda.{name}", why,
                                                   isinstance(getattr(cuda, name), type))
        for name, replacement in replacements.items():
            self.replace(cuda, name, replacement)
        self._nvtx()

    def _refusal(self, api: str, why: str, is_class: bool):
        layer = self

        def refuse(*args, **kwargs):
            layer._refuse(api, why)

        if not is_class:
            return refuse
        # a class stays a class: `isinstance(x, torch.cuda.CUDAGraph)` still answers
        return type(api.rsplit(".", 1)[-1], (), {"__new__": lambda cls, *a, **k: refuse()})

    def _nvtx(self) -> None:
        nvtx, backend, note, ranges = torch.cuda.nvtx, self.backend, self.sites.note, self._ranges
        action = backend.traced

        def range_push(msg):
            note("torch.cuda.nvtx.range_push", action)
            scope = backend.trace(str(msg))
            scope.__enter__()
            ranges.append(scope)
            return len(ranges) - 1

        def range_pop():
            note("torch.cuda.nvtx.range_pop", action)
            if not ranges:
                return -1
            ranges.pop().__exit__(None, None, None)
            return len(ranges)

        def range_(msg, *args, **kwargs):
            note("torch.cuda.nvtx.range", action)
            return backend.trace(str(msg).format(*args, **kwargs))

        def mark(msg):
            note("torch.cuda.nvtx.mark", "nothing: no instant markers off CUDA")

        for name, replacement in (("range_push", range_push), ("range_pop", range_pop),
                                  ("range", range_), ("mark", mark)):
            self.replace(nvtx, name, replacement)

    # -- autocast, GradScaler ------------------------------------------------------------

    def _amp(self) -> None:
        note, backend = self.sites.note, self.backend
        if backend.device_type == "cpu":  # the reference runs them as written
            return
        autocast = torch.amp.autocast_mode.autocast
        scaler = torch.amp.grad_scaler.GradScaler
        autocast_init = autocast.__init__
        ours = backend.device_type

        def start(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                if dtype is None or dtype == torch.float16:
                    note("torch.autocast('cuda')", f"float16 autocast on CUDA became bfloat16 "
                         f"autocast on {backend.name}: TPUs compute in bfloat16")
                    dtype = torch.bfloat16
                else:
                    note("torch.autocast('cuda')", f"autocast on CUDA became autocast on "
                         f"{backend.name}, in {dtype}")
                device_type = ours
            autocast_init(self, device_type, dtype=dtype, enabled=enabled,
                          cache_enabled=cache_enabled)

        def scale(arguments) -> None:
            if arguments["device"] == "cuda" and arguments["enabled"]:
                note("GradScaler('cuda')", "disabled: bfloat16 needs no loss scaling "
                     "(scale() returns the loss, step() calls the optimizer's step)")
                arguments["enabled"] = False

        functools.update_wrapper(start, autocast_init)
        self.replace(autocast, "__init__", start)
        self._adjusted(scaler, "__init__", scale)

    def _adjusted(self, owner, name: str, adjust, *also) -> None:
        """Replaces `owner.name` (and the same function at each `also` owner) with a wrapper
        that binds the call's arguments to its signature and lets `adjust(arguments)` change
        them before the call."""
        original = getattr(owner, name)
        signature = inspect.signature(original)

        def wrapper(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            adjust(bound.arguments)
            return original(*bound.args, **bound.kwargs)

        functools.update_wrapper(wrapper, original)
        for where in (owner, *also):
            self.replace(where, name, wrapper)

    # -- torch.distributed -----------------------------------------------------------------

    def _distributed(self) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
        from torch.nn.parallel import DistributedDataParallel

        if not dist.is_available():
            return
        note, backend = self.sites.note, self.backend

        def process_group(arguments) -> None:
            chosen = arguments.get("backend")
            if isinstance(chosen, str) and "nccl" in chosen.lower().split(":")[-1].split(","):
                ours = backend.process_group_backend()
                note("init_process_group(backend='nccl')", f"NCCL is CUDA's: the process group "
                     f"runs on {ours!r}, the {backend.name} backend")
                arguments["backend"] = ours

        def device_ids(arguments) -> None:
            module = arguments.get("module")
            first = next(module.parameters(), None) if module is not None else None
            if arguments.get("device_ids") and first is not None \
                    and first.device.type == backend.device_type:
                note("DistributedDataParallel(device_ids=...)", f"device_ids name CUDA devices; "
                     f"a module on the {backend.name} device takes none (device_ids=None)")
                arguments["device_ids"] = arguments["output_device"] = None

        self._adjusted(distributed_c10d, "init_process_group", process_group, dist)
        self._adjusted(DistributedDataParallel, "__init__", device_ids)
        sync_batchnorm(self, dist)

    # -- torch.load ------------------------------------------------------------------------

    def _load(self) -> None:
        load, note = torch.load, self.sites.note

        def load_(f, map_location=None, *args, **kwargs):
            if map_location is not None and type(map_location) in _DEVICE_TYPES \
                    and is_cuda(map_location):
                note("torch.load(map_location=cuda)", "loaded to the CPU (map_location='cpu'): "
                     "load_state_dict or .to(device) moves the tensors")
                map_location = "cpu"
            elif map_location is None:
                # CUDA's storages stay on the CPU, the others go where torch puts them. A
                # mapping, not a function: torch refuses a callable map_location for the
                # tensors it rebuilds as wrapper subclasses (XLA tensors pickled whole, a
                # word-language model's `torch.save(model, f)`: "Callable map_location not
                # supported with _rebuild_wrapper_subclass"), and reads a dict's `get`.
                saved_on_cuda = _CudaToCpu()
                loaded = load(f, saved_on_cuda, *args, **kwargs)
                if saved_on_cuda.seen:
                    note("torch.load", "storages saved on CUDA stayed on the CPU: "
                         "load_state_dict or .to(device) moves them")
                return loaded
            return load(f, map_location, *args, **kwargs)

        functools.update_wrapper(load_, load)
        self.replace(torch, "load", load_)


class _Stream:
    """torch.cuda.Stream's surface on a device that runs its work in one order."""

    def __init__(self, backend) -> None:
        self._backend = backend

    def synchronize(self) -> None:
        self._backend.wait()

    def query(self) -> bool:
        return True

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or _TimingEvent(self._backend)
        event.record()
        return event

    def __eq__(self, other) -> bool:
        return isinstance(other, _Stream)

    def __hash__(self) -> int:
        return 0


class _TimingEvent:
    """torch.cuda.Event on XLA: record() cuts the graph, waits for the device and reads the
    host clock; elapsed_time() is the time between two records in milliseconds, as CUDA's."""

    def __init__(self, backend) -> None:
        self._backend = backend
        self._seconds: float | None = None

    def record(self, stream=None) -> None:
        self._backend.synchronize()
        self._seconds = time.perf_counter()

    def synchronize(self) -> None:
        self._backend.wait()

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "_TimingEvent") -> float:
        if self._seconds is None or end._seconds is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end._seconds - self._seconds) * 1000.0


def _shown(device) -> str:
    return repr(str(device)) if not isinstance(device, int) else f"CUDA index {device}"


def _script_as(wrapper, original) -> None:
    """TorchScript compiles a call of a torch builtin to its aten op: the wrapper is told as
    that op too (timm and others script functions that call torch.zeros at import)."""
    try:
        from torch.jit._builtins import _find_builtin, _register_builtin
    except ImportError:
        return
    op = _find_builtin(original)
    if op is not None:
        _register_builtin(wrapper, op)
