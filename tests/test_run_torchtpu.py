"""`tpukit run` on the torchtpu target. These machines have no TPU and no torch_tpu: the real
path is checked up to the clear refusal, and the run itself with a stand-in torch_tpu (a fake
module recording the eager mode) and a stand-in chip list."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import types

import pytest
from conftest import tpukit_executable

from tpukit.run import torchtpu
from tpukit.run.command import RunRequest


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([tpukit_executable(), "run", *args], capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1"}, timeout=120, cwd=cwd)


def test_a_torch_tpu_script_without_a_tpu_is_refused_in_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nimport torch_tpu\nprint('ran')\n")
    proc = run_cli(str(script))
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"tpukit: error: {script}: the torchtpu target needs a TPU:")
    assert "no TPU chip" in line and "--target xla" in line
    assert proc.stdout == ""


def test_the_target_comes_from_the_flag_the_script_or_the_config(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("import torch\n")
    tpu = tmp_path / "tpu.py"
    tpu.write_text("import os\nfrom torch_tpu import something\n")
    assert torchtpu.resolve_target(None, str(plain)) == "xla"
    assert torchtpu.resolve_target(None, str(tpu)) == "torchtpu"
    assert torchtpu.resolve_target("xla", str(tpu)) == "xla"
    (tmp_path / "pyproject.toml").write_text('[tool.tpukit]\ntarget = "torchtpu"\n'
                                             'eager-mode = "strict"\n')
    assert torchtpu.resolve_target(None, str(plain)) == "torchtpu"
    assert torchtpu.resolve_eager_mode(None, str(plain)) == "strict"
    assert torchtpu.resolve_eager_mode("debug", str(plain)) == "debug"


def test_a_module_run_reads_the_config_of_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.tpukit]\ntarget = "torchtpu"\n')
    monkeypatch.chdir(tmp_path)
    assert torchtpu.resolve_target(None, None) == "torchtpu"


@pytest.mark.parametrize("args, message", [
    (["--eager-mode", "fast"], "unknown eager mode 'fast': choose debug, strict, fused"),
    (["--target", "gpu"], "unknown target 'gpu'"),
    (["--target", "xla", "--eager-mode", "strict"], "--eager-mode goes with the torchtpu target"),
    (["--target", "torchtpu", "--profile"], "go with the xla target"),
])
def test_torchtpu_usage_errors(args, message, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    proc = run_cli(*args, str(script))
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == ""


def test_unavailable_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(torchtpu.importlib.util, "find_spec", lambda name: None)
    reason = torchtpu.unavailable(chips=[])
    assert "torch_tpu is not installed" in reason and "no TPU chip" in reason
    monkeypatch.setattr(torchtpu.importlib.util, "find_spec", lambda name: object())
    assert torchtpu.unavailable(chips=["/dev/accel0"]) is None


@pytest.fixture
def fake_torch_tpu(monkeypatch):
    """torch_tpu and torch.tpu stand-ins: EagerMode members, the `eager_mode` property (its
    starting value is torch-tpu 0.2.0's, strict) and a set_eager_mode context manager that, as
    in the wheel, sets nothing unless entered."""
    torch = pytest.importorskip("torch")

    @contextlib.contextmanager
    def set_eager_mode(mode):
        before, tpu.eager_mode = tpu.eager_mode, mode
        yield
        tpu.eager_mode = before

    tpu = types.SimpleNamespace(
        EagerMode=types.SimpleNamespace(DEFER_NEVER_AND_LAUNCH_BLOCKING="debug-member",
                                        DEFER_NEVER="strict-member", DEFER_AND_FUSE="fused-member"),
        eager_mode="strict-member", set_eager_mode=set_eager_mode)
    monkeypatch.setattr(torch, "tpu", tpu, raising=False)
    monkeypatch.setitem(sys.modules, "torch_tpu", types.ModuleType("torch_tpu"))
    monkeypatch.setattr(torchtpu.importlib.util, "find_spec", lambda name: object())
    return tpu


@pytest.mark.parametrize("mode, member", [(None, "fused-member"), ("strict", "strict-member"),
                                          ("debug", "debug-member")])
def test_with_torch_tpu_and_a_tpu_the_script_runs_in_the_eager_mode(fake_torch_tpu, tmp_path,
                                                                      mode, member):
    script = tmp_path / "train.py"
    seen = tmp_path / "seen.txt"
    # the script records the eager mode it started in
    script.write_text("import sys, torch\n"
                      "open(sys.argv[1], 'w').write(repr(torch.tpu.eager_mode))\n")
    request = RunRequest(script=str(script), args=[str(seen)], target="torchtpu", eager_mode=mode)
    summary, outcome = torchtpu.run_torchtpu(request, chips=["/dev/accel0"])
    assert seen.read_text() == repr(member) and fake_torch_tpu.eager_mode == member
    assert outcome.kind == "ok" and summary["target"] == "torchtpu"
    assert summary["eager_mode"] == (mode or "fused") and summary["device"] == "tpu"
