"""Code that is CUDA's alone, whatever the port does around it: a function that overrides a
CUDA method or dispatches on another vendor, a function or `try` that imports a CUDA-only
package (rules/catalog/cuda.toml), so that a rule leaves it as written."""

from __future__ import annotations

import functools
import re

import libcst as cst

from tpukit.migrate.analysis.catalog import cuda_catalog, under
from tpukit.migrate.analysis.cuda_code import cuda_extensions
from tpukit.migrate.context import MigrationContext, dotted, string_value
from tpukit.migrate.nodes import first, walk
from tpukit.rules import engine_say, load_rules


CUDA_WORD = re.compile(r"(?:cuda|nccl)\Z", re.I)  # BNB_BACKEND = "CUDA", backend = "nccl"


def cuda_only_function(node: cst.FunctionDef, ctx: MigrationContext | None = None) -> str | None:
    """Why a function is CUDA-only code, which tpukit does not rewrite (its findings stay for
    a person): it is a module's own `cuda()` method (an override of `nn.Module.cuda`), its
    body imports a CUDA-only library (TensorRT calibration, a triton kernel's launcher), or, in
    library code, it picks among other vendors' devices (`_vendor_dispatch`). What it is
    called says nothing."""
    why = _overrides_cuda(node, ctx) or _importing(node, ctx)
    if why is None and ctx is not None and ctx.owner_leaves("guards", "vendor_dispatch"):
        why = ctx.memo(("vendor_dispatch", id(node)), lambda: _vendor_dispatch(ctx, node))
    return why


def _overrides_cuda(node: cst.FunctionDef, ctx: MigrationContext | None) -> str | None:
    """A class's `cuda` method: what `module.cuda()` runs (torch's API name, not a spelling)."""
    if ctx is None or node.name.value != "cuda" or id(node) not in ctx.values.method_of:
        return None
    return engine_say("migrate", "why_named_cuda", name=node.name.value)


def _vendor_dispatch(ctx: MigrationContext, node: cst.FunctionDef) -> str | None:
    """Library code that picks among vendors: a function that names another vendor's device
    (`torch.xpu`, `torch.device("npu")`) beside CUDA. DeepSpeed's `get_accelerator` asks
    `torch.cuda.device_count() == 0` before it looks for an XPU: as a count of XLA devices it
    started the runtime in the launcher; accelerate's `default_device` returns the CPU on a TPU
    host (its XLA path sets the device elsewhere). The library supports the devices it names;
    XLA's support, if it has any, is its own code."""
    def other(n: cst.CSTNode) -> str | None:
        if isinstance(n, cst.SimpleString) and string_value(n) in cuda_catalog().other_device_types:
            return n.value
        if isinstance(n, cst.Attribute):
            name = ctx.qualify(n)
            if cuda_catalog().other_gpu(name):
                return ctx.short(n)
        return None
    said = first(node.body, other)
    if said is None:
        return None
    return engine_say("migrate", "why_vendor_dispatch", name=node.name.value, other=said)


def _importing(node: cst.FunctionDef, ctx: MigrationContext | None = None) -> str | None:
    body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
    for stmt in body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if ported_import(ctx, small):
                continue
            modules = ([dotted(small.module) or ""] if isinstance(small, cst.ImportFrom)
                       and not small.relative else [dotted(a.name) or "" for a in small.names]
                       if isinstance(small, cst.Import) else [])
            for module in modules:
                if cuda_library(module):
                    return engine_say("migrate", "why_imports_cuda", name=node.name.value,
                                      module=module)
    return None


def cuda_only_try(node: cst.Try, path: str = "", ctx: MigrationContext | None = None) -> str | None:
    """Why a `try:` block is CUDA-only code: it starts by importing a CUDA extension (one the
    package's build script builds with torch's CUDAExtension: fairscale's `try: from
    fairscale import fused_adam_cuda` around its FusedAdam, which an ImportError hides where
    there is no CUDA), a CUDA-only library or torch's CUDA API, or None."""
    extensions = cuda_extensions(path)
    opening = node.body.body[0] if isinstance(node.body, cst.IndentedBlock) and node.body.body \
        else None
    imports = opening.body if isinstance(opening, cst.SimpleStatementLine) else ()
    for small in imports:
        if not isinstance(small, (cst.Import, cst.ImportFrom)) or ported_import(ctx, small):
            continue
        for name in imported_modules(small, full=True):
            if name in extensions or cuda_library(name) or cuda_catalog().cuda_torch_name(name):
                return engine_say("migrate", "why_try_imports_cuda", name=name)
    return None


def imported_modules(node: cst.Import | cst.ImportFrom, full: bool = False) -> list[str]:
    """What an import names: its module (from-imports) and each name it binds (not `*`);
    with `full`, a from-import's names under their module (`torch.utils.cpp_extension.
    CUDAExtension`)."""
    module = dotted(node.module) or "" if isinstance(node, cst.ImportFrom) else ""
    names = [module] if isinstance(node, cst.ImportFrom) else []
    if not isinstance(node.names, cst.ImportStar):
        prefix = f"{module}." if full and module else ""
        names += [prefix + (dotted(a.name) or "") for a in node.names]
    return names


def cuda_package(value: str | None) -> bool:
    """A string that is the exact name of a CUDA-only distribution (rules/catalog/cuda.toml)."""
    return value is not None and value in cuda_catalog().cuda_only_packages


@functools.cache
def cuda_only_equivalents(target: str) -> dict[str, dict]:
    """Names in CUDA-only libraries with a torch equivalent on `target` (a TPU9xx rule's
    `[targets.T.equivalents]`: `name = { module, args }`): `from apex.parallel import
    DistributedDataParallel` is torch's DistributedDataParallel where it is given the module
    alone."""
    return {name: entry for rule in load_rules().values()
            if rule.extra.get("engine") == "cuda-only-import"
            for name, entry in rule.target(target).get("equivalents", {}).items()}


def ported_import(ctx: MigrationContext | None, node) -> str | None:
    """The module torch has the names of the from-import `node` in, where each name it imports
    from a CUDA-only library is an equivalent on this target (cuda_only_equivalents) and every
    call of it in the file passes no more than the equivalent takes (`args`: positional
    arguments, no keywords); else None. Such an import is ported, not CUDA-only code."""
    if ctx is None or not isinstance(node, cst.ImportFrom) or node.relative \
            or isinstance(node.names, cst.ImportStar) or node.module is None:
        return None
    table = cuda_only_equivalents(ctx.target)
    module = dotted(node.module) or ""
    entries = [table.get(f"{module}.{dotted(a.name)}") for a in node.names]
    if not entries or None in entries or len({e["module"] for e in entries}) != 1:
        return None
    wanted = {f"{module}.{dotted(a.name)}": e for a, e in zip(node.names, entries)}

    def fits(call: cst.Call, entry: dict) -> bool:
        return (len(call.args) <= entry.get("args", 1)
                and all(a.keyword is None and not a.star for a in call.args))

    def compute() -> str | None:
        values = ctx.values
        for call, _ in values.calls:
            entry = wanted.get(values.qualified(call.func) or "")
            if entry is not None and not fits(call, entry):
                return None
        return entries[0]["module"]

    # asked of one import by the guards, the CUDA-only checks, the rewriter and the rule
    return ctx.memo(("ported_import", id(node)), compute)


def ported_names(ctx: MigrationContext) -> dict[str, str]:
    """The qualified names the file's ported imports (ported_import) bring in, each with
    torch's name it now stands for (`apex.parallel.DistributedDataParallel` ->
    `torch.nn.parallel.DistributedDataParallel`)."""
    def compute() -> dict[str, str]:
        names = {}
        for node in walk(ctx.module):
            module = ported_import(ctx, node) if isinstance(node, cst.ImportFrom) else None
            if module is not None:
                names.update({f"{dotted(node.module)}.{dotted(a.name)}":
                              f"{module}.{dotted(a.name)}" for a in node.names})
        return names

    roots = {name.split(".")[0] for name in cuda_only_equivalents(ctx.target)}
    if not any(root in ctx.source for root in roots):  # (a prefilter: spare the walk)
        return {}
    return ctx.memo("ported_names", compute)


def ported_as(ctx: MigrationContext, names: set[str] | frozenset[str]) -> set[str]:
    """`names` (torch's), with the ported CUDA-only names that are now one of them (Apex's
    DistributedDataParallel for torch's)."""
    return set(names) | {name for name, now in ported_names(ctx).items() if now in names}


def cuda_library(name: str) -> bool:
    """A module only a CUDA machine has (rules/catalog/cuda.toml, the TPU9xx rules' modules)."""
    return cuda_catalog().cuda_only_library(name)


def is_cuda_only(name: str) -> bool:
    """A module a TPU9xx rule flags (its own finding says what to use instead)."""
    return bool(name) and under(name, cuda_only_modules())


@functools.cache
def cuda_only_modules() -> tuple[str, ...]:
    """The modules the CUDA-only-library rules (TPU9xx) name."""
    return tuple(m for rule in load_rules().values()
                 if rule.extra.get("engine") == "cuda-only-import" for m in rule.extra["modules"])
