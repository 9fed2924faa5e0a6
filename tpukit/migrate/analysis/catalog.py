"""What the APIs a program calls give back, by qualified name: the sources of the value
analysis (values.py). A value's kind comes from here, or from the dataflow that carries it;
never from the name of the variable that holds it."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass

# Kinds of values (values.py computes a frozenset of these for an expression).
DEVICE = "device"  # a device, as an object or a string
CUDA = "cuda"  # ... that is (or may be) CUDA's: "cuda", "cuda:0", torch.device("cuda")
DEVICE_TYPE = "device_type"  # `x.device.type`, the type string of a device
CUDA_QUESTION = "cuda_question"  # a bool that asks the host's CUDA
GPU_COUNT = "gpu_count"  # how many CUDA devices the host has
LOADER = "loader"  # a DataLoader (batches come from it)
SAMPLER = "sampler"
BATCH = "batch"  # what iterating a loader gives
OPTIMIZER = "optimizer"
SCHEDULER = "scheduler"
SCALER = "scaler"  # a GradScaler
MODULE = "module"  # an nn.Module
DATA_PARALLEL = "data_parallel"  # a model nn.DataParallel wraps
TENSOR = "tensor"
BOOL = "bool"  # a boolean tensor (a mask): `x > 0`, `torch.isnan(x)`, `m.bool()`
RANK = "rank"  # this process's rank or local rank
WORLD = "world_size"
BACKEND = "backend"  # a process group backend name
ARGS = "argparse_namespace"
PARSER = "argparse_parser"
STATE = "state_dict"
ACCELERATOR = "accelerator"  # accelerate's Accelerator
PREPARED = "prepared"  # what Accelerator.prepare gave back (it places batches itself)
DEVICE_LOADER = "device_loader"  # a loader that puts its batches on the device (MpDeviceLoader)
NUMPY = "numpy"
DTYPE = "dtype"
STRING = "string"
NUMBER = "number"
CONTAINER = "container"  # a dict, list or tuple made in the file
NUMBERS = "numbers"  # a list, tuple or range of numbers (device_ids: CUDA device indices)
GENERATOR = "generator"  # what one of the file's generator functions gives
SCALE = "scale"  # multiplies or divides something (a batch size by a GPU count)
STRING_USE = "string_use"  # compared as a string, a str method called on it (a use)
PROCESS_COUNT = "process_count"  # how many processes a launcher starts
AUTOCAST_DTYPE = "autocast_dtype"  # given as an autocast's dtype (a use)

# Calls (by qualified name, or a prefix ending in ".") and what they return.
CALLS: dict[str, frozenset[str]] = {
    "torch.device": frozenset({DEVICE}),
    "torch_xla.device": frozenset({DEVICE}),
    "torch_xla.core.xla_model.xla_device": frozenset({DEVICE}),
    "torch.accelerator.current_accelerator": frozenset({DEVICE, CUDA}),
    "torch.cuda.current_device": frozenset({DEVICE, CUDA}),
    "torch.cuda.is_available": frozenset({CUDA_QUESTION}),
    "torch.accelerator.is_available": frozenset({CUDA_QUESTION}),
    "torch.cuda.is_initialized": frozenset({CUDA_QUESTION}),
    "torch.cuda.device_count": frozenset({GPU_COUNT}),
    "torch.accelerator.device_count": frozenset({GPU_COUNT}),
    "torch.utils.data.DataLoader": frozenset({LOADER}),
    "torch.utils.data.dataloader.DataLoader": frozenset({LOADER}),
    "torch_xla.distributed.parallel_loader.MpDeviceLoader": frozenset({LOADER, DEVICE_LOADER}),
    "torch.utils.data.DistributedSampler": frozenset({SAMPLER}),
    "torch.utils.data.distributed.DistributedSampler": frozenset({SAMPLER}),
    "torch.utils.data.RandomSampler": frozenset({SAMPLER}),
    "torch.utils.data.SequentialSampler": frozenset({SAMPLER}),
    "torch.utils.data.BatchSampler": frozenset({SAMPLER}),
    "torch.optim.lr_scheduler.": frozenset({SCHEDULER}),
    "torch.optim.": frozenset({OPTIMIZER}),
    "torch.distributed.optim.ZeroRedundancyOptimizer": frozenset({OPTIMIZER}),
    "torch.cuda.amp.GradScaler": frozenset({SCALER}),
    "torch.amp.GradScaler": frozenset({SCALER}),
    "torch.amp.grad_scaler.GradScaler": frozenset({SCALER}),
    "torch.nn.parallel.DistributedDataParallel": frozenset({MODULE}),
    "torch.nn.DataParallel": frozenset({MODULE, DATA_PARALLEL}),
    "torch.nn.parallel.DataParallel": frozenset({MODULE, DATA_PARALLEL}),
    "torch.nn.parallel.data_parallel.DataParallel": frozenset({MODULE, DATA_PARALLEL}),
    "torch.nn.": frozenset({MODULE}),
    "torchvision.models.": frozenset({MODULE}),
    "torch.distributed.get_rank": frozenset({RANK}),
    "torch.distributed.get_local_rank": frozenset({RANK}),
    "torch.distributed.get_node_local_rank": frozenset({RANK}),
    "torch_xla.core.xla_model.get_ordinal": frozenset({RANK}),
    "torch_xla.core.xla_model.get_local_ordinal": frozenset({RANK}),
    "torch_xla.runtime.global_ordinal": frozenset({RANK}),
    "torch_xla.runtime.local_ordinal": frozenset({RANK}),
    "torch.distributed.get_world_size": frozenset({WORLD}),
    "os.getpid": frozenset({RANK}),  # one value per process, as a rank
    "torch_xla.core.xla_model.xrt_world_size": frozenset({WORLD}),
    "torch_xla.runtime.world_size": frozenset({WORLD}),
    "argparse.ArgumentParser": frozenset({PARSER}),
    "accelerate.Accelerator": frozenset({ACCELERATOR}),
    "accelerate.data_loader.prepare_data_loader": frozenset({LOADER, PREPARED}),
    "accelerate.prepare_data_loader": frozenset({LOADER, PREPARED}),
    "numpy.": frozenset({NUMPY}),
    "torch.isnan": frozenset({TENSOR, BOOL}), "torch.isinf": frozenset({TENSOR, BOOL}),
    "torch.isfinite": frozenset({TENSOR, BOOL}), "torch.logical_and": frozenset({TENSOR, BOOL}),
    "torch.logical_or": frozenset({TENSOR, BOOL}), "torch.logical_not": frozenset({TENSOR, BOOL}),
    "torch.eq": frozenset({TENSOR, BOOL}), "torch.ne": frozenset({TENSOR, BOOL}),
    "torch.gt": frozenset({TENSOR, BOOL}), "torch.lt": frozenset({TENSOR, BOOL}),
    "torch.ge": frozenset({TENSOR, BOOL}), "torch.le": frozenset({TENSOR, BOOL}),
    "torch.nn.functional.": frozenset({TENSOR}),
    "torch.nn.utils.": frozenset({TENSOR}),
    "torch.nn.init.": frozenset({TENSOR}),
    # torch's namespaces of things that are not tensors
    "torch.cuda.": frozenset(), "torch.distributed.": frozenset(), "torch.utils.": frozenset(),
    "torch.backends.": frozenset(), "torch.multiprocessing.": frozenset(),
    "torch.autograd.": frozenset(), "torch.amp.": frozenset(), "torch.profiler.": frozenset(),
    "torch.jit.": frozenset(), "torch.compile": frozenset(), "torch.manual_seed": frozenset(),
    "torch.no_grad": frozenset(), "torch.inference_mode": frozenset(),
    "torch.save": frozenset(), "torch.load": frozenset({STATE}),
    "torch.": frozenset({TENSOR}),  # the rest of torch's functions make tensors
}
# Names that are values, not calls: `torch.float16` is a dtype.
VALUES: dict[str, frozenset[str]] = {
    "torch.float16": frozenset({DTYPE}), "torch.half": frozenset({DTYPE}),
    "torch.bfloat16": frozenset({DTYPE}), "torch.float32": frozenset({DTYPE}),
    "torch.float": frozenset({DTYPE}), "torch.float64": frozenset({DTYPE}),
    "torch.int64": frozenset({DTYPE}), "torch.long": frozenset({DTYPE}),
    "torch.int32": frozenset({DTYPE}), "torch.bool": frozenset({DTYPE}),
}
# Classes whose subclasses' instances are of a kind.
BASES: dict[str, str] = {
    "torch.nn.Module": MODULE,
    "torch.optim.Optimizer": OPTIMIZER,
    "torch.optim.optimizer.Optimizer": OPTIMIZER,
    "torch.utils.data.DataLoader": LOADER,
    "torch.optim.lr_scheduler.LRScheduler": SCHEDULER,
    "torch.optim.lr_scheduler._LRScheduler": SCHEDULER,
    "accelerate.Accelerator": ACCELERATOR,
}
# Environment variables the launchers set, and what they hold.
LAUNCHER_ENV = {"RANK": RANK, "LOCAL_RANK": RANK, "WORLD_SIZE": WORLD,
                "LOCAL_WORLD_SIZE": WORLD, "GROUP_RANK": RANK, "NODE_RANK": RANK,
                "SLURM_PROCID": RANK, "SLURM_LOCALID": RANK, "SLURM_NTASKS": WORLD,
                "OMPI_COMM_WORLD_RANK": RANK, "OMPI_COMM_WORLD_LOCAL_RANK": RANK,
                "OMPI_COMM_WORLD_SIZE": WORLD, "PMI_RANK": RANK, "PMI_SIZE": WORLD}
# The options the launchers pass each process (`torch.distributed.launch --local-rank=N`).
LAUNCHER_OPTIONS = {"local_rank": RANK}
# Calls that start processes, each running `fn(index, *args)`: the index is a rank.
SPAWNS = {"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes",
          "torch_xla.distributed.xla_multiprocessing.spawn", "torch_xla.launch"}
# Methods whose result keeps the kind of the object they are called on.
SAME_KIND_METHODS = frozenset({"to", "cuda", "cpu", "half", "float", "double", "bfloat16",
                               "train", "eval", "requires_grad_", "contiguous", "detach",
                               "clone", "share_memory", "type"})
# Calls that give back what they are given, wrapped (`model = torch.compile(model)`).
SAME_KIND_CALLS = frozenset({"torch.compile", "torch.jit.script"})
# Keywords that take CUDA device indices: `DDP(m, device_ids=[rank], output_device=rank)`.
DEVICE_INDEX_KEYWORDS = frozenset({"device_ids", "output_device"})
# Where a call takes its CUDA device indices by position (`DataParallel(net, gpu_ids)`).
DEVICE_IDS_POSITION = {"torch.nn.DataParallel": 1, "torch.nn.parallel.DataParallel": 1,
                       "torch.nn.parallel.data_parallel.DataParallel": 1,
                       "torch.nn.parallel.DistributedDataParallel": 1}
# Iterating these gives what iterating their first argument gives (enumerate's index aside).
ITER_WRAPPERS = frozenset({"enumerate", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "iter",
                           "tqdm.notebook.tqdm", "zip"})
# Keyword arguments of torch calls that take a device.
DEVICE_KEYWORDS = frozenset({"device", "map_location", "device_type"})
# A str method called on a value says it is a string.
STR_METHODS = frozenset({"startswith", "endswith", "split", "rsplit", "partition", "lower",
                         "upper", "strip", "replace", "format", "join"})
# Calls that take a device *type* string first (torch.autocast("cuda", ...)).
DEVICE_TYPE_CALLS = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler",
                               "torch.cuda.amp.autocast", "torch.get_autocast_dtype"})
# Autocast contexts, whose `dtype=` is the dtype mixed precision computes in.
AUTOCAST_CALLS = frozenset({"torch.autocast", "torch.amp.autocast",
                            "torch.amp.autocast_mode.autocast", "torch.cuda.amp.autocast",
                            "torch.cuda.amp.autocast_mode.autocast"})
# Calls that bind arguments of the callable they are given first (`partial(torch.autocast,
# dtype=amp_dtype)`).
BINDERS = frozenset({"functools.partial"})
# Calls that take a process group backend.
BACKEND_CALLS = {"torch.distributed.init_process_group": ("backend", 0),
                 "torch.distributed.new_group": ("backend", 2)}
# What a call with a device argument takes it as: `.to(x)`, `torch.device(x)`.
DEVICE_CALLS = frozenset({"torch.device"})


def call_kinds(qualified: str | None) -> frozenset[str] | None:
    """What calling `qualified` returns, from CALLS (an exact name, else the longest prefix)."""
    if not qualified:
        return None
    exact = CALLS.get(qualified)
    if exact is not None:
        return exact
    best = None
    for prefix, kinds in CALLS.items():
        if prefix.endswith(".") and qualified.startswith(prefix) and (
                best is None or len(prefix) > len(best[0])):
            best = (prefix, kinds)
    return best[1] if best else None

# Methods and attributes only objects of one kind have: using one says what the object is
# (`opt.param_groups`, `loader.sampler.set_epoch(e)`: values.py reads these where the sources
# of a value are out of sight, such as an optimizer a model of another module builds).
METHOD_SAYS = {"zero_grad": None, "param_groups": None, "add_param_group": OPTIMIZER,
               "backward": TENSOR,
               "named_parameters": MODULE, "parameters": MODULE, "load_state_dict": None,
               "register_forward_hook": MODULE, "named_modules": MODULE, "modules": MODULE}
METHOD_SAYS = {k: v for k, v in METHOD_SAYS.items() if v is not None}
ATTRIBUTE_SAYS = {"param_groups": OPTIMIZER}
# A kind a use says is not taken where the value's sources say one of these.
EXCLUSIVE = {DEVICE: frozenset({DTYPE, TENSOR, MODULE, NUMBER, RANK, WORLD}), LOADER: frozenset({SAMPLER}), MODULE: frozenset({OPTIMIZER, LOADER}),
             OPTIMIZER: frozenset({MODULE, SCHEDULER, SCALER}),
             NUMBERS: frozenset({DEVICE, TENSOR, MODULE, LOADER, OPTIMIZER, STRING, BATCH})}
# accelerate's Accelerator methods that give back what they are given, prepared.
PREPARES = frozenset({"prepare", "prepare_data_loader", "prepare_model", "prepare_optimizer",
                      "prepare_scheduler"})
PREPARABLE = frozenset({LOADER, MODULE, OPTIMIZER, SCHEDULER})
# Calls whose first argument is an optimizer.
OPTIMIZER_TAKERS = frozenset({"torch_xla.core.xla_model.optimizer_step"})
# Calls that move what they are given to a device given at this position.
DEVICE_ARGUMENT_CALLS = {"accelerate.utils.send_to_device": 1,
                         "accelerate.utils.operations.send_to_device": 1}
# Keywords that take how many processes to start.
PROCESS_COUNT_KEYWORDS = frozenset({"nprocs", "nproc_per_node", "num_processes", "world_size"})


# -- the CUDA catalog (rules/catalog/cuda.toml) ------------------------------------------------
@dataclass(frozen=True)
class CudaCatalog:
    cuda_only_libraries: tuple[str, ...]  # with the TPU9xx rules' modules (`cuda_only_import`)
    cuda_graph_calls: frozenset[str]
    cuda_only_torch: tuple[str, ...]
    other_gpu_namespaces: tuple[str, ...]
    other_device_types: frozenset[str]
    other_vendor_libraries: tuple[str, ...]
    cuda_torch_names: tuple[str, ...]
    cuda_only_packages: frozenset[str]
    cuda_torch_keywords: dict[str, tuple[str, ...]]  # qualified function -> its CUDA keywords

    def cuda_only_library(self, module: str) -> bool:
        """Is `module` (an imported module's dotted name) one only a CUDA machine has?"""
        return module in self.cuda_graph_calls or under(module, self.cuda_only_libraries)

    def cuda_only_torch_api(self, name: str | None) -> str | None:
        """The catalogued torch.cuda API `name` (qualified) is, or is under, else None."""
        return next((api for api in self.cuda_only_torch if name and under(name, (api,))), None)

    def cuda_torch_name(self, name: str | None) -> bool:
        """Is `name` (qualified) one of torch's CUDA APIs: under torch.cuda, or a CUDA name
        of torch elsewhere (`torch.utils.cpp_extension.CUDAExtension`, `torch.version.cuda`)?"""
        return bool(name) and (under(name, ("torch.cuda",) + self.cuda_torch_names))

    def cuda_keyword(self, function: str | None, keyword: str) -> bool:
        """Is `keyword` one of torch function `function`'s CUDA keywords (`with_cuda=`)?"""
        return keyword in self.cuda_torch_keywords.get(function or "", ())

    def other_gpu(self, name: str | None) -> bool:
        return bool(name) and under(name, self.other_gpu_namespaces)

    def other_vendor_library(self, module: str) -> bool:
        return under(module, self.other_vendor_libraries)


def under(name: str, prefixes) -> bool:
    """Is `name` one of the dotted `prefixes`, or a name inside one?"""
    return bool(name) and any(name == p or name.startswith(p + ".") for p in prefixes)


def cuda_catalog() -> CudaCatalog:
    """rules/catalog/cuda.toml, read once per rules folder."""
    from tpukit.rules import rules_dir

    return _cuda_catalog(rules_dir())


@functools.cache
def _cuda_catalog(folder) -> CudaCatalog:
    from tpukit.rules import load_rules

    data = tomllib.loads((folder / "catalog" / "cuda.toml").read_text(encoding="utf-8"))
    flagged = tuple(m for rule in load_rules().values()
                    if rule.extra.get("engine") == "cuda-only-import" for m in rule.extra["modules"])
    return CudaCatalog(
        cuda_only_libraries=flagged + tuple(data["cuda_only_libraries"]),
        cuda_graph_calls=frozenset(data["cuda_graph_calls"]),
        cuda_only_torch=tuple(data["cuda_only_torch"]),
        other_gpu_namespaces=tuple(data["other_gpu_namespaces"]),
        other_device_types=frozenset(data["other_device_types"]),
        other_vendor_libraries=tuple(data["other_vendor_libraries"]),
        cuda_torch_names=tuple(data["cuda_torch_names"]),
        cuda_only_packages=frozenset(data["cuda_only_packages"]),
        cuda_torch_keywords={k: tuple(v) for k, v in data["cuda_torch_keywords"].items()})
