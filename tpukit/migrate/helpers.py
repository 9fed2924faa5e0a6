"""Small functions a rewrite may need in the user's file, inserted once after the imports.

They exist where no torch_xla expression is both correct and crash-free, e.g. memory
statistics: `xm.get_memory_info` raises UNIMPLEMENTED on XLA:CPU.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate import library_mode

# What a legacy typed tensor does when called (both targets' `_XlaTensorType`/`_TpuTensorType`):
# sizes make an uninitialised tensor of its dtype on the device, data a copy of the data there.
_TENSOR_TYPE_CALL = '''    def __call__(self, *data):
        if not data:
            return torch.empty(0, dtype=self.dtype, device=self.device)
        if all(isinstance(d, int) for d in data) or (
                len(data) == 1 and isinstance(data[0], torch.Size)):
            return torch.empty(*data, dtype=self.dtype, device=self.device)
        (values,) = data
        return torch.as_tensor(values, dtype=self.dtype).to(self.device)
'''

SOURCES: dict[str, str] = {
    "_xla_memory_stat": '''
def _xla_memory_stat(key):
    """torch.cuda memory statistics on XLA (inserted by tpukit); 0 where the runtime
    cannot report them (XLA:CPU raises UNIMPLEMENTED)."""
    try:
        return xm.get_memory_info(torch_xla.device())[key]
    except RuntimeError:
        return 0
''',
    "_xla_launch_process_count": '''
def _xla_launch_process_count():
    """torch.cuda.device_count() next to torch_xla.launch (inserted by tpukit): the processes
    the launch starts on this host, counted as torch_xla counts them (TPU chips on the PCI
    bus), without starting the XLA runtime, which must not start before the launch."""
    if xr.device_type() == "TPU":
        from torch_xla._internal import tpu  # what torch_xla.launch itself asks (2.9)

        return tpu.num_local_processes()
    return 1  # torch_xla.launch starts one process on other devices (XLA:CPU included)
''',
    "_tpu_launch_process_count": '''
def _tpu_launch_process_count():
    """torch.cuda.device_count() next to mp.spawn on TorchTPU (inserted by tpukit): the TPU
    chips on this host, counted on the PCI bus as torch.tpu.distributed.set_tpu_launch_env
    counts them, without opening them (the launching process must not hold the chips its
    ranks open; torch.tpu.device_count is internal to TorchTPU and raises from user code)."""
    from torch_tpu._internal.utils import hardware  # what set_tpu_launch_env asks (0.2.0)

    return hardware.get_tpu_device_count()
''',
    "_XlaTimingEvent": '''
class _XlaTimingEvent:
    """torch.cuda.Event on XLA (inserted by tpukit): XLA has no streams or events, so record()
    cuts the graph, waits for the device to run it, and reads the host clock; elapsed_time() is
    the time between two records in milliseconds, as CUDA's."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self._seconds = None

    def record(self, stream=None):
        from time import perf_counter

        torch_xla.sync()
        xm.wait_device_ops()
        self._seconds = perf_counter()

    def synchronize(self):
        xm.wait_device_ops()

    def wait(self, stream=None):
        pass  # one XLA device queue: work recorded before is already ahead of what follows

    def query(self):
        return True

    def elapsed_time(self, end_event):
        if self._seconds is None or end_event._seconds is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end_event._seconds - self._seconds) * 1000.0
''',
    "_XlaTensorType": '''
class _XlaTensorType:
    """A CUDA typed tensor (`torch.cuda.FloatTensor` and friends) on XLA (inserted by tpukit):
    called with sizes it makes an uninitialised tensor of its dtype on the XLA device, called
    with data (a list, an array, a tensor) a copy of the data there, as the legacy type did;
    `x.type(T)` is written `x.to(T.device, T.dtype)`."""

    def __init__(self, dtype):
        self.dtype = dtype

    @property
    def device(self):
        return torch_xla.device()

''' + _TENSOR_TYPE_CALL,
    "_TpuTensorType": '''
class _TpuTensorType:
    """A CUDA typed tensor (`torch.cuda.FloatTensor` and friends) on TorchTPU (inserted by
    tpukit): called with sizes it makes an uninitialised tensor of its dtype on the TPU, called
    with data (a list, an array, a tensor) a copy of the data there, as the legacy type did;
    `x.type(T)` is written `x.to(T.device, T.dtype)`."""

    device = torch.device("tpu")

    def __init__(self, dtype):
        self.dtype = dtype

''' + _TENSOR_TYPE_CALL,
    "_xla_sync_batchnorm": '''
def _xla_sync_batchnorm(module, process_group=None):
    """nn.SyncBatchNorm.convert_sync_batchnorm on XLA (inserted by tpukit): SyncBatchNorm's
    kernels are CUDA's, so each BatchNorm of `module` keeps its class and state and, in
    training, normalizes with the batch statistics of every process, as SyncBatchNorm does:
    the mean and mean square summed with one xm.all_reduce a layer, the running statistics
    updated with the unbiased variance. With one process it is BatchNorm as it was."""
    import torch_xla.core.functions as xf

    def synced(layer):
        plain = layer.forward

        def forward(x):
            if not layer.training:
                return plain(x)  # SyncBatchNorm does not sync in eval either
            dims = [0, *range(2, x.dim())]
            shape = [1, -1] + [1] * (x.dim() - 2)
            world = xr.world_size()
            moments = xf.all_reduce(xm.REDUCE_SUM, torch.stack(
                [x.mean(dims), (x * x).mean(dims)]), scale=1.0 / world)
            mean = moments[0]
            var = (moments[1] - mean * mean).clamp(min=0)
            if layer.track_running_stats:
                with torch.no_grad():
                    layer.num_batches_tracked.add_(1)
                    factor = (1.0 / layer.num_batches_tracked if layer.momentum is None
                              else layer.momentum)
                    count = x.numel() // x.size(1) * world
                    layer.running_mean.mul_(1 - factor).add_(mean * factor)
                    layer.running_var.mul_(1 - factor).add_(
                        var * (count / max(count - 1, 1)) * factor)
            out = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + layer.eps)
            if layer.affine:
                out = out * layer.weight.view(shape) + layer.bias.view(shape)
            return out

        return forward

    if xr.world_size() > 1:
        for layer in module.modules():
            if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
                layer.forward = synced(layer)
    return module
''',
    "_inputs_to_device": '''
def _inputs_to_device(module):
    """DistributedDataParallel(device_ids=[i]) moved its forward's tensor inputs to device i;
    without device_ids (one device per process) nothing does: move them to the device of the
    model's parameters, as DDP did (inserted by tpukit)."""

    def move(value, device):
        if isinstance(value, torch.Tensor):
            return value.to(device)
        if isinstance(value, (list, tuple)):
            moved = [move(v, device) for v in value]
            return type(value)(*moved) if hasattr(value, "_fields") else type(value)(moved)
        if isinstance(value, dict):
            return type(value)((k, move(v, device)) for k, v in value.items())
        return value

    def hook(_, args, kwargs):
        device = next(module.parameters()).device
        return move(args, device), move(kwargs, device)

    module.register_forward_pre_hook(hook, with_kwargs=True)
    return module
''',
    "_tensors_to": '''
def _tensors_to(value, device):
    """What torch.load put on a CUDA device, moved to this one (inserted by tpukit): torch.load
    cannot map storage onto an XLA or TPU device, so it loads to the CPU and the tensors move
    here, inside the dicts, lists and tuples that hold them; anything else is as loaded."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return type(value)((k, _tensors_to(v, device)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_tensors_to(v, device) for v in value)
    return value
''',
    "_TpuModuleHolder": '''
class _TpuModuleHolder(torch.nn.DataParallel):
    """nn.DataParallel(module) as it runs with no GPU: the model called as it is and kept as
    `.module` (its own state_dict's keys under "module."), still a DataParallel for code that
    asks (`isinstance(net, nn.DataParallel)`), for code that reads `.module` of a model tpukit
    cannot follow (inserted by tpukit): one TorchTPU process drives one chip, so DataParallel's
    own set-up, which asks the device module for every chip, is not run."""

    def __init__(self, module):
        torch.nn.Module.__init__(self)
        self.module = module
        self.device_ids = []
        self.output_device = None
        self.src_device_obj = None
        self.dim = 0

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)
''',
    "_xla_weight_norm": '''
def _xla_weight_norm(module):
    """weight_norm on XLA (inserted by tpukit): torch_xla has no kernel for the fused weight
    norm, `aten::_weight_norm_interface` (its forward and backward run on the CPU, each
    cutting the step's graph); the composite form torch computes it by elsewhere,
    v * (g / ||v||), lowers. Registered once for the XLA device; `module` is returned."""
    global _XLA_WEIGHT_NORM
    if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_weight_norm", "AutogradXLA"):
        _XLA_WEIGHT_NORM = torch.library.Library("aten", "IMPL")
        _XLA_WEIGHT_NORM.impl(
            "_weight_norm", lambda v, g, dim=0: v * (g / torch.norm_except_dim(v, 2, dim)),
            "AutogradXLA")
    return module
''',
    "_xla_put": '''
def _xla_put(buffer, index, value):
    """`buffer[index] = value` at a Python-int position, as one graph for every position
    (inserted by tpukit): XLA bakes an int index into the graph, so a loop that writes a
    preallocated buffer and syncs each iteration compiled once per position. The position goes
    in as an index tensor; the value is cast and broadcast as the assignment would. Anything
    else (a position out of range, what is not a tensor) is assigned as written."""
    if not (isinstance(buffer, torch.Tensor) and buffer.dim() > 0 and type(index) is int
            and -buffer.shape[0] <= index < buffer.shape[0]):
        buffer[index] = value
        return
    value = torch.as_tensor(value, dtype=buffer.dtype, device=buffer.device)
    while value.dim() > buffer.dim() - 1 and value.shape[0] == 1:
        value = value[0]  # leading 1s, dropped as `__setitem__` drops them
    position = torch.tensor([index % buffer.shape[0]], device=buffer.device)
    buffer.index_copy_(0, position, value.expand(buffer.shape[1:]).unsqueeze(0))
''',
    "_xla_pointer": '''
def _xla_pointer(value):
    """`int(value)` of a position the code keeps in a tensor (a queue's pointer), kept on the
    device (inserted by tpukit): read back, it made the host wait at every call and put the
    position into the graph as a constant, one compile per position. A one-element integer
    tensor off the host gives a 0-d copy of itself; anything else is `int(value)`."""
    if (isinstance(value, torch.Tensor) and value.device.type != "cpu" and value.numel() == 1
            and not value.dtype.is_floating_point and not value.dtype.is_complex
            and value.dtype != torch.bool):
        return value.detach().reshape(()).clone()
    return int(value)
''',
    "_xla_put_slice": '''
def _xla_put_slice(buffer, dim, start, stop, value):
    """`buffer[:, ..., start:stop] = value`, the slice in dimension `dim` (`stop` None:
    `buffer[:, ..., start] = value`), with bounds held in tensors, as one graph for every
    position (inserted by tpukit): the bounds stay data instead of constants of the graph.
    Python's slice rules hold (negative bounds count from the end, then are clamped); the value
    is cast and broadcast as the assignment would. Bounds that are ints, or a buffer that is
    not a tensor, are assigned as written."""
    bounds = (start,) if stop is None else (start, stop)
    if not (isinstance(buffer, torch.Tensor)
            and any(isinstance(b, torch.Tensor) for b in bounds)):
        index = start if stop is None else slice(start, stop)
        buffer[(slice(None),) * dim + (index,)] = value
        return
    size = buffer.shape[dim]

    def bound(b):
        b = torch.as_tensor(b, device=buffer.device)
        return torch.where(b < 0, b + size, b).clamp(0, size)

    positions = torch.arange(size, device=buffer.device)
    value = torch.as_tensor(value, dtype=buffer.dtype, device=buffer.device)
    rows = buffer.dim() - (stop is None)  # the dimensions the value broadcasts to
    while value.dim() > rows and value.shape[0] == 1:
        value = value[0]  # leading 1s, dropped as `__setitem__` drops them
    value = value.reshape((1,) * (rows - value.dim()) + tuple(value.shape))
    if stop is None:
        inside = positions == bound(start)
        value = value.unsqueeze(dim)
    elif value.shape[dim] == 0:
        return  # an empty value fits an empty slice only: nothing is written
    else:
        low, high = bound(start), bound(stop)
        inside = (positions >= low) & (positions < high)
        value = value.index_select(dim, (positions - low).clamp(0, value.shape[dim] - 1))
    along = [1] * buffer.dim()
    along[dim] = size
    buffer.copy_(torch.where(inside.reshape(along), value.expand(buffer.shape), buffer))
''',
    "_xla_deferred": '''
def _xla_deferred(value, read=None):
    """`value.item()` (`read(value)` for `float(value)`, `int(value)`) of a number the code
    only sums for its logs, left on the device (inserted by tpukit): read back every step, it
    made the host wait for the device at each. A one-element tensor off the host is given as a
    0-d tensor (half precision widened to float32), summed on the device and read back where
    the code uses the sum (`_xla_value`); anything else is read as written."""
    if (isinstance(value, torch.Tensor) and value.device.type != "cpu" and value.numel() == 1
            and value.dtype != torch.bool and not value.dtype.is_complex
            and (read is None or (read is float) == value.dtype.is_floating_point)):
        value = value.detach().reshape(())
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    return value.item() if read is None else read(value)
''',
    "_xla_value": '''
def _xla_value(value):
    """The number a sum kept on the device (`_xla_deferred`) holds, read back where the code
    uses it (inserted by tpukit); anything else as it is."""
    return value.item() if isinstance(value, torch.Tensor) else value
''',
    "_xla_items": '''
def _xla_items(*values):
    """`v.item()` of each of `values` (inserted by tpukit): the XLA tensors among them read back
    in one transfer (one graph run for all), where each `.item()` ran the graph of its own
    tensor and waited for the device on its own; anything else through its own `.item()`."""
    on_xla = [v for v in values if isinstance(v, torch.Tensor) and v.device.type == "xla"]
    read = iter(torch_xla._XLAC._xla_get_cpu_tensors(on_xla) if on_xla else ())
    return [next(read).item() if isinstance(v, torch.Tensor) and v.device.type == "xla"
            else v.item() for v in values]
''',
    "_tensor_on_host": '''
def _tensor_on_host(value):
    """What a loop reads element by element to the host, copied there at once (inserted by
    tpukit): iterating a device tensor makes a graph per element and reads each back; its host
    copy gives the same values. Anything but a tensor is returned as it is."""
    return value.cpu() if isinstance(value, torch.Tensor) else value
''',
}
for _target, (_name, _) in library_mode.TESTS.items():
    SOURCES[_name] = library_mode.helper_source(_target)
IMPORTS_OF: dict[str, tuple[str, ...]] = {**{name: () for name, _ in library_mode.TESTS.values()},
                                          "_xla_memory_stat": ("xm", "torch_xla"),
                                          "_XlaTensorType": ("torch", "torch_xla"),
                                          "_TpuTensorType": ("torch", "torch_tpu"),
                                          "_XlaTimingEvent": ("xm", "torch_xla"),
                                          "_inputs_to_device": ("torch",),
                                          "_tensor_on_host": ("torch",),
                                          "_xla_put": ("torch",),
                                          "_xla_pointer": ("torch",),
                                          "_xla_put_slice": ("torch",),
                                          "_xla_deferred": ("torch",),
                                          "_xla_value": ("torch",),
                                          "_xla_items": ("torch", "torch_xla"),
                                          "_xla_weight_norm": ("torch",),
                                          "_TpuModuleHolder": ("torch",),
                                          "_tensors_to": ("torch",),
                                          "_xla_sync_batchnorm": ("torch", "xm", "xr"),
                                          "_xla_launch_process_count": ("xr",),
                                          "_tpu_launch_process_count": ()}


def _defined(module: cst.Module) -> set[str]:
    return {s.name.value for s in module.body if isinstance(s, (cst.FunctionDef, cst.ClassDef))}


def _imports_only(stmt: cst.CSTNode) -> bool:
    """A simple statement line of imports and nothing else."""
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
    )


def _after_imports(body: list) -> int:
    """The index after the last import of the file's opening block of imports (and docstring)."""
    position = 0
    for i, stmt in enumerate(body):
        if _imports_only(stmt):
            position = i + 1
        elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            break
    return position


def imports_module(module: cst.Module, name: str) -> bool:
    """Does the file import `name` (`import name`) at its top level?"""
    return any(
        isinstance(s, cst.Import) and any(a.name.value == name and a.asname is None for a in s.names)
        for stmt in module.body if _imports_only(stmt) for s in stmt.body
    )


def insert_statement(module: cst.Module, code: str) -> cst.Module:
    """`code` as a statement of its own right after the file's imports, set off by a blank line."""
    body = list(module.body)
    position = _after_imports(body)
    statement = cst.parse_statement(code + "\n").with_changes(leading_lines=[cst.EmptyLine()])
    if position < len(body) and not body[position].leading_lines:
        body[position] = body[position].with_changes(leading_lines=[cst.EmptyLine()])
    body.insert(position, statement)
    return module.with_changes(body=body)


def insert(module: cst.Module, names: set[str]) -> cst.Module:
    missing = sorted(names - _defined(module))
    if not missing:
        return module
    body = list(module.body)
    position = _after_imports(body)
    new = []
    for name in missing:
        func = cst.parse_statement(SOURCES[name].strip() + "\n")
        new.append(func.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]))
    if position < len(body):  # two blank lines after a top-level definition (PEP 8)
        following = body[position]
        lines = list(following.leading_lines)
        blank = 0
        while blank < len(lines) and lines[blank].comment is None:
            blank += 1
        if blank < 2:
            body[position] = following.with_changes(
                leading_lines=[cst.EmptyLine()] * (2 - blank) + lines)
    body[position:position] = new
    return module.with_changes(body=body)
