"""The shape of `tpukit run`'s code: no import cycles in tpukit/run, no renderer reaching into a
command, one place that reads each torch_xla metric, the summary's schema made from its type."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import jsonschema

from tpukit.findings import Severity
from tpukit.run.analysis import analyse
from tpukit.run.debuglog import GraphEvent
from tpukit.run.loops import Loops
from tpukit.run.probe import HostRead, Probe, Step
from tpukit.run.recompiles import recompile_findings
from tpukit.run.run_finding import finding
from tpukit.run.summary import RunSummary, StepStats, json_schema

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "tpukit" / "run"
RENDER = ROOT / "tpukit" / "render"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every tpukit module `path` imports, at the top or inside a function (a lazy import is
    still a dependency), but not under `if TYPE_CHECKING:`."""
    found = set()
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]

    def visit(node):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {name for name in found if name.startswith("tpukit.")}


def _graph(root: Path) -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in root.rglob("*.py")}
    return {name: _imports(path) & set(modules) - {name} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for succ in sorted(graph[node]):
            if state.get(succ) == 1:
                return path[path.index(succ):] + [succ]
            if succ not in state and (found := walk(succ)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_the_run_package_has_no_import_cycle():
    graph = _graph(RUN)
    assert "tpukit.run.probe" in graph and "tpukit.run.patches.boundaries" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_tpukit_has_no_import_cycle():
    graph = _graph(ROOT / "tpukit")
    assert "tpukit.migrate.engine" in graph and "tpukit.shim.layer" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_renderer_imports_a_run_module_but_the_summary_type():
    for path in RENDER.rglob("*.py"):
        run_imports = {m for m in _imports(path) if m.startswith("tpukit.run")}
        assert run_imports <= {"tpukit.run", "tpukit.run.summary"}, (path.name, run_imports)
        assert "tpukit.run.command" not in _imports(path), path.name


def test_no_run_module_reaches_into_the_probes_private_state():
    for path in RUN.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                owner = node.value
                name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
                assert name != "probe", f"{path.name}:{node.lineno}: probe.{node.attr}"


def test_each_torch_xla_metric_is_read_in_one_place():
    reads = {}
    for path in RUN.rglob("*.py"):
        for name in re.findall(r'_metric\("(\w+)"\)', path.read_text(encoding="utf-8")):
            reads.setdefault(name, []).append(path.name)
    assert reads["CompileTime"] == ["counters.py"]
    assert all(len(files) == 1 for files in reads.values()), reads


def test_the_documented_schema_is_the_one_made_from_the_summary_type():
    saved = json.loads((ROOT / "docs" / "run-summary.schema.json").read_text(encoding="utf-8"))
    assert saved == json_schema()


def test_the_schema_has_a_property_for_each_summary_field_in_order():
    names = [f.name for f in dataclasses.fields(RunSummary)]
    at = names.index("stats")  # StepStats' fields are the summary's own, in its place
    names[at:at + 1] = [f.name for f in dataclasses.fields(StepStats)]
    assert list(json_schema()["properties"]) == names


def test_the_run_summary_keys_in_json_md_are_the_schemas():
    text = (ROOT / "docs" / "json.md").read_text(encoding="utf-8")
    example = text.split("## `tpukit run --json PATH`", 1)[1].split("```json", 1)[1]
    example = example.split('"findings"', 1)[0]
    keys = set()
    for line in re.findall(r'^ {4}".*$', example, re.MULTILINE):  # the summary's own lines
        line = line.split("//", 1)[0]
        while re.search(r"\{[^{}]*\}|\[[^\[\]]*\]", line):  # drop nested objects, lists
            line = re.sub(r"\{[^{}]*\}|\[[^\[\]]*\]", "", line)
        head = re.split(r"[\[{]", line, maxsplit=1)[0]  # what an unclosed list or object holds
        keys.update(re.findall(r'"(\w+)":', head))
    assert keys == set(json_schema()["properties"])


def _summary(analysis) -> RunSummary:
    return RunSummary(script="train.py", args=[], device="CPU", outcome="ok", exit_code=0,
                      error="", wall_s=1.5, partial=False, stats=analysis.stats,
                      tpu_generation="v5e", time_shares={"compile": 0.0, "host_wait": 0.0})


def test_a_summary_validates_against_its_schema_and_is_flat():
    step = Step(1, start=0.0, end=0.5, compiles=1, shapes={"batch": ((8, 12), "int64")})
    step.boundary_at = ("train.py", 40)
    step.reads = [HostRead("item", "train.py", 30, 4)]
    probe = Probe(None)
    probe.steps = [step, Step(2, start=1.0, end=1.5)]
    data = _summary(analyse(probe, warmup=1, script="train.py")).to_dict()
    jsonschema.validate(data, json_schema())
    assert list(data)[:9] == ["script", "args", "device", "outcome", "exit_code", "error",
                              "wall_s", "partial", "steps"]
    assert list(data)[-11:] == ["launches", "attention", "tpu_generation", "profile",
                                "time_shares", "failed_on", "suppressed", "in_progress",
                                "stopped_in", "mappings", "compile_cache"]
    assert "stats" not in data


def _compiling(index: int) -> Step:
    step = Step(index, start=float(index), end=index + 0.5, compiles=int(index <= 4))
    step.boundary_at = ("train.py", 40)
    if step.compiles:
        step.graphs = [GraphEvent("compile", f"hash{index}", frames=[("f", "/tmp/train.py", 56)])]
    return step


def test_a_long_warm_up_is_a_typed_set_of_steps_and_fails_nothing():
    # every step up to the 4th compiled, none of the 4 after: a long warm-up (--warmup 2)
    steps = [_compiling(i) for i in range(1, 9)]
    found = recompile_findings(steps, Loops(steps, 2), "train.py")
    assert found.long_warmup_steps == {3, 4}
    assert [f.fails_on for f in found.findings] == [None, None]
    steps[6] = _compiling(7)
    steps[6].compiles = 1  # a compile again at step 7: no warm-up, a recompile each time
    steps[6].graphs = [GraphEvent("compile", "hash7", frames=[("f", "/tmp/train.py", 56)])]
    found = recompile_findings(steps, Loops(steps, 2), "train.py")
    assert found.long_warmup_steps == set()
    assert {f.fails_on for f in found.findings} == {"recompile"}


def test_the_fail_on_kind_is_its_own_attribute_not_the_severity():
    quiet = finding("TPU703", "read", ("train.py", 3), Severity.INFO, fails_on="sync")
    loud = finding("TPU703", "read", ("train.py", 4))
    assert quiet.fails_on == "sync" and loud.fails_on is None
    assert "fails_on" not in quiet.to_dict()  # the JSON report is unchanged
