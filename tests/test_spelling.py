"""Spelling changes nothing (metamorphic tests, tests/metamorphic.py): every fixture and every
rule example migrates the same after its own names are consistently renamed (to neutral names,
and to names that sound like CUDA, GPUs, devices and loaders), and after comments and
docstrings that speak of CUDA are added, up to that renaming."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metamorphic as mm
from conftest import FIXTURES
from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import TARGETS, load_rules, select_rules

OPTIONS = {t: MigrateOptions(rules=select_rules([], []), target=t) for t in TARGETS}
FIXTURE_CASES = sorted(p.parent.name for p in FIXTURES.glob("*/cuda.py"))
EXAMPLES = [pytest.param(example.before.lstrip("\n"), target, id=f"{code}-{i + 1}-{target}")
            for code, rule in load_rules().items() for i, example in enumerate(rule.examples)
            for target in example.expected]


def _codes(migration) -> list[tuple[str, bool]]:
    return sorted((f.code, f.applied) for f in migration.findings)


def assert_spelling_changes_nothing(source: str, target: str, style: str) -> None:
    base = migrate_source(source, "program.py", OPTIONS[target])
    if style == "comments":
        variant = migrate_source(mm.commented(source), "program.py", OPTIONS[target])
        assert mm.strip(variant.new_source) == base.new_source
        # (a message that quotes the code quotes its comments too)
        assert [(f.code, f.applied, mm.strip_text(f.message)) for f in variant.findings] == [
            (f.code, f.applied, f.message) for f in base.findings]
        return
    renamed, mapping = mm.renamed(source, style)
    assert mapping, "nothing to rename: the test would prove nothing"
    variant = migrate_source(renamed, "program.py", OPTIONS[target])
    expected = mm.apply_renaming(base.new_source, mapping)
    assert mm.comparable(variant.new_source) == mm.comparable(expected)
    assert _codes(variant) == _codes(base)


@pytest.mark.parametrize("style", ["neutral", "cuda", "comments"])
@pytest.mark.parametrize("name", FIXTURE_CASES)
def test_a_fixture_migrates_the_same_whatever_its_names_and_comments(name, style):
    assert_spelling_changes_nothing((FIXTURES / name / "cuda.py").read_text(), "xla", style)


@pytest.mark.parametrize("style", ["neutral", "cuda", "comments"])
@pytest.mark.parametrize("source,target", EXAMPLES)
def test_a_rule_example_migrates_the_same_whatever_its_names_and_comments(source, target, style):
    if style != "comments" and not mm.rename_map(source, style):
        pytest.skip("the example binds no name of its own")
    assert_spelling_changes_nothing(source, target, style)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([p.values[0] for p in EXAMPLES]), st.randoms(use_true_random=False))
def test_any_consistent_renaming_changes_nothing(source, rng):
    """Names drawn at random from device-, GPU- and loader-sounding words, each name its own."""
    mapping = mm.rename_map(source, "cuda")
    words = list(mm.CUDA_WORDS)
    drawn = {old: f"{rng.choice(words)}_{i}" for i, old in enumerate(mapping)}
    base = migrate_source(source, "program.py", OPTIONS["xla"])
    variant = migrate_source(mm.apply_renaming(source, drawn), "program.py", OPTIONS["xla"])
    assert mm.comparable(variant.new_source) == mm.comparable(
        mm.apply_renaming(base.new_source, drawn))
    assert _codes(variant) == _codes(base)


def test_the_renaming_renames_what_the_program_binds_and_nothing_else():
    source = ("import torch as th\nfrom torch.utils.data import DataLoader\n\n"
              "class Net(th.nn.Module):\n    def __init__(self):\n        self.width = 4\n\n"
              "    def forward(self, x):\n        return x * self.width\n\n"
              "def train(model, loader):\n    for batch in loader:\n        model(batch)\n\n"
              "train(Net(), DataLoader([1], batch_size=1))\n")
    renamed, mapping = mm.renamed(source, "neutral")
    assert {"th", "Net", "train", "model", "loader", "batch", "x", ".width"} <= set(mapping)
    assert "forward" not in mapping and "DataLoader" not in mapping  # a method, an import
    assert "def forward(self, " in renamed and "batch_size=1" in renamed
    compile(renamed, "renamed.py", "exec")
    commented = mm.commented(source)
    assert commented.count(mm.MARK) > 5 and mm.strip(commented) == source


# The decisions that read spelling before (issue 31's list), each on a program that exercises
# it: a flag that says fp16 over a GradScaler, a scaler named in a docstring, a dict of
# optimizer arguments, a tie written with another first parameter, a typed-tensor alias, a
# launcher, an imported name that says cuda.
DECISIONS = {
    "scaler_under_a_flag": """
import torch
def train(fp16, model, opt, loss_fn, data):
    if fp16:
        scaler = torch.cuda.amp.GradScaler()
    for x in data:
        with torch.cuda.amp.autocast():
            loss = loss_fn(model(x.cuda()))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
""",
    "scaler_named_in_a_docstring": '''
import torch
def train(model, opt, data):
    """Steps with scaler and prints scaler each time."""
    scaler = torch.cuda.amp.GradScaler()
    for x in data:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x.cuda()).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
''',
    "optimizer_arguments": """
import torch
def make(params, lr, fused):
    x = torch.zeros(1).cuda()
    optimizer_kwargs = {"lr": lr}
    if fused:
        optimizer_kwargs.update({"fused": True})
    settings = {}
    settings["fused"] = True
    return torch.optim.AdamW(params, **optimizer_kwargs), settings
""",
    "tied_weights": """
import torch
class Net(torch.nn.Module):
    def __init__(this, n):
        super().__init__()
        this.emb = torch.nn.Embedding(n, 8)
        this.head = torch.nn.Linear(8, n)
        this.head.weight = this.emb.weight
model = Net(10)
model = model.cuda()
""",
    "typed_alias": """
import torch
from torch.cuda import FloatTensor
Tensor = FloatTensor
def noise(n):
    return Tensor(n).normal_()
""",
    "launcher": """
import torch
import torch.multiprocessing as mp
import torch.distributed as dist
def worker(index, n):
    dist.init_process_group("nccl", rank=index, world_size=n)
    sampler = torch.utils.data.DistributedSampler(ds, n, index)
    x = torch.zeros(1).cuda(index)
def spawn(n):
    mp.spawn(worker, args=(n,), nprocs=n)
if __name__ == "__main__":
    spawn(torch.cuda.device_count())
""",
    "imported_name": """
import torch
from helpers import cuda_kernels
use = torch.cuda.is_available()
x = torch.zeros(1).cuda()
if use:
    y = cuda_kernels(x)
""",
}


@pytest.mark.parametrize("style", ["neutral", "cuda", "comments"])
@pytest.mark.parametrize("name", sorted(DECISIONS))
def test_a_decision_that_read_spelling_reads_meaning(name, style):
    assert_spelling_changes_nothing(DECISIONS[name].lstrip("\n"), "xla", style)


def test_the_decisions_change_the_code():
    """Each program above is rewritten (the test would prove nothing if none were)."""
    for name, source in DECISIONS.items():
        migrated = migrate_source(source.lstrip("\n"), "program.py", OPTIONS["xla"])
        assert migrated.new_source != source.lstrip("\n"), name


def test_the_renaming_leaves_what_self_inherits():
    """`self.apply(...)` and `self.register_buffer(...)` are nn.Module's: renaming them makes
    another program (minGPT's model.py renamed so read as a CUDA file)."""
    source = ("import torch\nclass Net(torch.nn.Module):\n    def __init__(self):\n"
              "        super().__init__()\n        self.width = 4\n"
              "        self.register_buffer('b', torch.zeros(1))\n        self.apply(print)\n")
    mapping = mm.rename_map(source, "cuda")
    assert ".width" in mapping
    assert ".apply" not in mapping and ".register_buffer" not in mapping
