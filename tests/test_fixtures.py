"""The CUDA fixtures migrate to their goldens (code and findings) for every target, and again
to themselves."""

from __future__ import annotations

import pytest

from conftest import FIXTURES, assert_said_in_parts
from tpukit.config import DEFAULT_EAGER_MODE
from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import TARGETS, select_rules

# Each target's golden files next to cuda.py: the migrated script and its findings.
GOLDENS = {
    "xla": ("xla.py", "findings.txt"),
    "torchtpu": ("torchtpu.py", "findings_torchtpu.txt"),
}
CASES = sorted(p.parent.name for p in FIXTURES.glob("*/cuda.py"))
TARGET_CASES = [pytest.param(name, target, id=f"{name}-{target}") for name in CASES for target in TARGETS]


def options_for(target: str) -> MigrateOptions:
    """What `tpukit migrate --target TARGET` runs (torchtpu: the default eager mode)."""
    eager = DEFAULT_EAGER_MODE if target == "torchtpu" else None
    return MigrateOptions(rules=select_rules([], []), target=target, eager_mode=eager)


OPTIONS = {target: options_for(target) for target in TARGETS}


def findings_text(findings) -> str:
    return "".join(f"{f.location.line}:{f.location.col} {f.code} {f.message}\n" for f in findings)


def test_there_are_enough_fixtures():
    assert len(CASES) >= 6


@pytest.mark.parametrize("name", CASES)
def test_every_fixture_has_the_golden_files_of_every_target(name):
    missing = [f"{name}/{file}" for target in TARGETS for file in GOLDENS[target]
               if not (FIXTURES / name / file).is_file()]
    assert not missing, f"no golden file: {', '.join(missing)} (tests/update_goldens.py writes them)"


@pytest.mark.parametrize("name,target", TARGET_CASES)
def test_fixture_migrates_to_golden(name, target):
    folder = FIXTURES / name
    code, findings = GOLDENS[target]
    migration = migrate_source((folder / "cuda.py").read_text(), "cuda.py", OPTIONS[target])
    assert migration.new_source == (folder / code).read_text()
    assert findings_text(migration.findings) == (folder / findings).read_text()
    assert_said_in_parts(migration.findings)


@pytest.mark.parametrize("name,target", TARGET_CASES)
def test_golden_is_a_fixed_point(name, target):
    golden = (FIXTURES / name / GOLDENS[target][0]).read_text()
    assert migrate_source(golden, "golden.py", OPTIONS[target]).new_source == golden


@pytest.mark.parametrize("name,target", TARGET_CASES)
def test_golden_still_reports_exactly_what_was_left_for_a_person(name, target):
    folder = FIXTURES / name
    first = migrate_source((folder / "cuda.py").read_text(), "cuda.py", OPTIONS[target]).findings
    golden = (folder / GOLDENS[target][0]).read_text()
    again = migrate_source(golden, "golden.py", OPTIONS[target]).findings
    assert sorted(f.code for f in first if not f.applied) == sorted(f.code for f in again)
    assert not any(f.applied for f in again)


REFERENCES = sorted(p.parent.name for p in FIXTURES.glob("*/reference_xla.py"))


@pytest.mark.parametrize("name", REFERENCES)
def test_careful_hand_port_has_nothing_left_to_migrate(name):
    reference = (FIXTURES / name / "reference_xla.py").read_text()
    migration = migrate_source(reference, "reference_xla.py", OPTIONS["xla"])
    assert migration.new_source == reference
    assert not [f for f in migration.findings if f.applied]
