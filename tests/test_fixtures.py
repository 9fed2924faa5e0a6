"""The CUDA fixtures migrate to their goldens (code and findings), and again to themselves."""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import select_rules

OPTIONS = MigrateOptions(rules=select_rules([], []))
CASES = sorted(p.parent.name for p in FIXTURES.glob("*/cuda.py"))


def findings_text(findings) -> str:
    return "".join(f"{f.location.line}:{f.location.col} {f.code} {f.message}\n" for f in findings)


def test_there_are_enough_fixtures():
    assert len(CASES) >= 6


@pytest.mark.parametrize("name", CASES)
def test_fixture_migrates_to_golden(name):
    folder = FIXTURES / name
    migration = migrate_source((folder / "cuda.py").read_text(), "cuda.py", OPTIONS)
    assert migration.new_source == (folder / "xla.py").read_text()
    assert findings_text(migration.findings) == (folder / "findings.txt").read_text()


@pytest.mark.parametrize("name", CASES)
def test_golden_is_a_fixed_point(name):
    golden = (FIXTURES / name / "xla.py").read_text()
    assert migrate_source(golden, "xla.py", OPTIONS).new_source == golden


@pytest.mark.parametrize("name", CASES)
def test_golden_still_reports_exactly_what_was_left_for_a_person(name):
    folder = FIXTURES / name
    first = migrate_source((folder / "cuda.py").read_text(), "cuda.py", OPTIONS).findings
    again = migrate_source((folder / "xla.py").read_text(), "xla.py", OPTIONS).findings
    assert sorted(f.code for f in first if not f.applied) == sorted(f.code for f in again)
    assert not any(f.applied for f in again)


REFERENCES = sorted(p.parent.name for p in FIXTURES.glob("*/reference_xla.py"))


@pytest.mark.parametrize("name", REFERENCES)
def test_careful_hand_port_has_nothing_left_to_migrate(name):
    reference = (FIXTURES / name / "reference_xla.py").read_text()
    migration = migrate_source(reference, "reference_xla.py", OPTIONS)
    assert migration.new_source == reference
    assert not [f for f in migration.findings if f.applied]
