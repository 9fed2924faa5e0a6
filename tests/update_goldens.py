"""Regenerate fixtures/*/xla.py from fixtures/*/cuda.py. Review the git diff before committing:
the goldens are the spec, not a snapshot to accept blindly.

    .venv/bin/python tests/update_goldens.py
"""

from __future__ import annotations

from pathlib import Path

from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import select_rules

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def main() -> None:
    options = MigrateOptions(rules=select_rules([], []))
    for source in sorted(FIXTURES.glob("*/cuda.py")):
        migration = migrate_source(source.read_text(encoding="utf-8"), "cuda.py", options)
        golden = source.with_name("xla.py")
        old = golden.read_text(encoding="utf-8") if golden.exists() else None
        if old != migration.new_source:
            golden.write_text(migration.new_source, encoding="utf-8")
            print(f"updated {golden.relative_to(FIXTURES.parent)}")
        findings = source.with_name("findings.txt")
        text = "".join(
            f"{f.location.line}:{f.location.col} {f.code} {f.message}\n" for f in migration.findings
        )
        if not findings.exists() or findings.read_text(encoding="utf-8") != text:
            findings.write_text(text, encoding="utf-8")
            print(f"updated {findings.relative_to(FIXTURES.parent)}")


if __name__ == "__main__":
    main()
