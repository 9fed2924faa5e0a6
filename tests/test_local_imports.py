"""`tpukit migrate train.py` ports the local modules the script imports with it: a model.py,
a config module, a logging helper beside it run in the ported process too (issue 14, class 5).
Followed with `ast` from the script's folder, as `python train.py` would import them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpukit.migrate.local_imports import local_modules

TRAIN = '''\
import argparse

import torch
import torch.distributed as dist

import logutil
from model import Net
from utils.config import backend
from utils import schedule

device_type = 'cuda'
model = Net().cuda()
optimizer = model.configure_optimizers(device_type)
for step in range(3):
    x = torch.randn(8, 4).cuda()
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    logutil.log(step, loss)
print(f"final loss: {loss.item()}")
print(f"backend: {backend}, lr: {schedule.LR}")
'''
MODEL = '''\
import inspect

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.register_buffer("steps", torch.zeros(1).cuda())

    def forward(self, x):
        return self.fc(x)

    def configure_optimizers(self, device_type):
        # nanoGPT's model.py: fused AdamW where the caller says the device is CUDA
        fused_available = "fused" in inspect.signature(torch.optim.AdamW).parameters
        use_fused = fused_available and device_type == 'cuda'
        extra_args = dict(fused=True) if use_fused else dict()
        return torch.optim.AdamW(self.parameters(), lr=1e-2, **extra_args)
'''
LOGUTIL = '''\
import torch


def log(step, loss):
    torch.cuda.synchronize()
    print(f"step {step}: {loss.item():.4f}")
'''
CONFIG = "backend = 'nccl'  # read by init_process_group in the launcher\n"
SCHEDULE = "from .config import backend\n\nLR = 1e-2\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    files = {
        "train.py": TRAIN, "model.py": MODEL, "logutil.py": LOGUTIL,
        "utils/__init__.py": "", "utils/config.py": CONFIG, "utils/schedule.py": SCHEDULE,
        "unrelated.py": "import torch\nx = torch.zeros(1).cuda()\n",
        ".venv/lib/model2.py": "import torch\ny = torch.zeros(1).cuda()\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_modules_a_script_imports_are_found_without_running_it(tree):
    found = {p.as_posix() for p in local_modules(tree / "train.py")}
    assert found == {f"{tree}/{name}" for name in (
        "logutil.py", "model.py", "utils/__init__.py", "utils/config.py", "utils/schedule.py")}


def test_nothing_outside_the_scripts_folder_and_no_unparsable_module_is_followed(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "train.py").write_text(
        "import os, torch\nimport broken\nimport helper\nfrom missing import x\n")
    (tmp_path / "app" / "broken.py").write_text("def (:\n")
    (tmp_path / "helper.py").write_text("import torch\n")  # the parent folder: not sys.path[0]
    assert [p.name for p in local_modules(tmp_path / "app" / "train.py")] == ["broken.py"]


def test_migrating_a_script_ports_its_local_modules_and_says_so(tree, run_cli):
    proc = run_cli("migrate", "train.py", cwd=tree, check_rc=0)
    assert "With the local modules the named script imports: logutil.py, model.py" in proc.stdout
    for name in ("train.py", "model.py", "logutil.py", "utils/config.py"):
        text = (tree / name).read_text()
        assert ".cuda(" not in text and "torch.cuda" not in text and "'nccl'" not in text, (
            name, text)
    # The caller's device type is 'xla' now, so the model's CUDA-only fused AdamW stays off.
    assert "device_type = 'xla'" in (tree / "train.py").read_text()
    assert "device_type == 'cuda'" in (tree / "model.py").read_text()
    assert "xm.wait_device_ops()" in (tree / "logutil.py").read_text()
    assert "backend = 'xla'" in (tree / "utils" / "config.py").read_text()
    # What the script does not import is not touched.
    assert ".cuda()" in (tree / "unrelated.py").read_text()
    assert ".cuda()" in (tree / ".venv" / "lib" / "model2.py").read_text()


def test_no_follow_imports_migrates_only_the_files_named(tree, run_cli):
    proc = run_cli("migrate", "--no-follow-imports", "--format", "json", "train.py", cwd=tree,
                   check_rc=0)
    assert "local_modules" not in json.loads(proc.stdout)["summary"]
    assert ".cuda()" in (tree / "model.py").read_text()
    assert "torch.cuda.synchronize()" in (tree / "logutil.py").read_text()


def test_out_dir_gets_the_modules_the_ported_script_imports(tree, run_cli):
    proc = run_cli("migrate", "--format", "json", "-o", "ported", "train.py", cwd=tree,
                   check_rc=0)
    assert json.loads(proc.stdout)["summary"]["local_modules"] == [
        "logutil.py", "model.py", "utils/__init__.py", "utils/config.py", "utils/schedule.py"]
    assert sorted(p.relative_to(tree / "ported").as_posix()
                  for p in (tree / "ported").rglob("*.py")) == [
        "logutil.py", "model.py", "train.py", "utils/__init__.py", "utils/config.py",
        "utils/schedule.py"]


@pytest.mark.xla
def test_the_ported_tree_runs_on_xla_cpu(tree, run_cli):
    pytest.importorskip("torch_xla", reason="needs the xla extra: pip install -e '.[xla]'")
    run_cli("migrate", "-o", "ported", "train.py", cwd=tree, check_rc=0)
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, "train.py"], cwd=tree / "ported", env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "final loss: " in proc.stdout and "backend: xla" in proc.stdout


def test_a_folder_named_beside_a_script_holds_the_program_the_script_imports(tmp_path, run_cli):
    # minGPT: `tpukit migrate projects/chargpt/chargpt.py mingpt`; the script imports
    # `mingpt.trainer` (installed from the repository's root), whose CUDA-or-CPU choice was
    # left as library code's: the port trained on the CPU on a TPU host
    (tmp_path / "projects" / "chargpt").mkdir(parents=True)
    (tmp_path / "mingpt").mkdir()
    (tmp_path / "mingpt" / "__init__.py").write_text("")
    choice = "import torch\n\nDEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'\n" \
             "print(DEVICE == 'cuda')\n"
    (tmp_path / "mingpt" / "trainer.py").write_text(choice)
    (tmp_path / "mingpt" / "unused.py").write_text(choice)  # imported by nobody
    (tmp_path / "projects" / "chargpt" / "chargpt.py").write_text(
        "from mingpt.trainer import DEVICE\nprint(DEVICE)\n")
    for folder in ("mingpt", "."):  # the package, or the repository that holds it
        proc = run_cli("migrate", "--diff", "projects/chargpt/chargpt.py", folder, cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr  # --diff: there is something to change
        changed = [t.split("\n")[0] for t in proc.stdout.split("+++ b/")[1:]]
        assert changed == ["mingpt/trainer.py", "mingpt/unused.py"], proc.stdout  # all named
        assert "+DEVICE = 'xla'\n" in proc.stdout
    alone = run_cli("migrate", "--diff", "--no-follow-imports", "projects/chargpt/chargpt.py",
                    cwd=tmp_path)  # the script alone, as ruff would
    assert "+++" not in alone.stdout


def test_imports_only_type_checkers_read_are_not_followed(tmp_path):
    # diffusers lists its whole tree under `if TYPE_CHECKING or DIFFUSERS_SLOW_IMPORT:` and
    # imports lazily otherwise: naming a script that imports one model followed 1,085 modules
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nimport typing\n"
        "if TYPE_CHECKING or SLOW:\n    from .heavy import Big\nelse:\n    from .lazy import Lazy\n"
        "if typing.TYPE_CHECKING:\n    from .typed import T\n")
    for name in ("heavy", "lazy", "typed"):
        (package / f"{name}.py").write_text("x = 1\n")
    (tmp_path / "train.py").write_text("import pkg\n")
    found = [p.relative_to(tmp_path).as_posix() for p in local_modules(tmp_path / "train.py")]
    assert found == ["pkg/__init__.py", "pkg/lazy.py"]


DATA_PARALLEL_TREE = {
    "models/__init__.py": "",
    # the read: `.module` of a network found by name, which no dataflow follows
    "models/base_model.py": (
        "import torch\n\n\nclass BaseModel:\n"
        "    def save_networks(self, names, path):\n"
        "        for name in names:\n"
        "            net = getattr(self, 'net' + name)\n"
        "            if torch.cuda.is_available():\n"
        "                torch.save(net.module.cpu().state_dict(), path)\n"
        "                net.cuda()\n"
        "            else:\n"
        "                torch.save(net.cpu().state_dict(), path)\n"),
    # the wrap, in another module, kept on an attribute (not returned)
    "models/gan_model.py": (
        "import torch\nfrom models.base_model import BaseModel\n\n\n"
        "class GanModel(BaseModel):\n"
        "    def __init__(self, netG, gpu_ids):\n"
        "        netG.to(gpu_ids[0])\n"
        "        self.netG = torch.nn.DataParallel(netG, gpu_ids)\n"),
    "train.py": (
        "import sys\nimport torch\nfrom models.gan_model import GanModel\n\n"
        "model = GanModel(torch.nn.Linear(2, 2), [0])\n"
        "model.save_networks(['G'], sys.argv[1])\nprint('saved')\n"),
}


def test_a_data_parallel_wrap_stays_where_another_module_reads_module_unresolved(tmp_path,
                                                                                 run_cli):
    # An image-translation base model: the wrap in one module, `net.module.cpu()` under a
    # guard that the port makes true in another; with the wrapper removed the first save
    # failed with AttributeError
    for name, text in DATA_PARALLEL_TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    proc = run_cli("migrate", "--format", "json", "-o", "ported", "train.py", cwd=tmp_path,
                   check_rc=0)
    findings = json.loads(proc.stdout)["findings"]
    kept = [f for f in findings if f["code"] == "TPU403"]
    assert len(kept) == 1 and "`net.module` in models.base_model" in kept[0]["message"], kept
    ported = (tmp_path / "ported" / "models" / "gan_model.py").read_text()
    assert "self.netG = torch.nn.DataParallel(netG, gpu_ids)" in ported
    if importlib.util.find_spec("torch_xla") is None:
        return
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CUDA_VISIBLE_DEVICES": ""}
    ran = subprocess.run([sys.executable, "train.py", str(tmp_path / "g.pt")],
                         cwd=tmp_path / "ported", env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0 and "saved" in ran.stdout, ran.stderr[-3000:]


def test_on_torchtpu_the_wrapper_becomes_a_holder_that_keeps_module(tmp_path, run_cli):
    # TorchTPU removes DataParallel (with a TPU it would scatter over chips with CUDA's
    # copies); where `.module` is read of a model no dataflow follows, a holder keeps it
    for name, text in DATA_PARALLEL_TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    run_cli("migrate", "--target", "torchtpu", "-o", "ported", "train.py", cwd=tmp_path,
            check_rc=0)
    ported = (tmp_path / "ported" / "models" / "gan_model.py").read_text()
    assert "self.netG = _TpuModuleHolder(netG)\n" in ported and "torch.nn.DataParallel(" not in ported
    torch = pytest.importorskip("torch")
    from tpukit.migrate.helpers import SOURCES
    space = {"torch": torch}
    exec(SOURCES["_TpuModuleHolder"], space)
    net = torch.nn.Linear(2, 3)
    held, wrapped = space["_TpuModuleHolder"](net), torch.nn.DataParallel(net)
    assert held.module is net and isinstance(held, torch.nn.DataParallel)  # pix2pix's load asks
    assert list(held.state_dict()) == list(wrapped.state_dict())  # "module.weight", ...
    x = torch.ones(1, 2)
    assert torch.equal(held(x), net(x))
