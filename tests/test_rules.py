"""Every rule file is valid and documented, and its examples are its tests."""

from __future__ import annotations

import ast

import pytest

from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.migrate.transforms.base import transform_for
from tpukit.rules import TARGETS, load_rules, rules_dir, select_rules

RULES = load_rules()
ALL = MigrateOptions(rules=select_rules([], []))
EXAMPLES = [
    pytest.param(rule, i, example, id=f"{code}-example{i + 1}")
    for code, rule in RULES.items()
    for i, example in enumerate(rule.examples)
]


def test_rules_folder_is_found_and_every_file_loads():
    files = sorted(p.name for p in rules_dir().glob("*.toml"))
    assert len(files) == len(RULES) >= 20
    assert [f"{code}-{rule.name}.toml" for code, rule in RULES.items()] == files


@pytest.mark.parametrize("rule", RULES.values(), ids=list(RULES))
def test_rule_has_code_behind_it_and_docs(rule):
    assert len(rule.why) > 80, "the why must say why it matters on a TPU"
    assert set(rule.targets) <= set(TARGETS)
    if rule.checks_code:
        assert transform_for(rule) is not None, f"{rule.code} has no transform registered"
        assert rule.triggers, "a rule needs prefilter triggers"
        assert rule.examples
    elif rule.extra["engine"] == "doctor":  # an environment check of `tpukit doctor`
        checks = (rules_dir().parent / "tpukit" / "doctor" / "checks.py").read_text()
        assert f'finding("{rule.code}"' in checks
    elif rule.extra["engine"] == "shell":  # migrate's scan of *.sh files
        assert f'"{rule.code}"' in (rules_dir().parent / "tpukit" / "migrate" / "shell.py").read_text()
    else:  # a finding of `tpukit run`
        assert rule.extra["engine"] == "runner"
        sources = "".join(p.read_text() for p in (rules_dir().parent / "tpukit" / "run").glob("*.py"))
        assert f'"{rule.code}"' in sources


def test_migrate_runs_only_code_rules():
    assert all(r.checks_code for r in select_rules([], []))
    assert not any(r.code == "TPU001" for r in ALL.rules if r.checks_code)


@pytest.mark.parametrize("rule,index,example", EXAMPLES)
def test_example_migrates_to_its_expected_form(rule, index, example):
    before = example.before.lstrip("\n")
    migration = migrate_source(before, "example.py", ALL)
    expected = example.expected["xla"].lstrip("\n")
    assert migration.new_source == expected
    codes = {f.code for f in migration.findings}
    if example.codes is not None:
        assert codes == set(example.codes)
    else:
        assert rule.code in codes


@pytest.mark.parametrize("rule,index,example", EXAMPLES)
def test_example_output_is_python_and_a_fixed_point(rule, index, example):
    expected = example.expected["xla"].lstrip("\n")
    ast.parse(expected)
    again = migrate_source(expected, "example.py", ALL)
    assert again.new_source == expected


@pytest.mark.parametrize("rule,index,example", EXAMPLES)
def test_example_trigger_prefilter_admits_the_example(rule, index, example):
    # A trigger that does not occur in the rule's own example would skip the file unparsed.
    assert any(t in example.before for t in rule.triggers)


def test_select_and_ignore_by_prefix():
    chosen = {r.code for r in select_rules(["TPU9"], ["TPU905"])}
    assert "TPU901" in chosen and "TPU905" not in chosen
    assert all(code.startswith("TPU9") for code in chosen)


def test_readme_rule_table_lists_every_rule():
    readme = (rules_dir().parent / "README.md").read_text()
    for code, rule in RULES.items():
        row = f"| {code} | {rule.name} | {rule.severity.value} | {rule.fix.value} | {rule.summary} |"
        assert row in readme, f"README rule table is missing or stale for {code}"
