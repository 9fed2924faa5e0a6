"""The policy table (rules/catalog/ownership.toml): every case a rule asks for is in it, every
case in it is asked for, and the table (not the rule) decides what library code keeps."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from tpukit.migrate import policy
from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.migrate.ownership import Owner
from tpukit.rules import select_rules

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = MigrateOptions(rules=select_rules([], []), owner=Owner.LIBRARY)


def _asked() -> set[tuple[str, str]]:
    """(rule, case) of every `owner_leaves("RULE", "case")` and `library_leaves(node, "case",
    ...)` in tpukit's code (a library_leaves case belongs to its rule's class: the module's
    registered code, or the call-map engine)."""
    asked = set()
    for path in (ROOT / "tpukit" / "migrate").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            values = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if node.func.attr in ("owner_leaves", "owner_reports") and len(node.args) == 2 \
                    and isinstance(node.args[1], ast.Constant):
                # a rule's code, or the asking rule's own (`self.rule.code`): any of them
                asked.add(tuple(values) if len(values) == 2 else (path.stem, values[-1]))
            elif node.func.attr == "library_leaves" and values:
                asked.add((path.stem, values[0]))
    return asked


def test_every_case_asked_for_is_in_the_table_and_every_entry_is_asked_for():
    table = {(rule, case) for rule, cases in policy.table()["library"].items() for case in cases}
    asked = _asked()
    direct = {a for a in asked if a[0] in {r for r, _ in table}}
    assert direct <= table
    via_module = {case for stem, case in asked if (stem, case) not in direct}
    assert via_module <= {case for _, case in table}
    assert {case for _, case in table} <= {case for _, case in asked}


def test_program_code_rewrites_every_case():
    assert policy.action(Owner.PROGRAM, "TPU118", "seed") == "rewrite"
    with pytest.raises(KeyError):
        policy.action(Owner.LIBRARY, "TPU118", "no_such_case")


def test_the_table_decides_what_library_code_keeps(tmp_path, monkeypatch):
    (tmp_path / "__init__.py").write_text("")
    source = textwrap.dedent("""
        import torch

        def serve(model, seed):
            torch.manual_seed(seed)
            return model(torch.zeros(2).cuda())
        """).lstrip("\\n")
    kept = migrate_source(source, str(tmp_path / "lib.py"), LIBRARY)
    assert "    torch.manual_seed(seed)\n    if _tpukit_on_xla()" in kept.new_source
    table = {**policy.table(), "library": {**policy.table()["library"],
                                           "TPU118": {"seed": "rewrite"}}}
    monkeypatch.setattr(policy, "table", lambda: table)
    ported = migrate_source(source, str(tmp_path / "lib.py"), LIBRARY)
    seeded = ported.new_source.split("def serve")[1].split("return")[0]
    assert "torch.manual_seed(seed)" in seeded and "_tpukit_on_xla()" in seeded
    assert seeded.count("manual_seed") >= 1 and seeded != kept.new_source.split(
        "def serve")[1].split("return")[0]
