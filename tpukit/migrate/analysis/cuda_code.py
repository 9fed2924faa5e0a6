"""Whether a library module is CUDA's own code, or another vendor's, from what it imports at
its top level (rules/catalog/cuda.toml): a module that imports a CUDA-only library (Triton
kernels, bitsandbytes' CUDA functions, TensorRT) is that library's CUDA path, and one that
imports another vendor's extension of torch (`torch_npu`) is that vendor's backend. Its file
or package name says nothing. Only library code is read this way: a program's module is
ported whole, its imports of CUDA-only libraries flagged by their rules (TPU9xx)."""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis.catalog import cuda_catalog
from tpukit.migrate.nodes import dotted
from tpukit.rules import engine_say


def _top_level_imports(module: cst.Module):
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import):
                yield from (dotted(a.name) or "" for a in small.names)
            elif isinstance(small, cst.ImportFrom) and not small.relative and small.module:
                yield dotted(small.module) or ""


def cuda_only_module(module: cst.Module, name: str) -> str | None:
    """Why the library module `name` is CUDA's (or another vendor's) own code, or None."""
    catalog = cuda_catalog()
    for imported in _top_level_imports(module):
        if catalog.other_vendor_library(imported):
            return engine_say("migrate", "why_vendor_module", module=name, part=imported)
        if catalog.cuda_only_library(imported):
            return engine_say("migrate", "why_cuda_module", module=name,
                              part=f"{imported}, a CUDA-only library")
    return None
