"""Every rule file is valid and documented, and its examples are its tests."""

from __future__ import annotations

import ast
import re

import pytest

from conftest import assert_said_in_parts
from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.migrate.ownership import Owner
from tpukit.migrate.transforms.base import transform_for
from tpukit.rules import TARGETS, load_rules, rules_dir, select_rules

RULES = load_rules()
ALL = MigrateOptions(rules=select_rules([], []))
OPTIONS = {target: MigrateOptions(rules=ALL.rules, target=target) for target in TARGETS}
# an example marked `owner = "library"` is a package's module (its __init__.py) under
# --library-mode; any other, a script of the user's program
LIBRARY = {target: MigrateOptions(rules=ALL.rules, target=target, owner=Owner.LIBRARY)
           for target in TARGETS}


def migrated(example, target: str, source: str):
    if example.owner == "library":
        return migrate_source(source, "__init__.py", LIBRARY[target])
    return migrate_source(source, "example.py", OPTIONS[target])
# Every example is a test for every target it names (`xla = ...`, `torchtpu = ...`).
EXAMPLES = [
    pytest.param(rule, target, example, id=f"{code}-example{i + 1}-{target}")
    for code, rule in RULES.items()
    for i, example in enumerate(rule.examples)
    for target in example.expected
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
    else:  # an environment check, a shell-script scan, a finding of `tpukit run`, a suppression
        users = CODE_USES.get(rule.code, set())
        assert users, f"no code in tpukit/ makes a {rule.code} finding"
        assert all(p.startswith(ENGINE_HOME[rule.extra["engine"]]) for p in users), (rule.code, users)


# Where each non-code engine's findings are made.
ENGINE_HOME = {"doctor": "tpukit/doctor/", "shell": "tpukit/migrate/shell.py", "runner": "tpukit/run/", "shim": "tpukit/shim/",
               "suppress": "tpukit/suppress.py", "verify": "tpukit/verify/"}


def _code_uses() -> dict[str, set[str]]:
    """Rule codes used as values in tpukit's code (a call's argument, a subscript, an assigned
    constant), by the files that use them: not in docstrings or comments, which say nothing."""
    root = rules_dir().parent
    uses: dict[str, set[str]] = {}
    for path in sorted((root / "tpukit").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            values = []
            if isinstance(node, ast.Call):
                values = [*node.args, *(k.value for k in node.keywords)]
            elif isinstance(node, ast.Subscript):
                values = [node.slice]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                values = [node.value]
            elif isinstance(node, ast.Compare):
                values = node.comparators
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str) \
                        and re.fullmatch(r"TPU\d{3}", value.value):
                    uses.setdefault(value.value, set()).add(str(path.relative_to(root)))
    return uses


CODE_USES = _code_uses()


def test_every_rule_code_the_code_uses_is_a_rule():
    unknown = {code: sorted(paths) for code, paths in CODE_USES.items() if code not in RULES}
    assert unknown == {}


def test_migrate_runs_only_code_rules():
    assert all(r.checks_code for r in select_rules([], []))
    assert not any(r.code == "TPU001" for r in ALL.rules if r.checks_code)


def _is_like(finding, want: dict) -> bool:
    """`finding` is as an example's `findings` entry describes (rules.FINDING_KEYS)."""
    return (finding.code == want["code"]
            and want.get("line", finding.location.line) == finding.location.line
            and want.get("applied", finding.applied) == finding.applied
            and want.get("severity", finding.severity.value) == finding.severity.value
            and want.get("says", "") in finding.message)


@pytest.mark.parametrize("rule,target,example", EXAMPLES)
def test_example_migrates_to_its_expected_form(rule, target, example):
    before = example.before.lstrip("\n")
    migration = migrated(example, target, before)
    expected = example.expected[target].lstrip("\n")
    assert migration.new_source == expected
    assert_said_in_parts(migration.findings)
    codes = {f.code for f in migration.findings}
    if rule.skips(target):
        assert rule.code not in codes  # nothing to do on this target: not even a finding
    if example.codes_for(target) is not None:
        assert codes == set(example.codes_for(target))
    elif not rule.skips(target):
        assert rule.code in codes
    if example.left_for(target) is not None:  # what still needs a person, by code
        assert {f.code for f in migration.findings if not f.applied} == set(example.left_for(target))
    for want in example.findings_for(target):  # a finding's line, state and what it names
        found = [f for f in migration.findings if _is_like(f, want)]
        assert len(found) == want["count"] if "count" in want else found, (want, migration.findings)


@pytest.mark.parametrize("rule,target,example", EXAMPLES)
def test_example_output_is_python_and_a_fixed_point(rule, target, example):
    expected = example.expected[target].lstrip("\n")
    ast.parse(expected)
    again = migrated(example, target, expected)
    assert again.new_source == expected


@pytest.mark.parametrize("rule", [r for r in RULES.values() if r.checks_code], ids=lambda r: r.code)
def test_every_code_rule_says_what_it_does_on_torchtpu(rule):
    # A mapping, a note on why there is nothing to do, or the target's own finding wording.
    table = rule.target("torchtpu")
    assert table or rule.fix_for("torchtpu").value == "none", f"{rule.code}: no [targets.torchtpu]"
    if rule.skips("torchtpu"):
        assert table.get("note"), f"{rule.code} skips torchtpu without saying why"


@pytest.mark.parametrize("rule", [r for r in RULES.values() if r.checks_code and r.fix.value != "none"],
                         ids=lambda r: r.code)
def test_every_rewriting_rule_has_a_torchtpu_example(rule):
    assert any("torchtpu" in e.expected for e in rule.examples), f"{rule.code}: no torchtpu example"


@pytest.mark.parametrize("rule,target,example", EXAMPLES)
def test_example_trigger_prefilter_admits_the_example(rule, target, example):
    # A trigger that does not occur in the rule's own example would skip the file unparsed.
    assert any(t in example.before for t in rule.triggers)


def test_select_and_ignore_by_prefix():
    chosen = {r.code for r in select_rules(["TPU9"], ["TPU905"])}
    assert "TPU901" in chosen and "TPU905" not in chosen
    assert all(code.startswith("TPU9") for code in chosen)


def test_readme_rule_table_is_the_one_rules_make():
    """The README's table is generated from rules/ (tests/update_readme.py): every rule, each
    row as its file says, nothing else."""
    from update_readme import rule_table, with_table

    readme = (rules_dir().parent / "README.md").read_text()
    assert with_table(readme) == readme, "stale rule table: run tests/update_readme.py"
    assert all(f"| {code} | {rule.name} |" in rule_table() for code, rule in RULES.items())
