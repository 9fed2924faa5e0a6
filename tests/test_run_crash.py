"""How a run that cannot go on ends: an op with no XLA kernel (a sparse tensor) is said at the
user's line that called it, with the op and the backend (TPU507); a step that compiles a new
graph per iteration is stopped before XLA:CPU runs out of memory mappings, and said at the
line that compiled the most (TPU710)."""

from __future__ import annotations

import json

import pytest

SPARSE = """\
import torch
import torch_xla

def spmm(indices, values, b):
    a = torch.sparse_coo_tensor(indices, values, (2, 2))
    return torch.matmul(a, b)

d = torch_xla.device()
spmm(torch.tensor([[0, 1], [1, 0]], device=d), torch.ones(2, device=d), torch.ones(2, 2, device=d))
"""


@pytest.mark.xla
def test_a_sparse_tensor_on_xla_is_a_finding_at_its_line(tmp_path, run_cli):
    script = tmp_path / "train.py"
    script.write_text(SPARSE)
    proc = run_cli("run", "--format", "json", script, env={"PJRT_DEVICE": "CPU"})
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    (found,) = [f for f in report["findings"] if f["code"] == "TPU507"]
    assert (found["path"].endswith("train.py"), found["line"]) == (True, 5)
    assert found["extra"]["backend"] == "SparseXLA"
    assert "index_add_" in found["explanation"]["fix"]


@pytest.mark.xla
def test_an_error_of_the_script_itself_is_no_kernel_finding(tmp_path, run_cli):
    script = tmp_path / "train.py"
    script.write_text("raise NotImplementedError('not written yet')\n")
    proc = run_cli("run", "--format", "json", script, env={"PJRT_DEVICE": "CPU"})
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert not [f for f in report["findings"] if f["code"] == "TPU507"]


STORM = """\
import torch
import torch_xla

x = torch.ones(3, device=torch_xla.device())
t = torch.zeros((), device=torch_xla.device())
while t < 1000:
    t = t + x.sum()
"""


@pytest.mark.xla
def test_a_compile_storm_is_stopped_and_said_at_its_loop(tmp_path, run_cli):
    # each `t < 1000` reads a graph one op longer than the last: a new graph per iteration
    script = tmp_path / "solve.py"
    script.write_text(STORM)
    out = tmp_path / "run.json"
    proc = run_cli("run", "--json", out, "--storm-graphs", "12", script,
                   env={"PJRT_DEVICE": "CPU"})
    assert proc.returncode == 1, proc.stderr
    report = json.loads(out.read_text())
    assert (report["summary"]["outcome"], report["summary"]["exit_code"]) == ("compile-storm", 1)
    (storm,) = [f for f in report["findings"] if f["code"] == "TPU710"]
    assert storm["line"] == 6 and storm["extra"]["graphs"] == 12
    assert storm["extra"]["call"] == "host read" and storm["extra"]["at_line"] == 12
    assert "fixed trip count" in storm["explanation"]["fix"]


@pytest.mark.xla
def test_storm_graphs_0_lets_the_loop_go_on(tmp_path, run_cli):
    script = tmp_path / "solve.py"
    script.write_text(STORM.replace("1000", "20"))
    proc = run_cli("run", "--format", "json", "--storm-graphs", "0", script,
                   env={"PJRT_DEVICE": "CPU"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert report["summary"]["outcome"] == "ok"
    assert not [f for f in report["findings"] if f["code"] == "TPU710"]


FALLBACK_STORM = """\
import torch
import torch_xla

x = torch.ones(3, device=torch_xla.device())
t = torch.zeros(3, device=torch_xla.device())
for i in range(400):
    t = t + x
    counts = torch.histc(t * 1.0, 4)
"""


@pytest.mark.xla
def test_a_storm_of_fallbacks_no_barrier_sees_is_stopped_at_its_line(tmp_path, run_cli):
    # histc runs on the CPU: each call copies `t * 1.0`, one add longer each time, to the host,
    # compiling a new graph with no barrier or host read of the script's (minGPT's sampler)
    script = tmp_path / "sample.py"
    script.write_text(FALLBACK_STORM)
    out = tmp_path / "run.json"
    proc = run_cli("run", "--json", out, "--storm-graphs", "12", script,
                   env={"PJRT_DEVICE": "CPU"})
    assert proc.returncode == 1, proc.stderr
    report = json.loads(out.read_text())
    assert report["summary"]["outcome"] == "compile-storm"
    assert report["summary"]["compiles"] < 400
    (storm,) = [f for f in report["findings"] if f["code"] == "TPU710"]
    assert storm["line"] in (7, 8) and storm["extra"]["graphs"] >= 12
    assert storm["extra"]["call"] == "operation"
    assert "TPU702" in storm["explanation"]["fix"]


DIES = """\
import os
import signal
import torch
import torch_xla

x = torch.ones(2, device=torch_xla.device())
for step in range(3):
    x = x * 2
    torch_xla.sync()
os.kill(os.getpid(), signal.SIGSEGV)
"""


@pytest.mark.xla
def test_a_run_that_dies_of_a_signal_leaves_a_report_that_says_so(tmp_path, run_cli):
    script = tmp_path / "train.py"
    script.write_text(DIES)
    out = tmp_path / "run.json"
    proc = run_cli("run", "--json", out, script, env={"PJRT_DEVICE": "CPU"})
    assert proc.returncode == 139, proc.stderr  # as a shell says it: 128 + SIGSEGV
    assert "died of SIGSEGV" in proc.stderr
    summary = json.loads(out.read_text())["summary"]
    assert (summary["outcome"], summary["signal"], summary["exit_code"]) == ("died", "SIGSEGV", 139)
    assert summary["partial"] and summary["steps"] >= 1
    shown = run_cli("report", out)
    assert "died of SIGSEGV" in shown.stdout + shown.stderr
