"""The file's distributed set-up, shared by the distributed rules: its process-group calls,
the functions `mp.spawn` or `torch_xla.launch` start, what each scope does for its group (a
store of its own, the backends it names, another launcher's variables), and which
environment variable an expression reads."""

from __future__ import annotations

import re

import libcst as cst

from tpukit.migrate.context import find_keyword, string_value
from tpukit.migrate.nodes import walk


INIT_PROCESS_GROUP = "torch.distributed.init_process_group"
DDP_NAMES = {"torch.nn.parallel.DistributedDataParallel",
             "torch.nn.parallel.distributed.DistributedDataParallel"}
SPAWN_NAMES = {"torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn"}


# Other launchers' variables: a function that reads them has its ranks from that launcher.
_OTHER_LAUNCHER_ENV = re.compile(r"^(?:OMPI_COMM_WORLD_\w+|PMI_(?:RANK|SIZE)|PMIX_RANK|"
                                 r"SLURM_(?:PROCID|NTASKS|LOCALID)|MV2_COMM_WORLD_\w+)$")


# Backend names: a scope that writes several picks the backend at run time, for the device it
# finds (transformers' tensor parallelism: {"cuda": "nccl", "cpu": "gloo", ...}).
_BACKEND_NAMES = frozenset({"nccl", "gloo", "mpi", "ccl", "xccl", "hccl", "ucc"})


def env_key(ctx, expr: cst.BaseExpression) -> tuple[str | None, bool]:
    """("LOCAL_RANK", has_default) for `os.environ["LOCAL_RANK"]`, `os.environ.get(...)`,
    `os.getenv(...)`; (None, False) otherwise."""
    if isinstance(expr, cst.Subscript) and ctx.qualify(expr.value) == "os.environ":
        if len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
            return string_value(expr.slice[0].slice.value), False
    if isinstance(expr, cst.Call) and ctx.qualify(expr.func) in ("os.environ.get", "os.getenv"):
        if expr.args:
            return string_value(expr.args[0].value), len(expr.args) > 1
    return None, False


class ScopeFacts:
    """What one function (or the module's top level) does for its process group, read from its
    code once: its init_process_group calls (with a store of its own?), the backend names its
    strings hold, and whether it reads another launcher's variables."""

    def __init__(self, ctx, scope: cst.CSTNode) -> None:
        self.calls_group = self.own_store = self.other_launcher = False
        self.backend_names: set[str] = set()
        values = ctx.values
        for node in walk(scope):
            if isinstance(node, cst.Call) and values.qualified(node.func) == INIT_PROCESS_GROUP:
                self.calls_group = True
                self.own_store = self.own_store or find_keyword(node, "store") is not None
            elif isinstance(node, cst.SimpleString):
                value = string_value(node)
                if value in _BACKEND_NAMES:
                    self.backend_names.add(value)
                elif value is not None and _OTHER_LAUNCHER_ENV.match(value):
                    self.other_launcher = True


def scope_facts(ctx) -> ScopeFacts:
    scope = ctx.functions[-1] if ctx.functions else ctx.module
    return ctx.memo(("group_facts", id(scope)), lambda: ScopeFacts(ctx, scope))


def group_calls(ctx) -> list[cst.Call]:
    return ctx.memo("group_calls", lambda: [
        call for call, _ in ctx.values.calls
        if ctx.values.qualified(call.func) == INIT_PROCESS_GROUP])


def spawned_functions(ctx) -> dict[int, cst.Call]:
    """id() of the file's functions that `mp.spawn`/`torch_xla.launch` start -> the call."""
    def compute() -> dict[int, cst.Call]:
        found = {}
        values = ctx.values
        for call, _ in values.calls:
            if values.qualified(call.func) in SPAWN_NAMES | {"torch_xla.launch"} and call.args \
                    and isinstance(call.args[0].value, cst.Name):
                for b in values.bindings(call.args[0].value):
                    node = getattr(b, "node", None)
                    if isinstance(node, cst.FunctionDef):
                        found[id(node)] = call
        return found

    return ctx.memo("spawned_functions", compute)


def chosen_at_run_time(ctx) -> bool:
    """Does the enclosing function (or the module) name another vendor's backend beside NCCL
    (xccl, hccl, ccl, mpi, ucc): a backend chosen for whichever device it finds? (NCCL or gloo
    alone is the CUDA-or-CPU choice the port makes: `"nccl" if cuda else "gloo"`.)"""
    named = scope_facts(ctx).backend_names
    return "nccl" in named and bool(named - {"nccl", "gloo"})
