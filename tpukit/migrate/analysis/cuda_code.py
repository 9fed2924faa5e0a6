"""Whether a library module is CUDA's own code, or another vendor's, from what it imports at
its top level (rules/catalog/cuda.toml): a module that imports a CUDA-only library (Triton
kernels, bitsandbytes' CUDA functions, TensorRT) is that library's CUDA path, and one that
imports another vendor's extension of torch (`torch_npu`), or uses another vendor's torch
namespace (`torch.npu`) and nothing of CUDA's, is that vendor's backend. Its file or package
name says nothing. Only library code is read this way: a program's module is
ported whole, its imports of CUDA-only libraries flagged by their rules (TPU9xx)."""

from __future__ import annotations

import functools
from pathlib import Path

import libcst as cst

from tpukit.migrate.analysis.catalog import cuda_catalog
from tpukit.migrate.nodes import dotted, import_bindings, string_value, walk
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


def _torch_names(module: cst.Module) -> set[str]:
    """The names the module's top-level `import torch [as x]` bind to torch."""
    names = set()
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        if dotted(alias.name) == "torch":
                            names.add(alias.asname.name.value if alias.asname else "torch")
    return names


def _other_vendor_use(module: cst.Module) -> str | None:
    """Another vendor's torch namespace the module uses (`torch.npu.synchronize()`,
    `torch.mps.empty_cache()`) where it uses none of CUDA's: that vendor's backend of the
    library (DeepSpeed's accelerator/npu_accelerator.py), or None."""
    torch = _torch_names(module)
    if not torch:
        return None
    catalog = cuda_catalog()
    other = None
    for node in walk(module):
        if not isinstance(node, cst.Attribute):
            continue
        path = dotted(node) or ""
        root, _, rest = path.partition(".")
        if root not in torch or not rest:
            continue
        name = f"torch.{rest}"
        if name == "torch.cuda" or name.startswith("torch.cuda."):
            return None
        if other is None and catalog.other_gpu(name):
            other = path
    return other


def cuda_only_module(module: cst.Module, name: str) -> str | None:
    """Why the library module `name` is CUDA's (or another vendor's) own code, or None."""
    catalog = cuda_catalog()
    for imported in _top_level_imports(module):
        if catalog.other_vendor_library(imported):
            return engine_say("migrate", "why_vendor_module", module=name,
                              part=f"it imports {imported}")
        if catalog.cuda_only_library(imported):
            return engine_say("migrate", "why_cuda_module", module=name,
                              part=f"it imports {imported}, a CUDA-only library")
    used = _other_vendor_use(module)
    if used is not None:
        return engine_say("migrate", "why_vendor_module", module=name,
                          part=f"it uses {used} and nothing of CUDA's")
    return None


_BUILDS = {"setuptools.setup", "distutils.core.setup"}


def _calls(module: cst.Module, wanted: set[str]):
    """The module's calls of the qualified names `wanted`, by the names its imports give."""
    names = import_bindings(module)
    for node in walk(module):
        if isinstance(node, cst.Call):
            path = dotted(node.func) or ""
            head, _, rest = path.partition(".")
            if head in names and names[head] + (f".{rest}" if rest else "") in wanted:
                yield node


def builds_a_package(module: cst.Module) -> bool:
    """Does the module call setuptools' (or distutils') `setup()` (a build script), by the
    name its imports give that function?"""
    return next(_calls(module, _BUILDS), None) is not None


_CUDA_EXTENSION = {"torch.utils.cpp_extension.CUDAExtension"}


def cuda_extensions(path: str) -> frozenset[str]:
    """The modules the build script of the project `path` is in builds with torch's
    CUDAExtension (`CUDAExtension("fairscale.fused_adam_cuda", ...)`): they exist only where
    CUDA does. The build script is the nearest setup.py in the folders above `path`."""
    return _folder_extensions(str(Path(path).resolve().parent)) if path else frozenset()


@functools.lru_cache(maxsize=256)
def _folder_extensions(folder: str) -> frozenset[str]:
    here = Path(folder)
    for above in (here, *here.parents):
        script = above / "setup.py"
        if script.is_file():
            return _built_extensions(str(script))
    return frozenset()


@functools.lru_cache(maxsize=64)
def _built_extensions(script: str) -> frozenset[str]:
    try:
        module = cst.parse_module(Path(script).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
        return frozenset()
    built = set()
    for call in _calls(module, _CUDA_EXTENSION):
        given = next((a.value for a in call.args if a.keyword is None or a.keyword.value == "name"),
                     None)
        name = string_value(given) if given is not None else None
        if name:
            built.add(name)
    return frozenset(built)
