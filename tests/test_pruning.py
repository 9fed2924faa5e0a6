"""Pruning (the file prefilter and the statements skipped for lack of a trigger word) only
saves time: with it on and off, every rule example and every fixture migrates to the same
source and the same findings. A rule whose file lacks a word its code needs fails here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import FIXTURES
from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import TARGETS, load_rules, select_rules

RULES = load_rules()
CODE_RULES = [r for r in RULES.values() if r.checks_code]


def _both_ways(source: str, options: MigrateOptions):
    pruned = migrate_source(source, "example.py", options)
    full = migrate_source(source, "example.py", replace(options, prune=False))
    as_text = [(f.location.line, f.location.col, f.code, f.message, f.applied)
               for f in full.findings]
    assert pruned.new_source == full.new_source
    assert [(f.location.line, f.location.col, f.code, f.message, f.applied)
            for f in pruned.findings] == as_text


@pytest.mark.parametrize("rule,target,example", [
    pytest.param(rule, target, example, id=f"{rule.code}-example{i + 1}-{target}")
    for rule in CODE_RULES for i, example in enumerate(rule.examples)
    for target in example.expected
])
def test_a_rule_alone_migrates_its_examples_the_same_without_pruning(rule, target, example):
    # The rule alone: another rule's trigger words must not hide a word missing from its file.
    _both_ways(example.before.lstrip("\n"), MigrateOptions(rules=[rule], target=target))


@pytest.mark.parametrize("name,target", [
    pytest.param(p.parent.name, t, id=f"{p.parent.name}-{t}")
    for p in sorted(FIXTURES.glob("*/cuda.py")) for t in TARGETS
])
def test_every_fixture_migrates_the_same_without_pruning(name, target):
    source = (FIXTURES / name / "cuda.py").read_text()
    _both_ways(source, MigrateOptions(rules=select_rules([], []), target=target))
