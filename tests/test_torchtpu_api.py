"""Every `torch.tpu.*` name a torchtpu-target output uses exists in torch-tpu 0.2.0's public API,
and the two targets' outputs never import each other's backend.

The API list is read from the torch-tpu 0.2.0 wheel (`torch_tpu/_internal/public_api.py`) into
API.txt, vendored in tests/data: the test reads nothing outside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT
from torchtpu_outputs import INTERNAL, internal_names, uses_of
from torchtpu_outputs import outputs as outputs_now
from tpukit.rules import load_rules

VENDORED = ROOT / "tests" / "data" / "torchtpu-API.txt"


def api_file() -> Path:
    assert VENDORED.is_file(), f"{VENDORED} is part of the repository"
    return VENDORED


class Api:
    """torch-tpu's public names, read from API.txt: `names` are fully qualified
    (`torch.tpu.X`, `torch.tpu.ops.Y`, the members of `torch.tpu.EagerMode`); `namespaces` are
    the modules, and EagerMode, whose every public member is listed."""

    def __init__(self, text: str) -> None:
        self.names: set[str] = set()
        self.namespaces: set[str] = set()
        for line in text.splitlines():
            members = re.match(r"#\s*EagerMode members:\s*(.*)", line)
            if members:
                self.namespaces.add("torch.tpu.EagerMode")
                self.names |= {f"torch.tpu.EagerMode.{m}"
                               for m in re.findall(r"\b([A-Z][A-Z_]+)\b", members[1])}
            if line.startswith("#") or ":" not in line:
                continue
            module, _, listed = (part.strip() for part in line.partition(":"))
            self.namespaces.add(module)
            self.names |= {module} | {f"{module}.{n.strip()}" for n in listed.split(",") if n.strip()}

    def unknown(self, chains: set[str]) -> list[str]:
        """Chains that name something torch-tpu does not export: the longest public prefix
        must not be a namespace with more parts after it (after a function or class, the rest
        is an attribute of what it returns)."""
        bad = []
        for chain in sorted(chains):
            parts = chain.split(".")
            depth = 2  # torch.tpu
            while depth < len(parts) and ".".join(parts[: depth + 1]) in self.names:
                depth += 1
            if depth < len(parts) and ".".join(parts[:depth]) in self.namespaces:
                bad.append(chain)
        return bad


def load_api() -> Api:
    return Api(api_file().read_text())


def outputs(target: str) -> list[pytest.param]:
    """Each fixture's and example's output on `target`, with the source it was made from."""
    golden = {"xla": "xla.py", "torchtpu": "torchtpu.py"}[target]
    found = [pytest.param(p.read_text(), (p.parent / "cuda.py").read_text(),
                          id=f"{p.parent.name}/{golden}")
             for p in sorted(FIXTURES.glob(f"*/{golden}"))]
    found += [pytest.param(e.expected[target], e.before, id=f"{code}-example{i + 1}")
              for code, rule in load_rules().items()
              for i, e in enumerate(rule.examples) if target in e.expected]
    return found


def _top_modules(source: str) -> set[str]:
    return {m.split(".")[0] for m in uses_of(source).imported}


TORCHTPU_OUTPUTS = outputs("torchtpu")
XLA_OUTPUTS = outputs("xla")


def test_every_fixture_has_a_torchtpu_golden():
    assert len([p for p in TORCHTPU_OUTPUTS if p.id.endswith("torchtpu.py")]) == len(
        list(FIXTURES.glob("*/cuda.py")))


@pytest.mark.parametrize("source,before", TORCHTPU_OUTPUTS)
def test_torchtpu_output_uses_only_public_torch_tpu_names(source, before):
    api = load_api()
    assert api.unknown(uses_of(source).tpu_chains()) == []


@pytest.mark.parametrize("source,before", TORCHTPU_OUTPUTS)
def test_torchtpu_output_imports_no_torch_xla(source, before):
    # (code that imports torch_xla itself, diffusers' pipelines, still does)
    assert "torch_xla" not in _top_modules(source) - _top_modules(before)


@pytest.mark.parametrize("source,before", XLA_OUTPUTS)
def test_xla_output_imports_no_torch_tpu_and_uses_no_torch_tpu_names(source, before):
    names = uses_of(source)
    assert not [m for m in names.imported if m.split(".")[0] == "torch_tpu"]
    assert not names.tpu_chains()


def test_torchtpu_output_that_uses_the_device_imports_torch_tpu():
    for param in TORCHTPU_OUTPUTS:
        source = param.values[0]
        names = uses_of(source)
        # library code's port runs under `_tpukit_on_torchtpu()`: once its program imported it
        guarded = "_tpukit_on_torchtpu" in {c.func for c in names.calls}
        if (names.tpu_chains() or re.search(r"""["']tpu(_dist)?["']""", source)) and not guarded:
            assert "torch_tpu" in names.imported, param.id


# The checker itself: it must catch what it is there to catch.
def test_checker_flags_a_name_torch_tpu_does_not_export_through_an_alias():
    api = load_api()
    source = "import torch as th\nfrom torch import tpu\nth.tpu.empty_cache()\ntpu.memory_allocated()\n"
    assert api.unknown(uses_of(source).tpu_chains()) == [
        "torch.tpu.empty_cache", "torch.tpu.memory_allocated"]


def test_checker_accepts_submodule_names_and_eager_mode_members():
    api = load_api()
    source = ("import torch\n"
              "torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)\n"
              "torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=4)\n"
              "torch.tpu.current_stream().wait_stream(s)\n")
    assert api.unknown(uses_of(source).tpu_chains()) == []
    bad = "import torch\ntorch.tpu.EagerMode.LAZY\ntorch.tpu.distributed.launch()\n"
    assert api.unknown(uses_of(bad).tpu_chains()) == [
        "torch.tpu.EagerMode.LAZY", "torch.tpu.distributed.launch"]


def test_torch_tpu_names_tpukit_renames_to_are_public():
    # TPU117 renames torch.cuda.X to torch.tpu.X for the names its table lists.
    api = load_api()
    table = load_rules()["TPU117"].target("torchtpu")
    assert [n for n in table["exported"] if f"{table['rename']}.{n}" not in api.names] == []


# -- TorchTPU's internal device API (tests/data/torchtpu-INTERNAL.txt, read off the wheel) ----
INTRODUCED = [pytest.param(uses, id=name) for name, _source, uses in outputs_now()]


@pytest.mark.parametrize("uses", INTRODUCED)
def test_torchtpu_output_introduces_no_internal_torch_tpu_name(uses):
    # torch-tpu 0.2.0 raises "... is internal to TorchTPU" when user code calls these.
    internal = internal_names()
    assert [c for c in sorted(uses.chains)
            if any(c == name or c.startswith(name + ".") for name in internal)] == []


@pytest.mark.parametrize("uses", INTRODUCED)
def test_torchtpu_output_sets_the_eager_mode_through_the_property(uses):
    # torch.tpu.set_eager_mode is a context manager: as a statement of its own it sets nothing.
    assert [c.code for c in uses.calls if c.statement and c.func == "torch.tpu.set_eager_mode"] == []


def test_internal_names_name_a_torch_accelerator_replacement():
    internal = internal_names()
    assert len(internal) >= 10 and "torch.tpu.synchronize" in internal
    assert all(preferred.startswith("torch.accelerator.") for preferred in internal.values())


def test_internal_check_catches_what_it_is_there_to_catch():
    source = ("import torch as th\nfrom torch.tpu import synchronize\nth.tpu.device_count()\n"
              "th.tpu.set_eager_mode(th.tpu.EagerMode.DEFER_NEVER)\nth.tpu.device_of(x)\n")
    uses = uses_of(source)
    internal = internal_names()
    assert sorted(c for c in uses.chains if c in internal) == [
        "torch.tpu.device_count", "torch.tpu.synchronize"]
    assert sorted(c.func for c in uses.calls if c.statement) == [
        "torch.tpu.device_count", "torch.tpu.device_of", "torch.tpu.set_eager_mode"]
