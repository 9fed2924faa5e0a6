"""TPU401 process-group: A NCCL or Gloo process group becomes the XLA process group (`xla://`).

Its messages and tables: rules/TPU401-process-group.toml.
"""

from __future__ import annotations

import re

import libcst as cst

from tpukit.findings import FixKind, Message, Severity
from tpukit.migrate.analysis.launch import (
    INIT_PROCESS_GROUP,
    chosen_at_run_time,
    env_key,
    group_calls,
)
from tpukit.migrate.context import (
    find_keyword,
    keyword_arg,
    plain_positional,
    string_value,
    with_commas,
    with_string,
)
from tpukit.migrate.device_facts import AVAILABILITY
from tpukit.migrate.nodes import first, scan, walk
from tpukit.migrate.transforms.base import StatementPlan, Transform, transform


RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT")


_NCCL_BACKEND = re.compile(r"^(?:nccl|cuda:nccl(?:,cpu:gloo)?|cpu:gloo,cuda:nccl)$")


DEFAULT_BACKEND = "torch.distributed.get_default_backend_for_device"


_CUDA_OR_CPU_BACKEND = re.compile(r"\b(?:nccl|gloo)\b")  # "nccl", "cuda:nccl,cpu:gloo"


def _backend_of(call: cst.Call) -> tuple[cst.Arg | None, str | None]:
    """init_process_group's backend argument (first positional or `backend=`), and its
    value where it is a string literal."""
    plain = plain_positional(call)
    backend = plain[0] if plain and call.args[0] is plain[0] else find_keyword(call, "backend")
    return backend, string_value(backend.value) if backend is not None else None


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
    scan(test, calls)
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


@transform("TPU401")
class ProcessGroup(Transform):
    uses = frozenset({"launch"})
    table_keys = frozenset({"backend", "imports", "rendezvous_env"})
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
        if backend is not None and written is None and chosen_at_run_time(self.ctx):
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
        self.backend_only: dict[cst.Call, tuple[Message, int | None]] = {}
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
        # a variable set to NCCL's name holds the backend, whatever it is called and wherever
        # it is read (here, through an option whose default it is, in another module)
        targets = self.ctx.assign_targets[-1] if self.ctx.assign_targets else ()
        target = next(iter(targets), None)
        if target is None or id(original) not in self.assigned_strings:
            return None
        if any(self.cuda_tests) or chosen_at_run_time(self.ctx):
            return None  # ... or one entry of a per-device choice (init_process_group says why)
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
        if len(node.targets) != 1 or not group_calls(self.ctx):
            return None
        key, _ = env_key(self.ctx, node.targets[0].target)
        return self._remove_rendezvous(node, key)

    def visit_Expr(self, node: cst.Expr):
        call = node.value
        if (isinstance(call, cst.Call) and self.ctx.qualify(call.func) == "os.environ.setdefault"
                and call.args and group_calls(self.ctx)):
            return self._remove_rendezvous(call, string_value(call.args[0].value))
        return None

    def _remove_rendezvous(self, node: cst.CSTNode, key: str | None):
        if key not in RENDEZVOUS_ENV or self.mapping.get("rendezvous_env") == "keep":
            return None
        if any(a.star for call in group_calls(self.ctx) for a in call.args):
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
