"""A device variable keeps one type: a choice of device strings that the file reads as a
string stays a string ("xla", "tpu"), since a `torch.device` never equals a string."""

from __future__ import annotations

import textwrap

import pytest

from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import select_rules

RULES = select_rules([], [])


def out(source: str, target: str = "xla") -> str:
    options = MigrateOptions(rules=RULES, target=target)
    return migrate_source(textwrap.dedent(source).lstrip("\n"), "t.py", options).new_source


CHOICE = '"cuda" if torch.cuda.is_available() else "cpu"'


@pytest.mark.parametrize("target,device_type", [("xla", "xla"), ("torchtpu", "tpu")])
def test_a_choice_compared_as_a_string_stays_a_string_and_so_does_its_comparison(target, device_type):
    result = out(f"""
    import torch
    device = {CHOICE}
    x = torch.randn(2)
    if device == "cuda":
        x = x.to(device)
    """, target)
    assert f'device = "{device_type}"\n' in result
    assert f'if device == "{device_type}":' in result


@pytest.mark.parametrize("use", [
    'if "cuda" in device: pass',
    'if device.startswith("cuda"): pass',
    'use_amp = device in ("cuda", "mps")',
    'name = device + ":0"',
    'fast = "cuda" != device',
    # a device *type* (a str): `torch.autocast(device_type=torch.device(...))` raises
    "with torch.autocast(device_type=device, dtype=torch.bfloat16): pass",
    "with torch.autocast(device): pass",
])
def test_every_string_use_of_the_name_keeps_the_choice_a_string(use):
    result = out(f"import torch\ndevice = {CHOICE}\n{use}\n")
    assert 'device = "xla"' in result


@pytest.mark.parametrize("use", [
    "x = torch.randn(2).to(device)",
    'if device.type == "cuda": pass',
    'if str(device) == "cuda": pass',
    'print(f"on {device}")',
    'backend = "nccl" if device else "gloo"\nif backend == "nccl": pass',
])
def test_only_the_names_read_as_strings_become_strings(use):
    result = out(f"import torch\ndev = {CHOICE}\ndevice = {CHOICE}\nif dev == 'cuda': pass\n{use}\n")
    assert 'dev = "xla"' in result
    assert "device = torch_xla.device()" in result  # `device` itself is never read as a string


def test_an_argparse_default_is_a_string_like_what_the_command_line_gives():
    result = out(f"""
    import argparse
    import torch
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default={CHOICE})
    device = torch.device(parser.parse_args().device)
    """)
    assert 'parser.add_argument("--device", default="xla")' in result


def test_a_function_returning_the_choice_and_a_config_entry_follow_their_readers():
    result = out(f"""
    import torch
    def pick_device():
        return {CHOICE}
    cfg = {{"device": {CHOICE}}}
    device = pick_device()
    if device == "cuda" and cfg["device"] == "cuda":
        pass
    """)
    assert 'return "xla"' in result
    assert 'cfg = {"device": "xla"}' in result
    assert 'if device == "xla" and cfg["device"] == "xla":' in result


def test_a_string_kept_choice_is_a_fixed_point():
    once = out(f'import torch\ndevice = {CHOICE}\nif device == "cuda":\n    pass\n')
    assert 'device = "xla"' in once
    assert out(once) == once


def test_a_startswith_check_on_a_device_string_tests_for_the_target():
    result = out('import torch\ndevice = "cuda"\nkind = "cuda" if device.startswith("cuda") else "cpu"\n'
                 'name = "x".startswith("cuda")\n')
    assert 'kind = "xla" if device.startswith("xla") else "cpu"' in result
    assert 'name = "x".startswith("cuda")' in result  # not a device
