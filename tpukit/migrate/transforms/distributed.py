"""Distributed training: process groups, DDP and DataParallel, launchers, torchrun ranks,
samplers, barriers, torch.compile, and the CUDA-only pieces that have a TPU alternative.

torch_xla runs one process per TPU device, like one process per GPU, so a DDP script keeps
its shape: the process group uses the "xla" backend (`init_method="xla://"` finds the peers
from the launcher's environment), ranks and world size come from `torch_xla.runtime`, and each
process's device is `torch_xla.device()`. The launcher must not touch the XLA runtime before
`torch_xla.launch` (it refuses to start once the runtime is initialised).
"""

from __future__ import annotations

import re

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate.context import (
    dotted,
    find_keyword,
    keyword_arg,
    plain_positional,
    string_value,
    with_commas,
    with_string,
)
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.nodes import first, is_docstring, walk
from tpukit.migrate.transforms.base import StatementPlan, Transform, transform
from tpukit.migrate.transforms.ddp_inputs import ForwardInputs
from tpukit.migrate.transforms.devices import AVAILABILITY

INIT_PROCESS_GROUP = "torch.distributed.init_process_group"
DDP_NAMES = {"torch.nn.parallel.DistributedDataParallel",
             "torch.nn.parallel.distributed.DistributedDataParallel"}
DATA_PARALLEL_NAMES = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                       "torch.nn.parallel.data_parallel.DataParallel"}
SPAWN_NAMES = {"torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn"}
SAMPLER_NAMES = {"torch.utils.data.distributed.DistributedSampler",
                 "torch.utils.data.DistributedSampler"}
RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT")
INPUTS_HELPER = "_inputs_to_device"  # helpers.py: moves a DDP model's forward inputs
_NCCL_BACKEND = re.compile(r"^(?:nccl|cuda:nccl(?:,cpu:gloo)?|cpu:gloo,cuda:nccl)$")
DEFAULT_BACKEND = "torch.distributed.get_default_backend_for_device"
# Other launchers' variables: a function that reads them has its ranks from that launcher.
_OTHER_LAUNCHER_ENV = re.compile(r"^(?:OMPI_COMM_WORLD_\w+|PMI_(?:RANK|SIZE)|PMIX_RANK|"
                                 r"SLURM_(?:PROCID|NTASKS|LOCALID)|MV2_COMM_WORLD_\w+)$")
_CUDA_OR_CPU_BACKEND = re.compile(r"\b(?:nccl|gloo)\b")  # "nccl", "cuda:nccl,cpu:gloo"
# Backend names: a scope that writes several picks the backend at run time, for the device it
# finds (transformers' tensor parallelism: {"cuda": "nccl", "cpu": "gloo", ...}).
_BACKEND_NAMES = frozenset({"nccl", "gloo", "mpi", "ccl", "xccl", "hccl", "ucc"})
DEVICE_INDEX_KEYWORDS = ("device", "device_id", "output_device")
COMPILE_MODES_WITHOUT_MEANING = {"reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}


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


def _group_calls(ctx) -> list[cst.Call]:
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


@transform("TPU401")
class ProcessGroup(Transform):
    def visit_Call(self, node: cst.Call):
        name = self.ctx.qualify(node.func)
        if name == DEFAULT_BACKEND and self.mapping:
            backend = self.mapping.get("backend", "xla")
            return self.fix_or_report(
                node, self.say("default_backend", code=self.ctx.short(node), backend=backend,
                               device=self.ctx.device_type),
                lambda: self.ctx.expr(f'"{backend}"'))
        if name != INIT_PROCESS_GROUP:
            return None
        backend, written = _backend_of(node)
        if written is not None and not _CUDA_OR_CPU_BACKEND.search(written):
            return None  # "xla", "tpu_dist"; another vendor's ("hccl", "cncl"): not CUDA's
        if backend is not None and written is None and _chosen_at_run_time(self.ctx):
            # `backend = backend_map.get(device_type)`: the code picks a backend for the
            # device it runs on (gloo on a CPU mesh, which it builds on a TPU host too):
            # "xla" in its place would take every choice away
            self.ctx.report(self.rule, node, self.say(
                "chosen", code=self.ctx.short(node), backend=self.ctx.code(backend.value)),
                applied=False, fix=FixKind.NONE)
            return None
        given = self._given_by_caller(backend)
        if given is not None:
            # lightning's _init_dist_connection(..., torch_distributed_backend): its strategy
            # passes gloo for CPU DDP (which runs on a TPU host too) and nccl for CUDA
            self.ctx.report(self.rule, node, self.say(
                "given", code=self.ctx.short(node), backend=self.ctx.code(backend.value),
                function=given), applied=False, fix=FixKind.NONE)
            return None
        if _library_cpu_group(self.ctx, backend):
            # fairscale's pipe benchmark: `init_process_group(backend="gloo", rank=0,
            # world_size=1, init_method="tcp://...")` is a CPU group, which works on a TPU
            # host as written; "xla://" would need a launcher and XLA tensors
            self.ctx.report(self.rule, node, self.say(
                "library_cpu", code=self.ctx.short(node)), applied=False, fix=FixKind.NONE,
                severity=Severity.INFO)
            return None
        store = find_keyword(node, "store")
        if store is not None:
            # accelerate's debug launcher: gloo over its own FileStore, in processes it forked
            # itself (no torch_xla.launch, so no XLA rendezvous): a CPU group that works on a
            # TPU host as it is, and that "xla://" would drop.
            self.ctx.report(self.rule, node, self.say(
                "own_store", code=self.ctx.short(node), store=self.ctx.short(store.value)),
                applied=False, fix=FixKind.NONE)
            return None
        # `**kwargs` may set init_method, rank or world_size: they stay, and only a backend
        # that is written out changes (adding one could collide with the splat).
        splat = any(a.star for a in node.args)
        kept = [a for a in node.args if a.star or (a.keyword and a.keyword.value not in (
            "backend", "init_method", "rank", "world_size", "store"))]
        func = self.ctx.code(node.func)
        message = self.say("group", code=self.ctx.short(node))
        if splat and backend is None:
            self.ctx.report(self.rule, node, message + self.say("group_splat"), applied=False,
                            fix=FixKind.NONE)
            return None

        if "backend" in self.mapping or splat:
            # Only the backend changes, on leave: the other arguments are rewritten as usual.
            self.backend_only[node] = (message, None if backend is None else node.args.index(backend))
            return None

        def build():
            self.ctx.side_effect_imports.update(self.mapping.get("imports", ()))
            call = self.ctx.expr(f'{func}("xla", init_method="xla://")')
            return call.with_changes(args=with_commas(list(call.args) + kept))

        return self.fix_or_report(node, message, build)

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.backend_only: dict[cst.Call, tuple[str, int | None]] = {}
        self.cuda_tests: list[bool] = []  # the enclosing if/else tests: CUDA availability?
        self.assigned_strings: set[int] = set()  # id() of literals an assignment sets

    def _given_by_caller(self, backend: cst.Arg | None) -> str | None:
        """The name of the library function (a package module's) whose parameter the backend
        argument is, else None."""
        function = self.ctx.functions[-1] if self.ctx.functions else None
        if not (self.ctx.owner_leaves("TPU401", "given_backend") and backend is not None
                and isinstance(backend.value, cst.Name) and isinstance(function, cst.FunctionDef)):
            return None
        params = function.params
        names = {p.name.value for p in (*params.posonly_params, *params.params,
                                        *params.kwonly_params)}
        return function.name.value if backend.value.value in names else None

    def _leave_group(self, original: cst.Call, updated: cst.Call):
        planned = self.backend_only.pop(original, None)
        if planned is None:
            return None
        message, at = planned

        def build():
            self.ctx.side_effect_imports.update(self.mapping.get("imports", ()))
            backend = None if at is None else updated.args[at]
            return self._with_backend(updated, backend, self.mapping.get("backend", "xla"))

        return self.fix_or_report(original, message, build)

    def _with_backend(self, node: cst.Call, backend: cst.Arg | None, name: str) -> cst.Call:
        value = self.ctx.expr(f'"{name}"')
        if backend is not None and isinstance(backend.value, cst.SimpleString):
            value = with_string(backend.value, name)  # the file's own quotes
        if backend is None:
            return node.with_changes(args=with_commas([keyword_arg("backend", value), *node.args]))
        return node.with_changes(args=[a.with_changes(value=value) if a is backend else a
                                       for a in node.args])

    # -- a NCCL backend kept in a setting: `backend = "nccl"`, `--backend` defaults ----------
    def _nccl_setting(self, original, name: str, value: cst.BaseExpression, rebuild,
                      where: str = ""):
        """`name` holds a process-group backend (its name says so) and `value` writes "nccl":
        the setting becomes the TPU's backend, wherever init_process_group reads it (here, or
        in the script that imports this module or parses this argument)."""
        if not self.mapping or not _writes_nccl(value):
            return None
        backend = self.mapping.get("backend", "xla")
        swap = _NcclLiterals(backend)
        new = value.visit(swap)
        if not swap.changed:
            return None
        top = self.ctx.current_top
        if self.ctx.owner_leaves("TPU401", "class_default") and isinstance(top, cst.ClassDef) \
                and not self.ctx.functions:
            # a field's default in library code (accelerate's InitProcessGroupKwargs): callers
            # pass "nccl" themselves, and code compares fields with their defaults (its
            # to_kwargs sends only what differs), so a new default sends their "nccl" on
            self.ctx.report(self.rule, original, self.say(
                "class_default", code=self.ctx.short(original), cls=top.name.value,
                backend=backend), applied=False, fix=FixKind.NONE)
            return None
        message = self.say("setting", code=self.ctx.short(original), backend=backend,
                           where=where)

        def build():
            # the backend's name works once its module is imported (registers "xla"/"tpu_dist")
            self.ctx.need_import(self.ctx.device_module)
            return rebuild(new)

        return self.fix_or_report(original, message, build)

    # A setting under a CUDA availability test (`if torch.cuda.is_available(): backend =
    # "nccl"`, accelerate's MULTI_GPU set-up) is CUDA-only code: the test is False on a TPU and
    # stays as written (guards.py), so the setting stays too.
    # (TPU101's IfExp hook, which may replace a whole `"cuda" if ... else "cpu"`, runs before
    # these, so a node it replaces is never pushed here without its pop.)
    def _enter_test(self, test: cst.BaseExpression) -> None:
        self.cuda_tests.append(_tests_cuda(self.ctx, test))

    def visit_If(self, node: cst.If):
        self._enter_test(node.test)

    def leave_If(self, original: cst.If, updated: cst.If):
        self.cuda_tests.pop()

    def visit_IfExp(self, node: cst.IfExp):
        self._enter_test(node.test)

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp):
        self.cuda_tests.pop()

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString):
        """`backend = "nccl"`: the literal itself (the setting's other parts stay as written)."""
        if any(self.cuda_tests) or _chosen_at_run_time(self.ctx):
            return None  # ... or one entry of a per-device choice (init_process_group says why)
        # a variable set to NCCL's name holds the backend, whatever it is called and wherever
        # it is read (here, through an option whose default it is, in another module)
        targets = self.ctx.assign_targets[-1] if self.ctx.assign_targets else ()
        target = next(iter(targets), None)
        if target is None or id(original) not in self.assigned_strings:
            return None
        name = self.ctx.short(target)
        return self._nccl_setting(original, name, updated, lambda v: v,
                                  self.say("set_in", name=name))

    def leave_AnnAssign(self, original: cst.AnnAssign, updated: cst.AnnAssign):
        if updated.value is None:
            return None
        return self._nccl_setting(original, self.ctx.short(original.target),
                                  updated.value, lambda v: updated.with_changes(value=v))

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        planned = self._leave_group(original, updated)
        if planned is not None or not (isinstance(original.func, cst.Attribute)
                                       and original.func.attr.value == "add_argument"):
            return planned
        # parser.add_argument("--backend", default="nccl"): the option's default, where the
        # program gives the option to init_process_group
        flag = next((string_value(a.value) for a in original.args if a.keyword is None
                     and (string_value(a.value) or "").startswith("--")), None)
        default = find_keyword(updated, "default")
        if flag is None or default is None:
            return None
        choices = find_keyword(updated, "choices")

        def rebuild(value):
            # `choices=["nccl", "gloo"]` would refuse the new default given on the command line
            swapped = (choices.value.visit(_NcclLiterals(self.mapping.get("backend", "xla")))
                       if choices is not None else None)
            return updated.with_changes(args=[
                a.with_changes(value=value) if a is default
                else a.with_changes(value=swapped) if a is choices else a for a in updated.args])

        return self._nccl_setting(original, flag, default.value, rebuild)

    def visit_Assign(self, node: cst.Assign):
        """`os.environ["MASTER_PORT"] = "12355"`: set-up only the CUDA process group needed."""
        value = node.value
        # the value itself, or one side of a choice (`"nccl" if cuda else "gloo"`)
        choices = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
        self.assigned_strings.update(id(c) for c in choices if isinstance(c, cst.SimpleString))
        if len(node.targets) != 1 or not _group_calls(self.ctx):
            return None
        key, _ = env_key(self.ctx, node.targets[0].target)
        return self._remove_rendezvous(node, key)

    def visit_Expr(self, node: cst.Expr):
        call = node.value
        if (isinstance(call, cst.Call) and self.ctx.qualify(call.func) == "os.environ.setdefault"
                and call.args and _group_calls(self.ctx)):
            return self._remove_rendezvous(call, string_value(call.args[0].value))
        return None

    def _remove_rendezvous(self, node: cst.CSTNode, key: str | None):
        if key not in RENDEZVOUS_ENV or self.mapping.get("rendezvous_env") == "keep":
            return None
        if any(a.star for call in _group_calls(self.ctx) for a in call.args):
            return None  # a group whose splat keeps its init_method (env://) needs them
        if not self.ctx.memo("xla_group", lambda: _ported_group_call(self.ctx)):
            # deepspeed's mpi_discovery sets them for a group made elsewhere (env://): only
            # a group this file makes, and TPU401 gives "xla://", meets without them
            return None
        text = self.ctx.short(node)
        return self.fix_or_report(
            node, self.say("rendezvous", code=text),
            lambda: StatementPlan([], f'removed "{text}": init_method="xla://" needs no '
                                      "MASTER_ADDR/MASTER_PORT"))


def _backend_of(call: cst.Call) -> tuple[cst.Arg | None, str | None]:
    """init_process_group's backend argument (first positional or `backend=`), and its
    value where it is a string literal."""
    plain = plain_positional(call)
    backend = plain[0] if plain and call.args[0] is plain[0] else find_keyword(call, "backend")
    return backend, string_value(backend.value) if backend is not None else None


def _chosen_at_run_time(ctx) -> bool:
    """Does the enclosing function (or the module) name another vendor's backend beside NCCL
    (xccl, hccl, ccl, mpi, ucc): a backend chosen for whichever device it finds? (NCCL or gloo
    alone is the CUDA-or-CPU choice the port makes: `"nccl" if cuda else "gloo"`.)"""
    named = scope_facts(ctx).backend_names
    return "nccl" in named and bool(named - {"nccl", "gloo"})


def _ported_group_call(ctx) -> bool:
    """Does this file call init_process_group in a form TPU401 rewrites to "xla://" (a CUDA
    or CPU backend written out, or none; no store of its own, no splat)?"""
    def ported(node: cst.CSTNode) -> bool:
        if not isinstance(node, cst.Call) or ctx.qualify(node.func) != INIT_PROCESS_GROUP:
            return False
        if any(a.star for a in node.args) or find_keyword(node, "store") is not None:
            return False
        backend, written = _backend_of(node)
        if _library_cpu_group(ctx, backend):
            return False
        return written is None or bool(_CUDA_OR_CPU_BACKEND.search(written))

    return bool(first(ctx.module, ported))


def _library_cpu_group(ctx, backend: cst.Arg | None) -> bool:
    """Is this init_process_group of library code one that names no NCCL (gloo, or the
    default, which is gloo where there is no CUDA)? The library's CPU group: it runs on a TPU
    host as written."""
    return ctx.owner_leaves("TPU401", "cpu_group") and (
        backend is None or not _writes_nccl(backend.value))


def _writes_nccl(expr: cst.BaseExpression) -> bool:
    """Does `expr` hold the string "nccl" (alone, or in "cuda:nccl,cpu:gloo")? Its strings'
    values decide, not its text: a name that says nccl is only a name."""
    return any(isinstance(n, cst.SimpleString)
               and _NCCL_BACKEND.match((string_value(n) or "").lower()) for n in walk(expr))


# An availability test as the user wrote it, or as TPU110 wrote it (`bool(xr.device_type())`):
# a setting guarded by it stays as written on the first run and on the second (idempotence).
_GUARD_CALLS = AVAILABILITY | {"torch_xla.runtime.device_type"}


class _AvailabilityCalls(cst.CSTVisitor):
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.found = False

    def visit_Call(self, node: cst.Call) -> None:
        self.found = self.found or self.ctx.qualify(node.func) in _GUARD_CALLS


def _tests_cuda(ctx, test: cst.BaseExpression) -> bool:
    """Does this if-test ask whether CUDA (or an accelerator) is there?"""
    calls = _AvailabilityCalls(ctx)
    test.visit(calls)
    return calls.found


class _NcclLiterals(cst.CSTTransformer):
    """Every string literal naming NCCL ("nccl", "cuda:nccl,cpu:gloo") -> `backend`, in the
    literal's own quotes."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.changed = False

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString):
        value = string_value(original)
        if value is None or not _NCCL_BACKEND.search(value):
            return updated
        self.changed = True
        return with_string(updated, self.backend)


@transform("TPU402")
class DistributedDataParallelArgs(Transform):
    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) not in DDP_NAMES or not original.args:
            return None
        # DDP(module, device_ids, output_device, dim, ...): the second and third positional
        plain = plain_positional(updated)
        second = plain[1] if len(plain) > 1 else None
        dropped = [a for a in updated.args[1:] if any(a is p for p in plain[1:3])
                   or (a.keyword and a.keyword.value in ("device_ids", "output_device"))]
        if len(plain) > 3:  # `dim` and later ones cannot stay positional without those two
            self.ctx.report(self.rule, original, self.say(
                "ddp_positional", code=self.ctx.short(original)), applied=False, fix=FixKind.NONE)
            return None
        # A splat may hold device_ids, or gradient_as_bucket_view itself: kept as it is.
        splat = next((a for a in updated.args if a.star), None)
        bucket_view = self.mapping.get("bucket_view", False) and splat is None
        bucket = find_keyword(original, "gradient_as_bucket_view")
        if splat is not None and not dropped:
            self.ctx.report(self.rule, original, self.say(
                "ddp_splat", code=self.ctx.short(original),
                splat=self.ctx.code(splat).rstrip(", ")),
                applied=False, fix=FixKind.NONE)
            return None
        if not dropped and (bucket is not None or not bucket_view):
            return None
        # DDP copied the forward's inputs to device_ids[0]; without device_ids nothing does.
        moves = (any(a is second or (a.keyword and a.keyword.value == "device_ids")
                     for a in dropped)
                 and not self._inputs_on_device(original))

        if moves and splat is not None:
            # The splat must stay an argument of the DDP call itself (engine's splat check):
            # the inputs' move is left for a person, said at the line.
            moves = False
            self.ctx.report(self.rule, original, self.say(
                "inputs_splat", code=self.ctx.short(original), helper=INPUTS_HELPER),
                applied=False, fix=FixKind.NONE)

        def build():
            args = [a for a in updated.args if a not in dropped]
            if bucket is None and bucket_view:
                args.append(keyword_arg("gradient_as_bucket_view", self.ctx.expr("True")))
            call = updated.with_changes(args=with_commas(args))
            if not moves:
                return call
            self.ctx.helpers_needed.add(INPUTS_HELPER)
            self.ctx.need_import("torch")
            return cst.Call(cst.Name(INPUTS_HELPER), [cst.Arg(call)])

        message = self.say("ddp", code=self.ctx.short(original))
        if moves:
            message += self.say("inputs", helper=INPUTS_HELPER)
        return self.fix_or_report(original, message, build)

    def visit_Assign(self, node: cst.Assign):
        if isinstance(node.value, cst.Call) and self.ctx.qualify(node.value.func) in DDP_NAMES:
            self.targets[id(node.value)] = [self.ctx.code(t.target) for t in node.targets]
        return None

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.targets: dict[int, list[str]] = {}  # id(DDP call) -> what it is assigned to

    def _inputs_on_device(self, call: cst.Call) -> bool:
        """Does every call of the model this DDP is assigned to pass inputs on the device?"""
        targets = self.targets.get(id(call))
        if not targets:
            return False  # `return DDP(...)`, `train(DDP(...))`: used where we cannot follow
        inputs = self.ctx.memo("forward_inputs", lambda: ForwardInputs(self.ctx.module))
        return all(inputs.on_device(t) for t in targets)


@transform("TPU403")
class DataParallel(Transform):
    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self._decided: set[int] = set()  # wraps whose assignment statement visit_Assign decided

    def statement_triggers(self, source: str) -> set[str]:
        wrapped = self.ctx.values.names_of({K.DATA_PARALLEL})
        return super().statement_triggers(source) | ({".module"} if wrapped else set())

    def _message(self, node) -> str:
        return self.say("wrapper", code=self.ctx.short(node))

    def _returned(self, wrap: cst.Call, target: cst.BaseExpression | None) -> bool:
        """Does the enclosing function return the wrapped model (`return DataParallel(net)`,
        or `net = DataParallel(net)` ... `return net`)? Its callers, in this file or another,
        may read `.module` through what the dataflow cannot follow (pix2pix's
        `getattr(self, 'net' + name).module`): where the target keeps the wrapper
        (`keep_returned`: torch_xla, where `nn.DataParallel` without CUDA calls the model as it
        is and keeps `.module` and the "module." checkpoint keys) it stays."""
        if not self.mapping.get("keep_returned") or not self.ctx.functions:
            return False
        function = self.ctx.functions[-1]
        for node in walk(function.body):
            if not isinstance(node, cst.Return) or node.value is None:
                continue
            if node.value is wrap:
                return True
            if (isinstance(target, cst.Name) and isinstance(node.value, cst.Name)
                    and node.value.value == target.value):
                return True
        return False

    def _keep(self, node: cst.Call) -> None:
        self.ctx.report(self.rule, node, self.say("returned", code=self.ctx.short(node)),
                        applied=False, fix=FixKind.NONE, severity=Severity.INFO)

    def visit_Assign(self, node: cst.Assign):
        value = node.value
        if not (isinstance(value, cst.Call) and self.ctx.qualify(value.func) in DATA_PARALLEL_NAMES
                and value.args and len(node.targets) == 1):
            return None
        target = node.targets[0].target
        if self.ctx.code(target) != self.ctx.code(value.args[0].value):
            return None  # `dp = DataParallel(model)`: the call itself is rewritten below
        self._decided.add(id(value))
        if self._returned(value, target):
            self._keep(value)
            return None
        text = self.ctx.short(node)
        return self.fix_or_report(value, self._message(value), lambda: StatementPlan(
            [], f'removed "{text}": one process per TPU device'))

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if (self.ctx.qualify(original.func) not in DATA_PARALLEL_NAMES or not original.args
                or id(original) in self._decided):
            return None
        assigned = self.ctx.assign_targets[-1] if self.ctx.assign_targets else []
        if self._returned(original, assigned[0] if len(assigned) == 1 else None):
            self._keep(original)
            return None
        return self.fix_or_report(original, self._message(original), lambda: updated.args[0].value)

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        """`model.module` of a model that was wrapped in DataParallel is the model itself."""
        if original.attr.value != "module":
            return None
        # a model the dataflow says DataParallel wrapped (a method's own `model` parameter is
        # another variable than the one another method wrapped)
        if K.DATA_PARALLEL not in self.ctx.values.kinds(original.value):
            return None
        if not self.ctx.can_fix(self.rule):
            return None
        return updated.value


@transform("TPU404")
class SpawnLaunch(Transform):
    def statement_triggers(self, source: str) -> set[str]:
        # the spawned function's own statement
        return super().statement_triggers(source) | {
            node.name.value for node in walk(self.ctx.module)
            if isinstance(node, cst.FunctionDef) and id(node) in spawned_functions(self.ctx)}

    def _spawn_statement(self, node, call: cst.BaseExpression):
        """TorchTPU: `mp.spawn` stays; the parent sets TorchTPU's launch environment first."""
        if ("before" not in self.mapping or not isinstance(call, cst.Call)
                or self.ctx.qualify(call.func) not in SPAWN_NAMES
                or "set_tpu_launch_env" in self.ctx.source):  # set already (migrated code)
            return None
        positional = [a for a in call.args if a.keyword is None]
        nprocs = find_keyword(call, "nprocs") or (positional[2] if len(positional) > 2 else None)
        if self._library_spawn(call):
            return None
        before = self.mapping["before"].format(
            nprocs=self.ctx.code(nprocs.value) if nprocs is not None else "1")
        return self.fix_or_report(
            call, self.say("spawn", code=self.ctx.short(call)),
            lambda: StatementPlan([self.ctx.statement(before), node]))

    def _library_spawn(self, call: cst.Call) -> bool:
        """Library code starts its own processes, as many as it asks for (fairscale's
        `spawn_for_all_world_sizes`: `world_size` CPU processes over gloo on a TPU host, where
        `torch_xla.launch` starts one per TPU device and the group waited for the rest)."""
        return self.library_leaves(call, "spawn",
                                   lambda: self.say("library", code=self.ctx.short(call)))

    def visit_Expr(self, node: cst.Expr):
        return self._spawn_statement(node, node.value)

    def visit_Assign(self, node: cst.Assign):
        return self._spawn_statement(node, node.value)

    def visit_Call(self, node: cst.Call):
        if "before" in self.mapping:
            return None  # the statement holding the call is planned above
        if self.ctx.qualify(node.func) not in SPAWN_NAMES or not node.args:
            return None
        positional = [a for a in node.args if a.keyword is None]
        fn = positional[0] if positional else find_keyword(node, "fn")
        if fn is None:
            return None
        args = find_keyword(node, "args") or (positional[1] if len(positional) > 1 else None)
        start = find_keyword(node, "start_method")
        if self._library_spawn(node):
            return None

        def build():
            parts = [self.ctx.code(fn.value)]
            if args is not None:
                parts.append(f"args={self.ctx.code(args.value)}")
            if start is not None:
                parts.append(f"start_method={self.ctx.code(start.value)}")
            return self.ctx.expr(f"torch_xla.launch({', '.join(parts)})")

        return self.fix_or_report(node, self.say("launch", code=self.ctx.short(node)), build)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        """In the spawned function, a world-size parameter is the launcher's guess (it cannot ask
        the runtime): take the real one from torch_xla."""
        call = spawned_functions(self.ctx).get(id(original))
        if (call is None or not self.ctx.can_fix(self.rule)
                or "world_size" not in self.mapping
                or self.ctx.owner_leaves("TPU404", "world_size")):
            return None
        world = _world_parameter(self.ctx, original, call)
        if world is None or not isinstance(updated.body, cst.IndentedBlock):
            return None
        line = self.ctx.statement(f"{world} = {self.mapping['world_size']}")
        statement = cst.SimpleStatementLine(
            [line], trailing_whitespace=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "),
                comment=cst.Comment("# tpukit: from the runtime; the launcher cannot ask it")))
        body = list(updated.body.body)
        first = 1 if body and is_docstring(body[0]) else 0
        body.insert(first, statement)
        return updated.with_changes(body=updated.body.with_changes(body=body))


def _world_parameter(ctx, function: cst.FunctionDef, call: cst.Call) -> str | None:
    """The parameter of a spawned function that gets the number of processes: the element of
    `args=(...)` that is what `nprocs` is (or a world size or GPU count), at its place after
    the process index."""
    positional = [a for a in call.args if a.keyword is None]
    given = find_keyword(call, "args") or (positional[1] if len(positional) > 1 else None)
    nprocs = find_keyword(call, "nprocs") or (positional[2] if len(positional) > 2 else None)
    if given is None or not isinstance(given.value, (cst.Tuple, cst.List)):
        return None
    values = ctx.values
    count = values.symbol(nprocs.value) if nprocs is not None else None
    params = [p.name.value for p in function.params.params]
    for i, element in enumerate(given.value.elements):
        value = element.value
        same = nprocs is not None and (values.symbol(value) == count if count is not None
                                       else ctx.code(value) == ctx.code(nprocs.value))
        if same or values.kinds(value) & {K.WORLD, K.GPU_COUNT}:
            return params[i + 1] if i + 1 < len(params) else None
    return None


@transform("TPU405")
class TorchrunRanks(Transform):
    reads_device_facts = True

    def statement_triggers(self, source: str) -> set[str]:
        """`.to(NAME` and `device(NAME` for the variables that hold a rank in this file."""
        return super().statement_triggers(source) | {
            f"{prefix}{name}" for name in self.ctx.values.names_of({K.RANK})
            for prefix in (".to(", "device(", ".to(self.")}

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.device_values: set[int] = set()  # id() of values given as a device

    def visit_Call(self, node: cst.Call):
        # FSDP(device_id=int(os.environ["LOCAL_RANK"])): a rank given as a device index
        self.device_values.update(id(a.value) for a in node.args if a.keyword is not None
                                  and a.keyword.value in DEVICE_INDEX_KEYWORDS)
        # int(os.environ["LOCAL_RANK"]) -> xr.local_ordinal()
        if dotted(node.func) == "int" and len(node.args) == 1:
            key, has_default = env_key(self.ctx, node.args[0].value)
            if key in self.mapping.get("env", {}) and not has_default:
                # The function meets through its own `store=` (TPU401 leaves that group as it
                # is), or reads another launcher's numbers (mpirun's OMPI_*, SLURM's, PMI's:
                # deepspeed's mpi_discovery; xr.world_size() is 1 outside torch_xla's launch):
                # its RANK / WORLD_SIZE are that launcher's, not torch_xla's.
                facts = scope_facts(self.ctx)
                if facts.own_store or facts.other_launcher or (
                        facts.calls_group and _chosen_at_run_time(self.ctx)):
                    return None  # ... or they go to a group TPU401 leaves (its backend chosen)
                if id(node) in self.device_values:
                    return self._rank_device(node, node, is_to=False)
                if self.ctx.owner_leaves("TPU405", "rank"):
                    # lightning's TorchElasticEnvironment: torchrun sets these for CPU, GPU
                    # and XLA runs alike; as `xr.world_size()` a CPU DDP run on a TPU host
                    # started the XLA runtime in every process and read world size 1, rank 0
                    self.ctx.report(self.rule, node, self.say(
                        "rank_library", code=self.ctx.short(node), key=key),
                        applied=False, fix=FixKind.NONE, severity=Severity.INFO)
                    return None
                return self._replace(node, key)
            return None
        # .to(rank) / torch.device(rank): a rank used as a CUDA device index
        name = self.ctx.qualify(node.func)
        is_to = isinstance(node.func, cst.Attribute) and node.func.attr.value == "to"
        if (is_to or name == "torch.device") and len(node.args) == 1 and node.args[0].keyword is None:
            value = node.args[0].value
            if isinstance(value, (cst.Name, cst.Attribute)) and K.RANK in self.ctx.values.kinds(value):
                return self._rank_device(node, value, is_to)
        return None

    def _replace(self, node: cst.Call, key: str):
        new = self.mapping["env"][key]
        return self.fix_or_report(node, self.say("rank", code=self.ctx.short(node), new=new),
                                  lambda: self.ctx.expr(new))

    def _rank_device(self, node: cst.Call, value, is_to: bool):
        def build():
            if not is_to:  # a device built here: never the variable it may be assigned to
                return self.ctx.expr(self.ctx.device_object)
            device = self.ctx.device_expr()
            return node.with_changes(args=[node.args[0].with_changes(value=device)])

        return self.fix_or_report(
            node, self.say("device", code=self.ctx.short(node), rank=self.ctx.code(value)), build)


@transform("TPU406")
class SamplerReplicas(Transform):
    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) not in SAMPLER_NAMES or not original.args:
            return None
        plain = plain_positional(original)
        replicas = find_keyword(original, "num_replicas") or (plain[1] if len(plain) > 1 else None)
        rank = find_keyword(original, "rank") or (plain[2] if len(plain) > 2 else None)
        if (replicas is not None and rank is not None and self.ctx.code(replicas.value) == "xr.world_size()"
                and self.ctx.code(rank.value) == "xr.global_ordinal()"):
            return None
        message = self.say("sampler", code=self.ctx.short(original))
        if any(a.star for a in updated.args):
            self.ctx.report(self.rule, original, message + self.say("sampler_splat"),
                            applied=False, fix=FixKind.NONE)
            return None
        positional = plain_positional(updated)
        if not positional and find_keyword(updated, "dataset") is None:
            return None
        # Which of the two to set: a value the call passes is kept unless it is CUDA's (a GPU
        # count) or, in a script that starts its processes, a plain name (`rank`, the spawn
        # index); a group's own numbers (deepspeed's `self.dp_world_size`,
        # `mpu.get_data_parallel_rank()`) are the data-parallel group's, not the world's. A
        # value left out asks the default process group, which a ported script makes with the
        # xla backend (timm's loader): set it only where the file starts processes and makes
        # no group (xmp.spawn with no torch.distributed, where the default would raise).
        launches = bool(self.ctx.launch_calls())
        no_group = not _group_calls(self.ctx)
        replace = {}
        for index, arg in ((1, replicas), (2, rank)):
            if arg is None or (isinstance(arg.value, cst.Name) and arg.value.value == "None"):
                replace[index] = launches and no_group  # None is the default
            else:
                replace[index] = self.ctx.values.derives_from(arg.value, K.GPU_COUNT) or (
                    launches and isinstance(arg.value, cst.Name))
        if not any(replace.values()):
            return None

        def build():
            # DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last): the
            # values replaced where they stand, the ones left out added after the positional
            # arguments; the rest is kept.
            new = {1: "xr.world_size()", 2: "xr.global_ordinal()"}
            index = {"num_replicas": 1, "rank": 2}
            args = [a.with_changes(value=self.ctx.expr(new[i])) if replace.get(i) else a
                    for i, a in enumerate(positional)]
            given = {i for i in new if i < len(positional)} | {
                index[a.keyword.value] for a in updated.args
                if a.keyword is not None and a.keyword.value in index}
            args += [keyword_arg(key, self.ctx.expr(new[i])) for key, i in index.items()
                     if replace[i] and i not in given]
            args += [a.with_changes(value=self.ctx.expr(new[index[a.keyword.value]]))
                     if a.keyword.value in index and replace[index[a.keyword.value]] else a
                     for a in updated.args if a.keyword is not None]
            if not positional:  # dataset=... first, as written
                args.sort(key=lambda a: a.keyword.value != "dataset")
            return updated.with_changes(args=with_commas(args))

        return self.fix_or_report(original, message, build)


@transform("TPU408")
class CompileBackend(Transform):
    def _compiles(self, call: cst.Call) -> bool:
        """`torch.compile(...)`, or `model.compile(...)` on an nn.Module (which hands its
        arguments to torch.compile)."""
        if self.ctx.qualify(call.func) == "torch.compile":
            return True
        return (isinstance(call.func, cst.Attribute) and call.func.attr.value == "compile"
                and K.MODULE in self.ctx.values.kinds(call.func.value))

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if not self._compiles(original):
            return None
        backend = find_keyword(original, "backend")
        if backend is not None and string_value(backend.value) == "openxla":
            return None
        mode = find_keyword(original, "mode")
        if self.mapping.get("drop_modes"):
            return self._drop_mode(original, updated, mode)
        if self.library_leaves(original, "compile", lambda: self.say(
                "library", code=self.ctx.short(original))):
            return None
        dropped = ""
        if mode is not None:
            value = string_value(mode.value)
            why = (self.say("mode_cuda_only") if value in COMPILE_MODES_WITHOUT_MEANING
                   or value is None else self.say("mode_same"))
            dropped = self.say("mode_dropped", mode=self.ctx.code(mode.value), why=why)

        def build():
            args = [a for a in updated.args if not (a.keyword and a.keyword.value in ("backend", "mode"))]
            args.append(keyword_arg("backend", self.ctx.expr('"openxla"')))
            return updated.with_changes(args=with_commas(args))

        return self.fix_or_report(
            original, self.say("compile", code=self.ctx.short(original), dropped=dropped), build)

    def _drop_mode(self, original: cst.Call, updated: cst.Call, mode: cst.Arg | None):
        """TorchTPU keeps torch.compile's PyTorch form; its backend rejects CUDA-only modes."""
        if mode is None or string_value(mode.value) not in COMPILE_MODES_WITHOUT_MEANING:
            return None
        return self.fix_or_report(
            original, self.say("mode", code=self.ctx.short(original),
                               mode=self.ctx.code(mode.value)),
            lambda: updated.with_changes(args=with_commas(
                [a for a in updated.args if not (a.keyword and a.keyword.value == "mode")])))

    def leave_Decorator(self, original: cst.Decorator, updated: cst.Decorator):
        if self.mapping.get("drop_modes"):
            return None  # a bare `@torch.compile` has no mode to drop
        if self.ctx.qualify(original.decorator) != "torch.compile":
            return None  # `@torch.compile(...)` is a call: leave_Call above
        if self.library_leaves(original.decorator, "decorator", lambda: self.say(
                "library", code=self.ctx.short(original.decorator))):
            return None
        return self.fix_or_report(
            original.decorator, self.say("decorator"),
            lambda: updated.with_changes(decorator=self.ctx.expr(
                f'{self.ctx.code(original.decorator)}(backend="openxla")')))


# The optimizers TPU409 steps with `xm.optimizer_step`: torch.optim's classes, not its
# schedulers (`scheduler.step()` is no optimizer step) or SWA's averaged models.


@transform("TPU409")
class OptimizerStepWithoutDdp(Transform):
    """Several processes and no DDP: gradients must be averaged across them, which
    `xm.optimizer_step` does before the step."""

    def _applies(self) -> bool:
        def compute() -> bool:
            values = self.ctx.values
            multi = bool(_group_calls(self.ctx)) or bool(spawned_functions(self.ctx))
            return multi and not values.calls_any(DDP_NAMES)
        return self.ctx.memo("optimizer_step_without_ddp", compute)

    def visit_Expr(self, node: cst.Expr):
        call = node.value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "step" and not call.args
                and isinstance(call.func.value, cst.Name) and self._applies()):
            return None
        name = call.func.value.value
        if K.OPTIMIZER not in self.ctx.values.kinds(call.func.value):
            return None
        return self.fix_or_report(
            call, self.say("step", code=self.ctx.short(call), name=name),
            lambda: StatementPlan([self.ctx.statement(f"xm.optimizer_step({name})")]))

    def visit_Call(self, node: cst.Call):
        """A hand-written gradient all-reduce: xm.optimizer_step already does it."""
        if self.ctx.qualify(node.func) != "torch.distributed.all_reduce" or not self._applies():
            return None
        if not node.args or not first(node.args[0].value, lambda n: isinstance(
                n, cst.Attribute) and n.attr.value == "grad"):
            return None
        self.ctx.report(self.rule, node, self.say("all_reduce", code=self.ctx.short(node)),
                        applied=False, fix=None)
        return None


@transform("TPU413")
class NcclEnv(Transform):
    def visit_Assign(self, node: cst.Assign):
        if len(node.targets) != 1:
            return None
        key, _ = env_key(self.ctx, node.targets[0].target)
        return self._report(node, key)

    def visit_Call(self, node: cst.Call):
        if self.ctx.qualify(node.func) == "os.environ.setdefault" and node.args:
            return self._report(node, string_value(node.args[0].value))
        return None

    def _report(self, node, key: str | None):
        if key and key.startswith("NCCL_"):
            self.ctx.report(self.rule, node, self.say("nccl", key=key), applied=False)
        return None


ZERO = "torch.distributed.optim.ZeroRedundancyOptimizer"
ZERO_NAMES = {ZERO, "torch.distributed.optim.zero_redundancy_optimizer.ZeroRedundancyOptimizer"}
# ZeroRedundancyOptimizer(params, optimizer_class, process_group, parameters_as_bucket_view,
# overlap_with_ddp, **defaults): the arguments that are ZeRO's own; `**defaults` go to the
# optimizer class.
_ZERO_OWN = ("params", "optimizer_class", "process_group", "parameters_as_bucket_view",
             "overlap_with_ddp")


def _without(args: list[cst.Arg], dropped: set[int]) -> list[cst.Arg]:
    """`args` less those at the `dropped` positions, each keeping its own comma (and the new
    last one the old last one's, so a trailing comma or none stays as written)."""
    kept = [a for i, a in enumerate(args) if i not in dropped]
    if kept and args and kept[-1] is not args[-1]:
        kept[-1] = kept[-1].with_changes(comma=args[-1].comma)
    return kept


@transform("TPU411")
class ZeroOptimizer(Transform):
    """ZeroRedundancyOptimizer under DDP -> the plain optimizer it wraps. DDP already averages
    every gradient on every process, so stepping all parameters on each process gives the same
    values as ZeRO's step of a shard followed by its broadcast."""

    def _plan(self, call: cst.Call) -> tuple[str, cst.Arg | None, set[int]] | None:
        """(why not, None, {}) when the call cannot be rewritten; else ("", optimizer_class
        argument, positions of ZeRO's own arguments to drop)."""
        plain = plain_positional(call)
        roles = {_ZERO_OWN[i]: a for i, a in enumerate(plain[:len(_ZERO_OWN)])}
        roles.update({a.keyword.value: a for a in call.args
                      if a.keyword and a.keyword.value in _ZERO_OWN})
        cls = roles.get("optimizer_class")
        if cls is None:
            return (self.say("why_splat"), None, set())
        overlap = roles.get("overlap_with_ddp")
        if (overlap is not None and dotted(overlap.value) != "False"
                and "hook_with_zero_step" in self.ctx.source):
            return (self.say("why_overlap"), None, set())
        drop = {i for i, a in enumerate(call.args)
                if a is not roles.get("params") and any(a is v for v in roles.values())}
        # `fused=` goes as TPU204 drops it from any optimizer: CUDA's kernel (it raises on XLA)
        drop |= {i for i, a in enumerate(call.args) if a.keyword and a.keyword.value == "fused"}
        return "", cls, drop

    def _message(self, call: cst.Call, new: str) -> str:
        return self.say("zero", code=self.ctx.short(call), new=new)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) not in ZERO_NAMES:
            return None
        why, cls, drop = self._plan(original)
        if cls is None:
            self.ctx.report(self.rule, original,
                            self._message(original, self.say("plain_optimizer"))
                            + self.say("not_rewritten", why=why), applied=False, fix=FixKind.NONE)
            return None
        new = self.ctx.code(cls.value)
        return self.fix_or_report(original, self._message(original, new), lambda: updated.with_changes(
            func=updated.args[original.args.index(cls)].value,
            args=_without(list(updated.args), drop)))

    def _zero_targets(self) -> set[str]:
        """What this file assigns a ZeroRedundancyOptimizer that is rewritten (`opt`,
        `self.optimizer`): their `.consolidate_state_dict()` has nothing to gather."""
        def compute() -> set[str]:
            found = _Assignments(lambda v: isinstance(v, cst.Call)
                                 and self.ctx.qualify(v.func) in ZERO_NAMES
                                 and self._plan(v)[1] is not None)
            self.ctx.module.visit(found)
            return {self.ctx.code(t) for t in found.targets}
        return self.ctx.memo("zero_targets", compute)

    def visit_Expr(self, node: cst.Expr):
        """`optimizer.consolidate_state_dict(to=0)`: a plain optimizer has no such method (an
        AttributeError) and its state_dict() is whole on every process already."""
        call = node.value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "consolidate_state_dict"
                and "ZeroRedundancyOptimizer" in self.ctx.source
                and self.ctx.code(call.func.value) in self._zero_targets()):
            return None
        text = self.ctx.short(call)
        return self.fix_or_report(
            call, self.say("consolidate", code=text),
            lambda: StatementPlan([], f'removed "{text}": a plain optimizer\'s state_dict() is '
                                      "whole already"))


class _Assignments(cst.CSTVisitor):
    """The targets of `target = value` statements whose value `wanted(value)`."""

    def __init__(self, wanted) -> None:
        self.wanted = wanted
        self.targets: list[cst.BaseExpression] = []

    def visit_Assign(self, node: cst.Assign) -> None:
        if self.wanted(node.value):
            self.targets.extend(t.target for t in node.targets)
