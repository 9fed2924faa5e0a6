"""rules/catalog/cuda.toml against the installed torch (2.9): the CUDA names and keywords of
torch outside torch.cuda that the migrator reads by qualified name are torch's real ones, and
none is missing. The list is data; this test is how it was made and how it stays true:

    python -c "import torch.utils.cpp_extension as m; print([n for n in dir(m) if 'cuda' in n.lower()])"
"""

from __future__ import annotations

import importlib
import inspect

import pytest

from tpukit.migrate.analysis.catalog import cuda_catalog

torch = pytest.importorskip("torch")

# The modules whose CUDA names the catalog covers (torch.backends.cuda has its own rules).
MODULES = ("torch.utils.cpp_extension", "torch.serialization", "torch.version", "torch.compiler")


def _resolve(name: str):
    """The object `name` is in torch: a module (`torch.cuda.comm`) or an attribute."""
    try:
        return importlib.import_module(name)
    except ImportError:
        module, _, attr = name.rpartition(".")
        return getattr(importlib.import_module(module), attr)


def test_every_catalogued_torch_cuda_name_exists():
    for name in cuda_catalog().cuda_torch_names:
        _resolve(name)  # raises AttributeError where torch has no such name


def test_no_public_cuda_name_of_those_modules_is_missing():
    catalog = cuda_catalog()
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for attr in dir(module):
            if attr.startswith("_") or "cuda" not in attr.lower():
                continue
            if inspect.ismodule(getattr(module, attr)) and attr == "cuda":
                continue  # `torch.cuda` itself, reached through another module
            assert catalog.cuda_torch_name(f"{module_name}.{attr}"), f"{module_name}.{attr}"


def test_the_cuda_keywords_are_those_of_torchs_signatures():
    catalog = cuda_catalog()
    for function, keywords in catalog.cuda_torch_keywords.items():
        parameters = inspect.signature(_resolve(function)).parameters
        assert set(keywords) == {p for p in parameters if "cuda" in p.lower()}, function


def test_every_catalogued_torch_cuda_api_exists():
    for name in cuda_catalog().cuda_only_torch:
        _resolve(name)
