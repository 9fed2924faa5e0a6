"""What every torchtpu-target output of tpukit uses of the device API: the `torch.tpu.*` and
`torch.accelerator.*` attribute chains (through `import torch as th`, `from torch import tpu`),
the calls of them, the assignments to `torch.tpu.*`, and the helpers tpukit inserted.

Only what tpukit introduced counts: a rule example's output is compared with its `before`, so a
call the user wrote and tpukit reported (`torch.tpu.get_rng_state()`, TPU119) is not counted.
Shared by test_torchtpu_api.py (static, against tests/data/*.txt) and test_torchtpu_wheel.py
(against the real torch-tpu wheel).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tpukit.config import DEFAULT_EAGER_MODE
from tpukit.migrate import helpers
from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import load_rules, select_rules

ROOT = Path(__file__).resolve().parent.parent
PREFIXES = ("torch.tpu", "torch.accelerator")
INTERNAL = ROOT / "tests" / "data" / "torchtpu-INTERNAL.txt"
WORKER = ROOT / "tests" / "torchtpu_calls.py"
# Errors that only say there is no TPU on this host: the call itself is right.
NO_TPU = re.compile(r"none is available|no TPU devices|expected TPU devices, got none|"
                    r"unrecognized TPU|No jellyfish device|"
                    r"device type at start of device string: tpu")


def internal_names() -> dict[str, str]:
    """torch.tpu names torch-tpu 0.2.0 keeps from user code -> the call its error names."""
    names = {}
    for line in INTERNAL.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _since, preferred = line.split("\t")
            names[name] = preferred
    return names


@dataclass(frozen=True)
class Call:
    func: str  # canonical: `torch.accelerator.synchronize`, or a helper's name
    code: str  # the call with `torch.` spelled out
    statement: bool  # a statement of its own (its value is dropped)
    literal: bool  # every argument is a literal, so the call can be made as it stands


@dataclass
class Uses:
    chains: set[str] = field(default_factory=set)
    calls: set[Call] = field(default_factory=set)
    assignments: set[str] = field(default_factory=set)
    helpers: dict[str, str] = field(default_factory=dict)
    imported: set[str] = field(default_factory=set)  # the modules the source imports

    def minus(self, other: "Uses") -> "Uses":
        return Uses(self.chains - other.chains, self.calls - other.calls,
                    self.assignments - other.assignments,
                    {k: v for k, v in self.helpers.items() if k not in other.helpers},
                    self.imported - other.imported)

    def merge(self, other: "Uses") -> None:
        self.chains |= other.chains
        self.calls |= other.calls
        self.assignments |= other.assignments
        self.helpers.update(other.helpers)
        self.imported |= other.imported

    def keys(self) -> list[str]:
        """What the worker names each item by: a chain, a call's key, an assignment."""
        return [*self.chains, *map(call_key, self.calls), *self.assignments]

    def tpu_chains(self) -> set[str]:
        """The `torch.tpu...` chains alone (torch-tpu's own namespace)."""
        return {c for c in self.chains if c == "torch.tpu" or c.startswith("torch.tpu.")}


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


class _Collector(ast.NodeVisitor):
    def __init__(self, source: str) -> None:
        self.source = source
        self.aliases: dict[str, str] = {}
        self.uses = Uses()
        self._statement_calls: set[int] = set()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.uses.imported.add(alias.name)
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                root = alias.name.split(".")[0]
                self.aliases[root] = root

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module is None or node.level:
            return
        self.uses.imported.add(node.module)
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            self.aliases[alias.asname or alias.name] = full
            if self._ours(full):
                self.uses.chains.add(full)

    @staticmethod
    def _ours(name: str | None) -> bool:
        return name is not None and any(name == p or name.startswith(p + ".") for p in PREFIXES)

    def resolve(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name in helpers.SOURCES and node.name.startswith("_tpu"):
            self.uses.helpers[node.name] = ast.get_source_segment(self.source, node)
        self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Call):
            self._statement_calls.add(id(node.value))
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and self._ours(self.resolve(node.targets[0])):
            value = self.resolve(node.value)
            if self._ours(value):
                self.uses.assignments.add(f"{self.resolve(node.targets[0])} = {value}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = self.resolve(node.func)
        if func is None and isinstance(node.func, ast.Name) and node.func.id in self.uses.helpers:
            func = node.func.id
        if self._ours(func) or func in self.uses.helpers:
            args = [ast.get_source_segment(self.source, a) for a in node.args]
            args += [f"{k.arg}={ast.get_source_segment(self.source, k.value)}" if k.arg
                     else f"**{ast.get_source_segment(self.source, k.value)}" for k in node.keywords]
            literal = all(_literal(a) for a in node.args) and all(
                k.arg and _literal(k.value) for k in node.keywords)
            self.uses.calls.add(Call(func, f"{func}({', '.join(args)})",
                                     id(node) in self._statement_calls, literal))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.resolve(node)
        if self._ours(name):
            self.uses.chains.add(name)  # the whole chain; its prefixes are resolved from it
            return
        self.generic_visit(node)


def call_key(call: Call) -> str:
    return f"{call.code} [statement]" if call.statement else call.code


def run_worker(uses: Uses, timeout: float = 300) -> list[dict]:
    """Every chain, call and assignment of `uses` made against the torch and torch_tpu of this
    interpreter (tests/torchtpu_calls.py, a process of its own): one dict each, with `key`."""
    request = {
        "chains": sorted(uses.chains),
        "calls": [{"func": c.func, "code": c.code, "statement": c.statement, "call": c.literal,
                   "key": call_key(c)} for c in sorted(uses.calls, key=call_key)],
        "assignments": sorted(uses.assignments), "helpers": uses.helpers,
    }
    proc = subprocess.run([sys.executable, str(WORKER)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the torch-tpu worker failed: {proc.stderr[-3000:]}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for line in lines:
        line.setdefault("key", line.get("chain") or line.get("assignment"))
    return lines


def uses_of(source: str) -> Uses:
    collector = _Collector(source)
    collector.visit(ast.parse(source))
    return collector.uses


def torchtpu_options() -> MigrateOptions:
    """What `tpukit migrate --target torchtpu` runs (the default eager mode)."""
    return MigrateOptions(rules=select_rules([], []), target="torchtpu",
                          eager_mode=DEFAULT_EAGER_MODE)


def outputs() -> list[tuple[str, str, Uses]]:
    """(id, migrated source, what tpukit introduced) for every fixture and every rule example,
    migrated now with --target torchtpu."""
    options = torchtpu_options()
    found = []
    for path in sorted((ROOT / "fixtures").glob("*/cuda.py")):
        new = migrate_source(path.read_text(), "cuda.py", options).new_source
        found.append((f"{path.parent.name}/cuda.py", new, uses_of(new)))
    for code, rule in load_rules().items():
        for i, example in enumerate(rule.examples):
            before = example.before.lstrip("\n")
            new = migrate_source(before, "example.py", options).new_source
            found.append((f"{code}-example{i + 1}", new, uses_of(new).minus(uses_of(before))))
    return found
