"""The policy table (rules/catalog/ownership.toml): what a rule does with a case in code of
each owner. `leaves(owner, rule, case)` is the one answer every rule asks; the table, not the
rule, says whether library code keeps its choice. Program code rewrites every case."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

from tpukit.migrate.ownership import Owner

ACTIONS = ("rewrite", "report", "leave")


def action(owner: Owner, rule: str, case: str) -> str:
    """"rewrite", "report" or "leave" for `case` of `rule` (a code, or an engine's name) in
    code owned by `owner`. A case the table does not list is an error: every case asked for
    is listed (tests/test_policy.py)."""
    if owner is not Owner.LIBRARY:
        return "rewrite"
    cases = table().get("library", {}).get(rule)
    if cases is None or case not in cases:
        raise KeyError(f"rules/catalog/ownership.toml: no library case {rule}.{case}")
    return cases[case]


def table() -> dict:
    from tpukit.rules import rules_dir

    return _read(rules_dir())


@functools.cache
def _read(folder: Path) -> dict:
    data = tomllib.loads((folder / "catalog" / "ownership.toml").read_text(encoding="utf-8"))
    for owner, rules in data.items():
        for rule, cases in rules.items():
            for case, act in cases.items():
                if act not in ACTIONS:
                    raise ValueError(f"rules/catalog/ownership.toml: [{owner}] {rule}.{case} = "
                                     f"{act!r}: one of {', '.join(ACTIONS)}")
    return data
