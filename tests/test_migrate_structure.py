"""The shape of `tpukit migrate`'s code: one rule a module, found without a list; rules share
facts through tpukit/migrate/analysis and import no other rule; no module of tpukit/ over 600
lines."""

from __future__ import annotations

import ast
import sys

import pytest

from test_run_structure import ROOT, _imports, _module_name
from tpukit.migrate.transforms import import_all, load_transforms
from tpukit.migrate.transforms.base import ENGINES, TRANSFORMS, transform_for
from tpukit.rules import load_rules

TRANSFORMS_DIR = ROOT / "tpukit" / "migrate" / "transforms"
MAX_LINES = 600


def _registered_classes(path) -> list[str]:
    """The classes a module registers (decorated with `transform(...)` or `engine(...)`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)
            and any(isinstance(d, ast.Call) and getattr(d.func, "id", None) in ("transform", "engine")
                    for d in node.decorator_list)]


def _rule_modules() -> dict[str, list[str]]:
    found = {_module_name(p): _registered_classes(p) for p in TRANSFORMS_DIR.rglob("*.py")}
    return {name: classes for name, classes in found.items() if classes}


def test_a_rule_module_holds_one_rule():
    modules = _rule_modules()
    assert len(modules) >= 35  # every rule of rules/ with code (tpukit/migrate/transforms)
    assert {name: classes for name, classes in modules.items() if len(classes) > 1} == {}


def test_a_rule_imports_no_other_rule():
    """Facts two rules share live in tpukit/migrate/analysis (or a family's common.py, which
    holds no rule): changing one rule never means reading another."""
    modules = _rule_modules()
    barrier = TRANSFORMS_DIR / "loops" / "step_barrier.py"
    assert "tpukit.migrate.analysis.steps" in _imports(barrier)  # the check reads imports
    crossing = {}
    for name in modules:
        path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
        if imported := sorted(_imports(path) & set(modules) - {name}):
            crossing[name] = imported
    assert crossing == {}


def _reads(path) -> set[str]:
    """The analyses a module reads: the tpukit/migrate/analysis modules it imports (catalog is
    a data table, not an analysis), `ctx.values` and `ctx.device_expr` (device_facts), and
    what the family's common.py it imports reads."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("tpukit.migrate.analysis."):
                found.add(node.module.split(".")[3])
            elif node.module == "tpukit.migrate.analysis":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("tpukit.migrate.transforms.") and \
                    node.module.endswith(".common"):  # a family's shared code reads for it
                found |= _reads(ROOT.joinpath(*node.module.split(".")).with_suffix(".py"))
        elif isinstance(node, ast.Attribute) and node.attr in ("values", "device_expr"):
            base = node.value
            if (isinstance(base, ast.Name) and base.id == "ctx") or (
                    isinstance(base, ast.Attribute) and base.attr == "ctx"):
                found.add("values" if node.attr == "values" else "device_facts")
    return found - {"catalog", "PROVIDERS"}


def test_a_rule_declares_the_analyses_it_reads():
    """`uses` (libcst's METADATA_DEPENDENCIES): what a rule reads of the shared analysis is
    declared on its class, exactly, so a reader (and the pruning of device-binding statements)
    sees a rule's dependencies without reading its code."""
    load_transforms()
    classes = {cls.__module__: cls for cls in [*TRANSFORMS.values(), *ENGINES.values()]}
    undeclared = {}
    for name in _rule_modules():
        path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
        if set(classes[name].uses) != _reads(path):
            undeclared[name] = (sorted(classes[name].uses), sorted(_reads(path)))
    assert undeclared == {}
    step_barrier = classes["tpukit.migrate.transforms.loops.step_barrier"]
    assert step_barrier.uses == {"steps", "values"}  # the check reads imports and ctx attributes
    assert "device_facts" in classes["tpukit.migrate.transforms.devices.cuda_device"].uses


def test_an_unknown_analysis_is_refused_when_a_rule_registers():
    from tpukit.migrate.transforms.base import Transform, transform

    class Typo(Transform):
        uses = frozenset({"value"})

    with pytest.raises(ValueError, match="uses value: not an analysis"):
        transform("TPU998")(Typo)
    assert "TPU998" not in TRANSFORMS


def test_every_rule_module_is_found_without_a_list():
    """load_transforms imports every module of the package: each rule class it registers is
    the one its module defines, and every rule with code in rules/ has its class."""
    names = load_transforms()
    assert set(_rule_modules()) <= set(names)
    registered = {cls.__module__ for cls in [*TRANSFORMS.values(), *ENGINES.values()]}
    assert registered == set(_rule_modules())
    # (a shell script's rule is read by tpukit/migrate/shell.py, on *.sh files, not a transform)
    migrate_rules = [rule for rule in load_rules().values() if rule.code[3] in "123459"
                     and rule.extra.get("engine") != "shell"]
    assert len(migrate_rules) > 50
    assert [rule.code for rule in migrate_rules if transform_for(rule) is None] == []


def test_a_new_rule_module_registers_without_an_edit(tmp_path, monkeypatch):
    package = tmp_path / "more_rules"
    (package / "family").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "family" / "__init__.py").write_text("")
    (package / "family" / "new_rule.py").write_text(
        "from tpukit.migrate.transforms.base import Transform, transform\n\n\n"
        "@transform('TPU999')\nclass NewRule(Transform):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(TRANSFORMS, "TPU999", None)  # restored (removed) after the test
    try:
        names = import_all("more_rules", [str(package)])
        assert "more_rules.family.new_rule" in names
        assert TRANSFORMS["TPU999"].__name__ == "NewRule"
    finally:
        for name in [n for n in sys.modules if n.startswith("more_rules")]:
            del sys.modules[name]


def test_no_module_of_tpukit_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "tpukit").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}
