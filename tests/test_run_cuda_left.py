"""`tpukit run`'s count of CUDA idioms left in a script (TPU704) holds what fails on a TPU host
as written, not what runs there (a seed, a cuDNN flag: `runs_as_written` in their rule files)."""

from __future__ import annotations

from pathlib import Path

from tpukit.rules import load_rules
from tpukit.run.cuda_check import cuda_idioms


def _idioms(tmp_path: Path, source: str) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text(source)
    return sorted(f.code for f in cuda_idioms(script))


def test_a_migrated_script_seeding_torch_has_no_cuda_idiom_left(tmp_path):
    # a contrastive trainer already migrated: its torch.manual_seed fails nowhere
    assert _idioms(tmp_path, "import torch\nimport torch_xla\ntorch.manual_seed(0)\n"
                   "torch.backends.cudnn.benchmark = True\ntorch.cuda.manual_seed_all(0)\n") == []


def test_a_cuda_device_left_is_still_counted(tmp_path):
    assert "TPU102" in _idioms(tmp_path, "import torch\ntorch.manual_seed(0)\n"
                               "x = torch.ones(2).cuda()\n")


def test_only_rules_measured_to_run_as_written_say_so():
    marked = sorted(code for code, rule in load_rules().items()
                    if rule.extra.get("runs_as_written"))
    assert marked == ["TPU113", "TPU118", "TPU120"]


OOM_RETRY = """\
import torch
try:
    train(model)
except torch.cuda.OutOfMemoryError:
    model.use_checkpointing()
"""


def test_an_out_of_memory_handler_fails_nowhere_before_or_after_the_port(tmp_path):
    # milesial's U-Net: `except torch.cuda.OutOfMemoryError` is torch's own class (it needs no
    # CUDA); its port `torch.OutOfMemoryError` keeps a warning (XLA raises RuntimeError when
    # memory runs out), and neither is a CUDA idiom that fails on a TPU
    assert _idioms(tmp_path, OOM_RETRY) == []
    assert _idioms(tmp_path, OOM_RETRY.replace("torch.cuda.", "torch.")) == []
    assert _idioms(tmp_path, OOM_RETRY + "torch.cuda.synchronize()\n") == ["TPU112"]
