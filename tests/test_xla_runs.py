"""Migrated fixtures run unmodified on XLA:CPU (PJRT_DEVICE=CPU) and compile XLA graphs.

Fixtures whose port needs a person (CUDA-only libraries, CUDA events) say why in their
fixture.toml; the others must run as tpukit wrote them.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tomllib

import pytest

from conftest import FIXTURES, xla_cpu_env

pytest.importorskip("torch_xla", reason="needs the xla extra: pip install -e '.[xla]'")

RUNNER = """
import runpy, sys
path, args = sys.argv[1], sys.argv[2:]
sys.argv = [path, *args]
runpy.run_path(path, run_name="__main__")
import torch_xla.debug.metrics as met
compiles = met.metric_data("CompileTime")
print("XLA_COMPILES", compiles[0] if compiles else 0)
"""


def fixture_config(name: str) -> dict:
    return tomllib.loads((FIXTURES / name / "fixture.toml").read_text())


NAMES = sorted(p.parent.name for p in FIXTURES.glob("*/cuda.py"))
# Fixtures with a hand-written reference port are run (and compared) by test_ports.py.
# Distributed fixtures run through their launcher in test_distributed.py.
RUNNABLE = [
    n for n in NAMES
    if fixture_config(n)["runs_on_xla"] and not (FIXTURES / n / "reference_xla.py").exists()
    and not fixture_config(n).get("distributed")
]


def test_every_fixture_says_whether_it_runs_and_why_not():
    for name in NAMES:
        config = fixture_config(name)
        assert config["runs_on_xla"] or len(config.get("why", "")) > 20, name
    assert len(RUNNABLE) >= 4


@pytest.mark.xla
@pytest.mark.parametrize("name", RUNNABLE)
def test_migrated_fixture_runs_on_xla_cpu(name, tmp_path):
    config = fixture_config(name)
    env = xla_cpu_env()
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(FIXTURES / name / "xla.py"), *config.get("args", [])],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loss = re.search(r"^final loss: (\S+)$", proc.stdout, re.M)
    assert loss and math.isfinite(float(loss.group(1))), proc.stdout[-2000:]
    compiles = int(re.search(r"^XLA_COMPILES (\d+)$", proc.stdout, re.M).group(1))
    assert compiles > 0, "the script ran, but nothing ran on the XLA device"


def _sampler_run(path, tokens: int, cwd, *extra: str, xla: bool = True):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if xla:
        env = xla_cpu_env(OMP_NUM_THREADS="1")
        command = [sys.executable, "-c", RUNNER, str(path)]
    else:
        command = [sys.executable, str(path)]
    return subprocess.run([*command, "--steps", "1", "--tokens", str(tokens), *extra], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


def _drawn(proc) -> tuple[dict[str, str], int]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    drawn = dict(line.split(" ", 1) for line in proc.stdout.splitlines()
                 if line.split(" ", 1)[0] in ("greedy", "sampled", "tail"))
    compiles = re.search(r"^XLA_COMPILES (\d+)$", proc.stdout, re.M)
    return drawn, int(compiles.group(1)) if compiles else 0


@pytest.mark.xla
def test_a_ported_sampler_draws_the_same_tokens_in_graphs_that_do_not_grow_with_them(tmp_path):
    """fixtures/gpt_sampler: minGPT's sampler (and the crop without its length test) ported
    by TPU503 against the same script ported without it (a barrier per token only): the same
    tokens, greedy and drawn with the same seed; the port's compiles do not grow with the
    number of tokens, the unported loop's grow by one per token. The crop without its test
    (`idx[:, -B:]` of a shorter sequence) fails on XLA unported; ported, it draws what the
    original draws on the CPU."""
    from tpukit.migrate.engine import MigrateOptions, migrate_source
    from tpukit.rules import select_rules

    source = (FIXTURES / "gpt_sampler" / "cuda.py").read_text()
    ported = migrate_source(source, "cuda.py", MigrateOptions(
        rules=select_rules([], []), target="xla")).new_source
    unported = migrate_source(source, "cuda.py", MigrateOptions(
        rules=select_rules([], ["TPU503"]), target="xla")).new_source
    assert ported == (FIXTURES / "gpt_sampler" / "xla.py").read_text()
    assert "_tpukit_window" in ported and "_tpukit_window" not in unported
    paths = {}
    for name, code in (("ported", ported), ("unported", unported), ("original", source)):
        paths[name] = tmp_path / f"{name}.py"
        paths[name].write_text(code)
    runs = {(name, tokens): _drawn(_sampler_run(paths[name], tokens, tmp_path, "--no-tail"))
            for name in ("ported", "unported") for tokens in (5, 15)}
    for tokens in (5, 15):
        assert runs["ported", tokens][0] == runs["unported", tokens][0]
    assert runs["ported", 15][1] == runs["ported", 5][1]
    assert runs["unported", 15][1] >= runs["unported", 5][1] + 2 * 10  # two samplers
    tail = _drawn(_sampler_run(paths["ported"], 15, tmp_path))[0]
    on_cpu = _drawn(_sampler_run(paths["original"], 15, tmp_path, xla=False))[0]
    assert tail["tail"] == on_cpu["tail"] and tail["greedy"] == on_cpu["greedy"]
    failed = _sampler_run(paths["unported"], 15, tmp_path)
    assert failed.returncode != 0 and "Value out of range" in failed.stderr


def _compiles(path, cwd, *args: str) -> tuple[int, str]:
    env = xla_cpu_env(OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(path), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loss = re.search(r"^final loss: (\S+)$", proc.stdout, re.M)
    assert loss and math.isfinite(float(loss.group(1))), proc.stdout[-2000:]
    return int(re.search(r"^XLA_COMPILES (\d+)$", proc.stdout, re.M).group(1)), loss.group(1)


@pytest.mark.xla
def test_a_rollout_that_fills_storage_gets_a_barrier_that_keeps_its_graphs_few(tmp_path):
    """fixtures/rl_rollout (cleanrl's PPO shape): the rollout writes each step's results into
    tensors made before it and reads the host once a step. Ported (TPU303 cuts the graph once
    a rollout step) it compiles fewer graphs than the same port without that one barrier, and
    its compiles do not grow with the number of iterations."""
    ported = (FIXTURES / "rl_rollout" / "xla.py").read_text()
    barrier = "        torch_xla.sync()\n"  # the rollout's, inside the inner loop
    assert ported.count(barrier) == 1
    paths = {"ported": tmp_path / "ported.py", "without": tmp_path / "without.py"}
    paths["ported"].write_text(ported)
    paths["without"].write_text(ported.replace(barrier, ""))
    steps = ("--num-steps", "10")
    ported_2, _ = _compiles(paths["ported"], tmp_path, "--iterations", "2", *steps)
    ported_4, _ = _compiles(paths["ported"], tmp_path, "--iterations", "4", *steps)
    without_2, _ = _compiles(paths["without"], tmp_path, "--iterations", "2", *steps)
    assert ported_4 == ported_2
    assert ported_2 < without_2


@pytest.mark.xla
def test_rollout_writes_at_index_tensors_compile_the_same_graphs_for_every_position(tmp_path):
    """fixtures/rl_rollout ported with TPU510 (`_xla_put(obs, step, ...)`) against the same port
    without it (`obs[step] = ...`): the same final loss; the port's compiles do not grow with
    the rollout's length, the other's grow by one graph per buffer position."""
    from tpukit.migrate.engine import MigrateOptions, migrate_source
    from tpukit.rules import select_rules

    source = (FIXTURES / "rl_rollout" / "cuda.py").read_text()
    ported = migrate_source(source, "cuda.py", MigrateOptions(
        rules=select_rules([], []), target="xla")).new_source
    unported = migrate_source(source, "cuda.py", MigrateOptions(
        rules=select_rules([], ["TPU510"]), target="xla")).new_source
    assert "_xla_put(obs, step, next_obs)" in ported and "_xla_put" not in unported
    paths = {"ported": tmp_path / "ported.py", "unported": tmp_path / "unported.py"}
    for name, code in (("ported", ported), ("unported", unported)):
        paths[name].write_text(code)
    runs = {(name, n): _compiles(paths[name], tmp_path, "--iterations", "2", "--num-steps", str(n))
            for name in paths for n in (4, 12)}
    for n in (4, 12):
        assert runs["ported", n][1] == runs["unported", n][1]  # the same training
    assert runs["ported", 12][0] == runs["ported", 4][0]
    assert runs["unported", 12][0] >= runs["unported", 4][0] + 8


@pytest.mark.xla
def test_a_queue_pointer_kept_on_the_device_compiles_the_same_graphs_for_every_position(tmp_path):
    """fixtures/contrastive_queue (MoCo's queue) ported with TPU511 (`_xla_pointer`,
    `_xla_put_slice`) against the same port without it (`int(self.queue_ptr)` read back, the
    slice written at it): the same queue and loss; the port's compiles do not grow with the
    steps (positions), the other's grow by a graph per new position until the pointer wraps."""
    from tpukit.migrate.engine import MigrateOptions, migrate_source
    from tpukit.rules import select_rules

    source = (FIXTURES / "contrastive_queue" / "cuda.py").read_text()
    ported = migrate_source(source, "cuda.py", MigrateOptions(
        rules=select_rules([], []), target="xla")).new_source
    unported = migrate_source(source, "cuda.py", MigrateOptions(
        rules=select_rules([], ["TPU511"]), target="xla")).new_source
    assert "_xla_pointer(self.queue_ptr)" in ported and "_xla_pointer" not in unported
    paths = {"ported": tmp_path / "ported.py", "unported": tmp_path / "unported.py"}
    for name, code in (("ported", ported), ("unported", unported)):
        paths[name].write_text(code)
    runs = {}
    for name in paths:
        for steps in (3, 7):
            env = xla_cpu_env(OMP_NUM_THREADS="1")
            proc = subprocess.run([sys.executable, "-c", RUNNER, str(paths[name]), "--steps",
                                   str(steps)], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
            runs[name, steps] = (
                int(re.search(r"^XLA_COMPILES (\d+)$", proc.stdout, re.M).group(1)),
                re.search(r"^queue sum: (\S+)$", proc.stdout, re.M).group(1),
                re.search(r"^final loss: (\S+)$", proc.stdout, re.M).group(1))
    for steps in (3, 7):
        assert runs["ported", steps][1:] == runs["unported", steps][1:]  # the same training
    assert runs["ported", 7][0] == runs["ported", 3][0]
    assert runs["unported", 7][0] >= runs["unported", 3][0] + 4  # 8 positions of a 32-slot queue


# The scripts of the read tests: a linear model over `--batches` batches of 16.
SCRIPT_HEAD = '''
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batches", type=int, default=4)
args = parser.parse_args()
'''
TRAINING_DATA = '''torch.manual_seed(0)
device = torch.device("cuda")
model = nn.Linear(8, 3).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
samples = args.batches * 16
data = TensorDataset(torch.randn(samples, 8), torch.randint(0, 3, (samples,)))
loader = DataLoader(data, batch_size=16)
'''

EVALUATE = SCRIPT_HEAD + TRAINING_DATA + '''

def evaluate():
    total = 0
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            out = model(x)
            total += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
    print(f"loss sum: {total:.4f} correct: {correct}")


evaluate()
'''
METERS = SCRIPT_HEAD + '''

class Meter(object):
    def __init__(self, name, fmt=":f"):
        self.name = name
        self.fmt = fmt
        self.val = 0
        self.sum = 0
        self.count = 0
        self.avg = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        fmtstr = "{name} {val" + self.fmt + "} ({avg" + self.fmt + "})"
        return fmtstr.format(**self.__dict__)


class Progress(object):
    def __init__(self, meters):
        self.meters = meters

    def display(self, batch):
        print(" | ".join([f"[{batch}]"] + [str(meter) for meter in self.meters]))


''' + TRAINING_DATA + '''

def train(print_freq):
    losses = Meter("Loss", ":.3f")
    progress = Progress([losses])
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        losses.update(loss.item(), x.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % print_freq == 0:
            progress.display(i)
    print(f"mean loss: {losses.avg:.3f}")


train(100)
'''
LOSSES = SCRIPT_HEAD + TRAINING_DATA + '''

def train():
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss = F.cross_entropy(out, y)
        hits = (out.argmax(1) == y).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print("[batch %d] loss %.6f hits %d" % (i, loss.item(), hits.item()))


train()
'''
TRANSFERS = RUNNER.replace('"CompileTime"', '"TransferFromDeviceTime"').replace(
    "XLA_COMPILES", "XLA_TRANSFERS")


def _reads_with_and_without(tmp_path, source: str, code: str, applied: str,
                            printed: tuple[str, ...]) -> dict:
    """`source` ported with every rule and with all but `code` (`applied` is in the first port
    only), each run for 2 and 6 batches: {(name, batches): (device-to-host transfers, the
    printed lines that start with one of `printed`)}."""
    from tpukit.migrate.engine import MigrateOptions, migrate_source
    from tpukit.rules import select_rules

    runs = {}
    for name, off in (("ported", []), ("unported", [code])):
        ported = migrate_source(source, "cuda.py", MigrateOptions(
            rules=select_rules([], off), target="xla")).new_source
        assert (applied in ported) == (name == "ported")
        path = tmp_path / f"{name}.py"
        path.write_text(ported)
        for batches in (2, 6):
            proc = subprocess.run([sys.executable, "-c", TRANSFERS, str(path), "--batches",
                                   str(batches)], cwd=tmp_path, env=xla_cpu_env(
                                       OMP_NUM_THREADS="1"), capture_output=True, text=True,
                                  timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
            lines = [line for line in proc.stdout.splitlines() if line.startswith(printed)]
            assert lines, proc.stdout
            runs[name, batches] = (
                int(re.search(r"^XLA_TRANSFERS (\d+)$", proc.stdout, re.M).group(1)), lines)
    return runs


@pytest.mark.xla
def test_sums_kept_on_the_device_print_the_same_with_reads_that_do_not_grow(tmp_path):
    """pytorch/examples' evaluation loop (`total += loss.item()`, `correct += ....item()`)
    ported with TPU512 (`_xla_deferred`, `_xla_value`) against the same port without it: the
    same printed sums; the port reads the device back the same number of times whatever the
    number of batches, the other twice a batch."""
    runs = _reads_with_and_without(tmp_path, EVALUATE, "TPU512", "_xla_deferred(",
                                   ("loss sum:",))
    for batches in (2, 6):
        assert runs["ported", batches][1] == runs["unported", batches][1]  # the same sums
    assert runs["ported", 6][0] == runs["ported", 2][0]
    assert runs["unported", 6][0] == runs["unported", 2][0] + 8  # two reads a batch


@pytest.mark.xla
def test_meters_given_device_tensors_print_the_same_with_reads_that_do_not_grow(tmp_path):
    """pytorch/examples' ImageNet meters (`losses.update(loss.item(), n)`, a `ProgressMeter`
    that prints every `print_freq` steps) ported with TPU513 against the same port without it:
    the same printed lines; the port reads the device back the same number of times whatever
    the number of batches (the meters are printed at the first batch and after the loop), the
    other once a batch."""
    runs = _reads_with_and_without(tmp_path, METERS, "TPU513", "_xla_deferred(loss)",
                                   ("[", "mean loss:"))
    for batches in (2, 6):
        assert len(runs["ported", batches][1]) == 2
        assert runs["ported", batches][1] == runs["unported", batches][1]  # the same lines
    assert runs["ported", 6][0] == runs["ported", 2][0]
    assert runs["unported", 6][0] == runs["unported", 2][0] + 4  # a read a batch


@pytest.mark.xla
def test_reads_of_one_statement_in_one_transfer_print_the_same(tmp_path):
    """PyTorch-GAN's log line (two `.item()` in one print a batch) ported with TPU514
    (`_xla_items`) against the same port without it: the same printed lines; one device read a
    batch where there were two."""
    runs = _reads_with_and_without(tmp_path, LOSSES, "TPU514", "_xla_items(loss, hits)",
                                   ("[batch",))
    for batches in (2, 6):
        assert len(runs["ported", batches][1]) == batches
        assert runs["ported", batches][1] == runs["unported", batches][1]  # the same lines
    assert runs["ported", 6][0] == runs["ported", 2][0] + 4  # one read a batch
    assert runs["unported", 6][0] == runs["unported", 2][0] + 8  # two reads a batch
