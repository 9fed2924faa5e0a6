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
