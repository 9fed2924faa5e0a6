"""CUDA-only code no rule ports, read from the code as written: what keeps a guard CUDA's
(guards.py) and what a call-map rule must not start (api_map.py). A torch.cuda name is
unported where no rule rewrites it (a call-map entry for it or a module it is in, or a rule
that claims it); a flag is CUDA's where an `if` that reads it decides such code."""

from __future__ import annotations

import functools

import libcst as cst

from tpukit.migrate.analysis.catalog import cuda_catalog
from tpukit.migrate.analysis.cuda_only import (cuda_package, imported_modules, is_cuda_only,
                                                ported_import, ported_names)
from tpukit.migrate.context import MigrationContext, string_value
from tpukit.migrate.nodes import scan, walk
from tpukit.rules import load_rules


def flag_name(target: cst.BaseExpression) -> str | None:
    """The name a flag assigned to `target` is shown by: a variable's (`use_pin`), an
    attribute's (`self.is_cuda`); None for anything else (a subscript, a tuple)."""
    if isinstance(target, cst.Attribute):
        return target.attr.value
    return target.value if isinstance(target, cst.Name) else None


def flag_key(ctx: MigrationContext, target: cst.BaseExpression) -> tuple | None:
    """What identifies the flag `target` (a node of the file as written) names: its variable
    (values.symbol: a name in its scope, a `self` attribute of its class, an argparse
    option), or an attribute of any other object by that object's code (`cfg.pin`); None for
    anything else (a subscript, a tuple)."""
    if not isinstance(target, (cst.Name, cst.Attribute)):
        return None
    symbol = ctx.values.symbol(target)
    if symbol is None and isinstance(target, cst.Attribute):
        return ("of", ctx.code(target.value), target.attr.value)
    return symbol


def cuda_under_flag(ctx: MigrationContext, key: tuple) -> str | None:
    """What CUDA-only code the flag `key` (flag_key) decides (`_guards_cuda_only`), once per
    file."""
    return ctx.memo(("cuda_flag", key), lambda: _guards_cuda_only(ctx, key))


def flag_deciding_cuda(ctx: MigrationContext, node: cst.If) -> tuple[str, str] | None:
    """A variable or attribute the branches of an `if` (of the file as written) assign
    (`use_pin = False`, `self.pin = flag`) that elsewhere decides CUDA-only code no rule
    ports: its name and that code; else None."""
    targets = (n.target for branch in filter(None, (node.body, node.orelse))
               for n in walk(branch) if isinstance(n, (cst.AssignTarget, cst.AnnAssign)))
    keys = {key: flag_name(t) for t in targets if (key := flag_key(ctx, t)) is not None}
    for key, name in keys.items():
        left = cuda_under_flag(ctx, key)
        if left:
            return name, left
    return None


@functools.cache
def _unported_call(target: str, name: str) -> bool:
    """No call-map rule rewrites `name` on `target` (its entry, if any, only says what to do)."""
    for rule in load_rules().values():
        entry = rule.target(target).get("calls", {}).get(name)
        if entry is not None and any(k in entry for k in ("replace", "statements", "remove")):
            return False
    return True


def _ported_by_a_rule(ctx: MigrationContext, name: str) -> bool:
    """Some rule rewrites the torch.cuda name `name` on this target: a call-map entry for it
    or for a module it is in, or a rule that claims it (the AMP rules' `torch.cuda.amp.*`)."""
    parts = name.split(".")
    prefixes = [".".join(parts[:i]) for i in range(len(parts), 2, -1)]
    if any(p in ctx.claimed for p in prefixes):
        return True
    return any(not _unported_call(ctx.target, p) for p in prefixes)


def unported_cuda_call(target: str, name: str | None) -> bool:
    """`name` (qualified) is CUDA-only code no rule ports: `torch.cuda.get_device_properties`,
    `torch.cuda.Stream`."""
    used = cuda_catalog().cuda_only_torch_api(name)
    return used is not None and _unported_call(target, used)


def _guards_cuda_only(ctx: MigrationContext, key: tuple) -> str | None:
    """What CUDA-only code a flag decides: the first thing no rule ports in either branch of
    an `if` (or conditional expression) whose test reads the flag `key` (`if not
    self.build_for_cpu: nvcc_args.append(...)`, deepspeed's op builder; timm's `if
    self.is_cuda: torch.cuda.Stream`), or None. Read from the code as written: what a rule
    would port does not count."""
    for node, read in ctx.memo("flag_tests", lambda: _flag_tests(ctx)):
        if key not in read:
            continue
        for branch in (node.body, node.orelse):
            if branch is None:
                continue
            if isinstance(node, cst.IfExp) and isinstance(branch, cst.SimpleString) \
                    and cuda_package(string_value(branch)):
                return branch.value  # `"onnxruntime-gpu" if cuda else "onnxruntime"`: a GPU build
            found = unported_cuda(ctx, branch)
            if found is not None:
                return found
    return None


def _flag_tests(ctx: MigrationContext) -> list[tuple[cst.If | cst.IfExp, set]]:
    """Each `if` and conditional expression of the file as written, in source order, with the
    flags (flag_key) its test reads: found once per file, for every flag asked about."""
    return [(node, {flag_key(ctx, n) for n in walk(node.test)
                    if isinstance(n, (cst.Name, cst.Attribute))})
            for node in walk(ctx.module) if isinstance(node, (cst.If, cst.IfExp))]


def unported_cuda(ctx: MigrationContext, node: cst.CSTNode) -> str | None:
    """The first CUDA-only thing in code as written that no rule ports, or None."""
    finder = _UnportedCuda(ctx)
    scan(node, finder)
    return finder.found


class _UnportedCuda(cst.CSTVisitor):
    def __init__(self, ctx: MigrationContext) -> None:
        self.ctx = ctx
        self.found: str | None = None

    def _torch_cuda_keyword(self, call: cst.Call) -> bool:
        """A CUDA keyword of one of torch's own functions (`cpp_extension.load(with_cuda=...,
        extra_cuda_cflags=...)`): found (True) where the call is torch's."""
        name = self.ctx.values.qualified(call.func) or ""
        if not name.startswith("torch."):
            return False
        keyword = next((a.keyword.value for a in call.args if a.keyword is not None
                        and cuda_catalog().cuda_keyword(name, a.keyword.value)), None)
        if keyword is not None:
            self.found = f"{keyword}="
        return keyword is not None

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.found is not None:
            return False
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value == "cuda":
            scan(node.func.value, self)  # `.cuda()` is ported; what it is called on may not be
            for arg in node.args:
                scan(arg, self)
            return False
        if isinstance(node, cst.Call) and node.args and self._torch_cuda_keyword(node):
            return False
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            # torch's own CUDA APIs (`CUDAExtension`) and CUDA-only libraries; a module of the
            # program is not CUDA's for what it is called; an import ported to torch's
            # equivalent is not CUDA's either
            if ported_import(self.ctx, node):
                return False
            hit = next((n for n in imported_modules(node, full=True) if
                        cuda_catalog().cuda_torch_name(n) or is_cuda_only(n)), None)
            if hit is not None:
                self.found = f"import {hit}"  # `from torch.utils.cpp_extension import CUDAExtension`
            return False
        if isinstance(node, (cst.Attribute, cst.Name)):
            name = self.ctx.qualify(node)
            if name is not None and name.startswith("torch.cuda"):
                if unported_cuda_call(self.ctx.target, name):
                    self.found = cuda_catalog().cuda_only_torch_api(name)
                elif not _ported_by_a_rule(self.ctx, name):
                    self.found = name  # `torch.cuda._pin_memory_utils.pin_memory`
                return False
            if name is not None and (is_cuda_only(name) or cuda_catalog().cuda_torch_name(name)) \
                    and name not in ported_names(self.ctx):
                self.found = self.ctx.short(node)  # an imported CUDA name: CUDAExtension
                return False
            # A local's own name (`cuda_kwargs`, `use_cuda`) says nothing about what it holds.
        return not isinstance(node, (cst.SimpleString, cst.FormattedString))
