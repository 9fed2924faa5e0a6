"""Facts that cross the program's modules: what the callers in one module give a function of
another (a DataLoader, a device), what a function does with its parameters (compares one as a
device string, moves tensors to it, starts a process group with it), and what calling a class
of another module makes (an nn.Module).

`train.py` has `device_type = 'cuda'` and calls `model.configure_optimizers(device_type)`,
whose module compares it with 'cuda' to pick fused AdamW: the string is a device string by
what `model.py` does with it. UNet's `evaluate(net, val_loader, device, amp)` gives
`evaluate.py` a DataLoader: its loop is a loader's, whatever `evaluate.py` calls it.

Computed once per run by `tpukit migrate` (command.build_jobs) over the program files that
import one another, with the same Values each file's migration builds, and handed to each
file's migration as plain data (picklable: worker processes get it with their job).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from tpukit.config import real_path
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.bindings import (
    Assigned,
    Defined,
    Imported,
    absolute_import,
    positional_params,
)
from tpukit.migrate.analysis.values import Values

# What crosses a module boundary.
FORWARD = frozenset({K.LOADER, K.DEVICE, K.CUDA, K.MODULE, K.OPTIMIZER, K.SCHEDULER, K.RANK,
                     K.BACKEND, K.TENSOR, K.GENERATOR, K.CONTAINER, K.ARGS})
BACKWARD = frozenset({K.DEVICE, K.BACKEND, K.SCALE, K.PROCESS_COUNT, K.STRING_USE})
CLASS_KINDS = frozenset({K.MODULE, K.OPTIMIZER, K.LOADER, K.SCHEDULER})


@dataclass
class FileFacts:
    """What one module exports and what it calls in the others."""

    module: str
    # qualname -> parameter names (positional first), what each is used as, what it returns
    params: dict[str, list[str]] = field(default_factory=dict)
    param_uses: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    class_kinds: dict[str, frozenset[str]] = field(default_factory=dict)
    # calls of other modules' functions: (module, qualname, skip, [(index | keyword, kinds,
    # the caller's variable: (scope qualname, name) | None)])
    calls: list[tuple[str, str, int, list]] = field(default_factory=list)
    # names this module imports from another (`from .distributed import init_device` in a
    # package's __init__): name -> the absolute `module.name`
    reexports: dict[str, str] = field(default_factory=dict)
    option_uses: dict[str, frozenset[str]] = field(default_factory=dict)
    # `x.module` reads whose `x` the dataflow knows nothing of (`getattr(self, "net" +
    # name).module`): the code of each
    module_reads: list[str] = field(default_factory=list)


@dataclass
class Received:
    """What the rest of the program says about one file: passed to its Values."""

    param_kinds: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    external_uses: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    imported_kinds: dict[str, frozenset[str]] = field(default_factory=dict)
    # argparse option -> what the program's modules do with it (one namespace, handed around:
    # timm's train.py defines `--device`, timm.utils.distributed makes it a torch.device)
    option_uses: dict[str, frozenset[str]] = field(default_factory=dict)
    # (module, code) of the `.module` reads of the other modules that nothing is known of
    module_reads: list[tuple[str, str]] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.param_kinds or self.external_uses or self.imported_kinds
                    or self.option_uses or self.module_reads)


def module_name(path: Path, roots: list[Path]) -> str | None:
    """`a.b` for root/a/b.py (or root/a/b/__init__.py), under the first root that holds it."""
    resolved = real_path(path)
    for root in roots:
        try:
            rel = resolved.relative_to(real_path(root))
        except ValueError:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts) if parts else None
    return None


def _symbol_key(values: Values, symbol) -> tuple[str, str] | None:
    if symbol is None or symbol[0] != "name":
        return None
    scope = next((s for s in [values.module_scope, *values.scopes.values()]
                  if id(s) == symbol[1]), None)
    return (scope.qualname, symbol[2]) if scope is not None else None


def file_facts(source: str | cst.Module, module: str, is_package: bool,
               received: Received | None = None) -> FileFacts:
    tree = cst.parse_module(source) if isinstance(source, str) else source
    values = Values(tree, received=received, module_name=module, is_package=is_package)
    facts = FileFacts(module)
    for qualname, function in values.functions_by_qualname.items():
        params = [p.name.value for p in [*positional_params(function.params),
                                         *function.params.kwonly_params]]
        facts.params[qualname] = params
        uses = {}
        for p in [*positional_params(function.params), *function.params.kwonly_params]:
            said = values.parameter_uses(function, p) & BACKWARD
            if said:
                uses[p.name.value] = frozenset(said)
        if uses:
            facts.param_uses[qualname] = uses
    for dest, said in values.all_option_uses().items():
        if said & BACKWARD:
            facts.option_uses[dest] = frozenset(said & BACKWARD)
    for scope in [values.module_scope]:
        for name, bindings in scope.names.items():
            for b in bindings:
                if isinstance(b, Imported) and len(bindings) == 1:
                    full = absolute_import(b.qualified, module, is_package)
                    if "." in full:
                        facts.reexports[name] = full
                if isinstance(b, Defined) and isinstance(b.node, cst.ClassDef):
                    kinds = values.instance_kinds(b.node) & CLASS_KINDS
                    if kinds:
                        facts.class_kinds[name] = frozenset(kinds)
    facts.module_reads = values.unresolved_module_reads()
    for call, scope in values.calls:
        target = _target(values, call, module, is_package)
        if target is None:
            continue
        target_module, qualname, skip = target
        given = []
        for i, arg in enumerate(call.args):
            if arg.star:
                break
            where = arg.keyword.value if arg.keyword is not None else i
            kinds = values.kinds(arg.value) & FORWARD
            key = _symbol_key(values, values.symbol(arg.value)) if isinstance(
                arg.value, (cst.Name, cst.Attribute)) else None
            if kinds or key is not None:
                given.append((where, frozenset(kinds), key))
        if given:
            facts.calls.append((target_module, qualname, skip, given))
    return facts


def _target(values: Values, call: cst.Call, module: str,
            is_package: bool) -> tuple[str, str, int] | None:
    """(module, qualname in it, leading parameters to skip) of a call of another module's
    function, class or method: `evaluate(...)` after `from evaluate import evaluate`,
    `Net(...)`, `model.configure_optimizers(...)` on `model = Net()`."""
    func = call.func
    qualified = values.qualified(func)
    if qualified is not None:
        full = _imported_name(values, func, module, is_package)
        if full is None and isinstance(func, cst.Attribute):
            # `utils.init_distributed_device(args)` after `from timm import utils`
            full = absolute_import(qualified, module, is_package)
        if full is not None and "." in full:
            mod, _, name = full.rpartition(".")
            return mod, name, 0
        return None
    if isinstance(func, cst.Attribute):
        for value in _assigned_values(values, func.value):
            # `model = Net().cuda()`: the instance `Net()` made, moved
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                    and value.func.attr.value in K.SAME_KIND_METHODS:
                value = value.func.value
            if isinstance(value, cst.Call):
                full = _imported_name(values, value.func, module, is_package)
                if full is not None:
                    mod, _, cls = full.rpartition(".")
                    return mod, f"{cls}.{func.attr.value}", 1
    return None


def _imported_name(values: Values, func: cst.BaseExpression, module: str,
                   is_package: bool) -> str | None:
    """The absolute `module.name` a Name bound by a `from X import name` stands for."""
    if not isinstance(func, cst.Name):
        return None
    found = values.bindings(func)
    imported = [b for b in found if isinstance(b, Imported)]
    if not imported or len(imported) != len(found):
        return None
    full = absolute_import(imported[-1].qualified, module, is_package)
    return full if "." in full else None


def _assigned_values(values: Values, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expr, cst.Name):
        return [b.value for b in values.bindings(expr) if isinstance(b, Assigned) and not b.path]
    return []


def combine(facts: dict[Path, FileFacts]) -> dict[Path, Received]:
    """What each file receives from the others' calls and definitions."""
    by_module = {f.module: (path, f) for path, f in facts.items()}
    received = {path: Received() for path in facts}
    for path, f in facts.items():
        for target_module, qualname, skip, given in f.calls:
            if target_module not in by_module:
                continue
            target_path, target = by_module[target_module]
            for _ in range(3):  # a package's __init__ that imports the function from a module
                full = target.reexports.get(qualname)
                if qualname in target.params or full is None:
                    break
                mod, _, qualname = full.rpartition(".")
                if mod not in by_module:
                    break
                target_path, target = by_module[mod]
            params = target.params.get(qualname)
            if params is None and qualname in target.class_kinds or (
                    params is None and f"{qualname}.__init__" in target.params):
                params = target.params.get(f"{qualname}.__init__")
                qualname = f"{qualname}.__init__"
                skip = 1
            if params is None:
                continue
            params = params[skip:]
            for where, kinds, key in given:
                name = where if isinstance(where, str) else (
                    params[where] if where < len(params) else None)
                if name is None or name not in params:
                    continue
                if kinds:
                    into = received[target_path].param_kinds.setdefault(qualname, {})
                    into[name] = into.get(name, frozenset()) | kinds
                uses = target.param_uses.get(qualname, {}).get(name)
                if uses and key is not None:
                    mine = received[path].external_uses
                    mine[key] = mine.get(key, frozenset()) | uses
        for other_path, other in facts.items():
            for dest, uses in other.option_uses.items():
                mine = received[path].option_uses
                mine[dest] = mine.get(dest, frozenset()) | uses
            if other_path == path:
                continue
            received[path].module_reads.extend((other.module, code) for code in other.module_reads)
            for cls, kinds in other.class_kinds.items():
                received[path].imported_kinds[f"{other.module}.{cls}"] = kinds
    return received


def program_facts(files: list[Path], roots: list[Path]) -> dict[Path, Received]:
    """The facts each of `files` receives from the others (only files with something)."""
    parsed = {}
    for path in files:
        module = module_name(path, roots)
        if module is None:
            continue
        try:
            parsed[path] = (cst.parse_module(path.read_text(encoding="utf-8")), module)
        except (OSError, UnicodeDecodeError, cst.ParserSyntaxError, RecursionError):
            continue  # the file's own migration says what is wrong with it
    received: dict[Path, Received] = {}
    # Twice: what one module learns (another's class is an nn.Module) changes what it gives
    # the next (`evaluate(model, ...)` gives a module).
    for _ in range(2):
        facts = {path: file_facts(tree, module, path.name == "__init__.py", received.get(path))
                 for path, (tree, module) in parsed.items()}
        received = combine(facts)
    return {path: r for path, r in received.items() if not r.empty()}
