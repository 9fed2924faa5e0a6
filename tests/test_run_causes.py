"""`tpukit run` on XLA:CPU, one cause per fixture (issue 15's list, beyond tests/test_run.py):
a CPU fallback inside a model module, and DDP's gradient accumulation that skips the all-reduce
on micro-steps (two graphs from one line, each compiled once, named with the line that switches
the sync)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import FIXTURES, tpukit_executable

pytest.importorskip("torch_xla")

RUN = FIXTURES / "run"


def line_of(path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _run(tmp_path, script: str, *options) -> dict:
    out = tmp_path / "report.json"
    proc = subprocess.run([tpukit_executable(), "run", "--json", str(out), *options, str(RUN / script)],
                          env={**os.environ, "NO_COLOR": "1", "PJRT_DEVICE": "CPU"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_a_fallback_inside_a_module_is_named_at_the_forward_line_that_called_it(tmp_path):
    report = _run(tmp_path, "embedding_bag.py")
    script = RUN / "embedding_bag.py"
    (bag,) = [f for f in report["findings"] if f["code"] == "TPU702"
              and f["extra"]["op"] == "aten::_embedding_bag"]
    # the user's forward, where the module's op ran: not 1:1, not torch's own files
    assert (bag["path"], bag["line"]) == (str(script), line_of(script, "self.bag(ids, offsets)"))
    assert bag["extra"]["per_step"] == 1.0 and "nn.Embedding" in bag["message"]
    # and the training loop's line that called the model
    call = line_of(script, "model(tokens, offsets)")
    assert bag["extra"]["called_from"] == {"path": str(script), "line": call, "function": "Bag.forward"}
    assert f"(in `Bag.forward`, called from embedding_bag.py:{call})" in bag["message"]
    (backward,) = [f for f in report["findings"] if f["code"] == "TPU702"
                   and f["extra"]["op"] == "aten::_embedding_bag_backward"]
    assert backward["line"] == line_of(script, "loss.backward()")


def test_ddp_gradient_accumulation_counts_optimizer_steps_and_compiles_each_graph_once(tmp_path):
    report = _run(tmp_path, "ddp_no_sync.py")
    summary = report["summary"]
    records = [r for r in summary["step_records"] if r["complete"]]
    assert summary["steps"] == 6 and len(records) == 6
    assert [r["micro_steps"] for r in records] == [2] * 6
    assert [r["optimizer_steps"] for r in records] == [1] * 6
    # the micro-step without the all-reduce and the one with it: two graphs from one line, each
    # compiled once; after DDP's own warm-up (its reducer rebuilds buckets) nothing recompiles
    assert all(r["compiles"] == 0 for r in records[3:])
    recompiles = [f for f in report["findings"] if f["code"] == "TPU701"]
    assert not [f for f in recompiles if "warmup_steps" not in f["extra"]
                and f["extra"].get("kind") != "variants"]
    # the two graphs of the micro-steps' line are said once, as info, with the line that
    # switches DDP's all-reduce: the cause, at the user's code
    script = RUN / "ddp_no_sync.py"
    (variants,) = [f for f in recompiles if f["extra"].get("kind") == "variants"]
    assert variants["severity"] == "info" and len(variants["extra"]["graphs"]) == 2
    assert variants["line"] == line_of(script, "loss.backward()") + 1  # the micro-step's sync
    toggle = line_of(script, "model.require_backward_grad_sync = micro")
    assert variants["extra"]["sync_toggle"] == {"path": str(script), "line": toggle}
    assert f"switched at line {toggle} (`model.require_backward_grad_sync = micro" \
        in variants["message"]


SUPPRESSED = """\
import torch
import torch_xla

device = torch_xla.device()
model = torch.nn.Linear(4, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.ones(2, 4, device=device)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()
    print(loss.item())  # tpukit: ignore[TPU703]
    print(loss.item() * 2)
"""


def test_a_suppression_comment_silences_a_run_finding_and_its_fail_on(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SUPPRESSED)
    out = tmp_path / "report.json"
    base = [tpukit_executable(), "run", "--json", str(out), "--fail-on", "sync"]
    env = {**os.environ, "NO_COLOR": "1", "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([*base, str(script)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    report = json.loads(out.read_text())
    reads = [f["line"] for f in report["findings"] if f["code"] == "TPU703"]
    assert reads == [14] and proc.returncode == 1   # the other line still fails --fail-on sync
    (silenced,) = report["summary"]["suppressed"]
    assert silenced["code"] == "TPU703" and silenced["line"] == 13
    assert silenced["suppressed_by"] == "line 13: # tpukit: ignore[TPU703]"
    script.write_text(SUPPRESSED.replace("    print(loss.item() * 2)\n", ""))
    proc = subprocess.run([*base, str(script)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr   # nothing left to fail on
    assert not [f for f in json.loads(out.read_text())["findings"] if f["code"] == "TPU703"]


EVAL = """\
import torch
import torch_xla

device = torch_xla.device()
model = torch.nn.Linear(4, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for step in range(2):
        loss = model(torch.ones(2, 4, device=device)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch_xla.sync()
    with torch.no_grad():
        for batch in range(2):
            model(torch.ones(3, 4, device=device)).sum()
            torch_xla.sync()
print("done")
"""


def test_eval_batches_are_not_training_steps_and_max_steps_counts_training_steps(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(EVAL)
    report = _run(tmp_path, str(script))
    summary = report["summary"]
    assert summary["steps"] == 6 and summary["eval_batches"] == 6
    kinds = [r["kind"] for r in summary["step_records"] if r["complete"]]
    assert kinds == ["train", "train", "eval", "eval"] * 3
    report = _run(tmp_path, str(script), "--max-steps", "3")
    summary = report["summary"]
    assert summary["steps"] == 3 and summary["stopped_early"]
    assert summary["eval_batches"] == 2   # epoch 0's evaluation ran before the third step
