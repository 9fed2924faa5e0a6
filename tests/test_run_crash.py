"""A run that dies of an op with no XLA kernel (a sparse tensor) is said at the user's line
that called it, with the op and the backend (TPU507), not only as a traceback."""

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
