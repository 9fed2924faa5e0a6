"""Regenerate each fixture's goldens from fixtures/*/cuda.py, for every target: xla.py and
findings.txt, torchtpu.py and findings_torchtpu.txt. Review the git diff before committing:
the goldens are the spec, not a snapshot to accept blindly.

    .venv/bin/python tests/update_goldens.py
"""

from __future__ import annotations

from pathlib import Path

from test_fixtures import GOLDENS, OPTIONS, findings_text
from tpukit.migrate.engine import migrate_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _write(path: Path, text: str) -> None:
    old = path.read_text(encoding="utf-8") if path.exists() else None
    if old != text:
        path.write_text(text, encoding="utf-8")
        print(f"updated {path.relative_to(FIXTURES.parent)}")


def main() -> None:
    for source in sorted(FIXTURES.glob("*/cuda.py")):
        for target, (code, findings) in GOLDENS.items():
            migration = migrate_source(source.read_text(encoding="utf-8"), "cuda.py", OPTIONS[target])
            _write(source.with_name(code), migration.new_source)
            _write(source.with_name(findings), findings_text(migration.findings))


if __name__ == "__main__":
    main()
