"""Regenerate the README's rule table from rules/ (one row per rule: code, name, severity, fix
kind, summary), between its two markers. tests/test_rules.py checks the table is current.

    .venv/bin/python tests/update_readme.py
"""

from __future__ import annotations

import re
from pathlib import Path

from tpukit.rules import load_rules

README = Path(__file__).resolve().parent.parent / "README.md"
START = "<!-- rules table start: generated from rules/ by tests/update_readme.py -->"
END = "<!-- rules table end: generated from rules/ by tests/update_readme.py -->"


def rule_table() -> str:
    rows = ["| code | name | severity | fix | summary |", "|---|---|---|---|---|"]
    rows += [f"| {code} | {rule.name} | {rule.severity.value} | {rule.fix.value} | {rule.summary} |"
             for code, rule in sorted(load_rules().items())]
    return "\n".join(rows)


def with_table(text: str) -> str:
    """The README text with the block between the markers replaced by rule_table()."""
    pattern = re.compile(re.escape(START) + r"\n.*?\n" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md lacks the markers {START!r} ... {END!r}")
    return pattern.sub(lambda _: f"{START}\n{rule_table()}\n{END}", text)


def main() -> None:
    text = README.read_text(encoding="utf-8")
    new = with_table(text)
    if new != text:
        README.write_text(new, encoding="utf-8")
        print("updated README.md's rule table")


if __name__ == "__main__":
    main()
