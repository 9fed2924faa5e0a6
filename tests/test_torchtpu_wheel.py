"""The contract with the real torch-tpu 0.2.0 wheel: every fixture and every rule example,
migrated with --target torchtpu, uses only `torch.tpu.*` / `torch.accelerator.*` attributes
that exist, and none of the calls it makes raises TorchTPU's internal-API error, is called
with arguments it does not take, or is a context manager called as a bare statement.

Runs in the venv `make test-torchtpu` builds (torch==2.13.0+cpu, torch-tpu==0.2.0, libtpu;
.ci/run calls it), where `import torch_tpu` works without a TPU. What needs a TPU to answer
("Cannot access accelerator device when none is available") is the only error allowed, and
the test says how many calls ended so. In the main venv (torch 2.9 for torch_xla) the module
is skipped, unless TPUKIT_REQUIRE_TORCH_TPU=1, which `make test-torchtpu` sets so a broken
install fails instead of skipping.
"""

from __future__ import annotations

import os
import re

import pytest

from torchtpu_outputs import NO_TPU, Uses, outputs, run_worker, uses_of

if os.environ.get("TPUKIT_REQUIRE_TORCH_TPU") != "1":
    pytest.importorskip("torch_tpu", reason="no torch-tpu here: `make test-torchtpu` runs this "
                        "against the real wheel in a venv of its own")

INTERNAL = re.compile(r"is internal to TorchTPU")


@pytest.fixture(scope="module")
def outcomes():
    """Every introduced chain, call and assignment across all outputs, made once against the
    wheel (one worker process), with the outputs that use each."""
    every, users = Uses(), {}
    for name, _source, uses in outputs():
        every.merge(uses)
        for key in uses.keys():
            users.setdefault(key, set()).add(name)
    lines = run_worker(every)
    assert len(lines) == len(users), lines[-3:]
    for line in lines:
        line["users"] = sorted(users[line["key"]])
    return lines


def _failures(lines, kind, allowed=NO_TPU):
    return [line for line in lines if kind in line and "error" in line
            and not allowed.search(line.get("message", ""))]


def test_outputs_use_the_device_api_at_all(outcomes):
    # The contract is about something: the outputs call torch.accelerator and torch.tpu.
    called = {line["call"].split("(")[0] for line in outcomes if "call" in line}
    assert {"torch.accelerator.is_available", "torch.accelerator.synchronize",
            "torch.accelerator.device_count"} <= called
    assert any(line.get("assignment", "").startswith("torch.tpu.eager_mode = ") for line in outcomes)


def test_every_attribute_the_outputs_use_exists_in_the_wheel(outcomes):
    assert _failures(outcomes, "chain", allowed=re.compile("^$")) == []


def test_no_call_the_outputs_make_is_internal_or_wrong(outcomes):
    bad = _failures(outcomes, "call")
    assert bad == [], "\n".join(f"{b['call']}: {b['error']}: {b['message']} (in {b['users'][:3]})"
                                for b in bad)


def test_no_output_calls_a_context_manager_as_a_bare_statement(outcomes):
    assert [line for line in outcomes if line.get("error") == "BareContextManager"] == []


def test_the_eager_mode_assignment_sets_the_mode(outcomes):
    assert _failures(outcomes, "assignment", allowed=re.compile("^$")) == []


def test_say_how_many_calls_only_a_tpu_can_answer(outcomes, capsys):
    made = [line for line in outcomes if "call" in line and line.get("value") != "not called"]
    no_tpu = [line for line in made if NO_TPU.search(line.get("message", ""))]
    with capsys.disabled():
        print(f"\ntorch-tpu contract: {len(made)} calls made, {len(made) - len(no_tpu)} answered, "
              f"{len(no_tpu)} need a TPU to answer: "
              + ", ".join(sorted({line["call"] for line in no_tpu}))
              + "; answered: " + ", ".join(sorted({line["call"] for line in made
                                                   if line not in no_tpu})))
    assert len(made) > len(no_tpu)  # some calls ran all the way here (manual_seed, ...)


# The checker itself: it must catch what it is there to catch.
def test_checker_catches_internal_calls_missing_names_and_bare_context_managers():
    source = ("import torch\nimport torch_tpu\n"
              "torch.tpu.synchronize()\n"
              "torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)\n"
              "torch.tpu.no_such_name\n"
              "torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_NEVER\n")
    lines = {next(iter(line.values())): line for line in run_worker(uses_of(source))}
    assert INTERNAL.search(lines["torch.tpu.synchronize()"]["message"])
    assert lines["torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)"]["error"] == \
        "BareContextManager"
    assert lines["torch.tpu.no_such_name"]["error"] == "AttributeError"
    assert "error" not in lines["torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_NEVER"]


def test_the_vendored_api_list_names_what_the_wheel_exports():
    # tests/data/torchtpu-API.txt (what the static tests in the main venv check outputs against)
    # is the real wheel's: each listed name resolves here, each listed module is importable.
    import importlib

    from conftest import ROOT

    missing = []
    for line in (ROOT / "tests" / "data" / "torchtpu-API.txt").read_text().splitlines():
        if line.startswith("#") or ":" not in line:
            continue
        module, _, names = (part.strip() for part in line.partition(":"))
        importlib.import_module("torch_tpu")
        owner = importlib.import_module("torch")
        for part in module.split(".")[1:]:
            owner = getattr(owner, part)
        exported = set(dir(owner))   # not getattr: a property may ask for the TPU
        missing += [f"{module}.{n.strip()}" for n in names.split(",") if n.strip()
                    and n.strip() not in exported]
    assert missing == []
