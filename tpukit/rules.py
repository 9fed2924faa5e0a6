"""Loads and validates the rule files in rules/ (one TOML file per rule).

The folder is `rules/` at the top of a source checkout (and an editable install) and
`tpukit/_rules/` inside a wheel, where pyproject.toml's force-include puts it.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tpukit.findings import FixKind, Severity

TARGETS = ("xla", "torchtpu")
_CODE = re.compile(r"^TPU\d{3}$")
_REQUIRED = ("code", "name", "severity", "fix", "summary", "why")
# Rules about the environment (doctor), a running script (run), suppression comments or shell
# scripts (migrate's scan of *.sh files), not about Python source code.
NON_CODE_ENGINES = ("doctor", "runner", "shell", "suppress")


class RuleError(Exception):
    """A rule file is malformed: a bug in tpukit, reported with the file's name."""


@dataclass(frozen=True)
class Example:
    before: str
    expected: dict[str, str]  # target -> migrated source; a target absent here is not tested
    codes: tuple[str, ...] | None = None  # exactly the codes reported on `before`, if given
    # `codes_<target>`: the codes on a target where they differ from `codes`
    target_codes: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def codes_for(self, target: str) -> tuple[str, ...] | None:
        return self.target_codes.get(target, self.codes)


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: Severity
    fix: FixKind
    summary: str
    why: str
    triggers: tuple[str, ...]  # a file without any of these is not parsed
    targets: dict[str, dict]
    examples: tuple[Example, ...]
    path: Path
    message: str = ""
    extra: dict = field(default_factory=dict)
    # Words a statement must contain to be traversed (default: the triggers).
    statement_triggers: tuple[str, ...] = ()

    def target(self, target: str) -> dict:
        return self.targets.get(target, {})

    def skips(self, target: str) -> bool:
        """Nothing to do on this target (`skip = true` in its table, with a `note` saying why)."""
        return bool(self.target(target).get("skip"))

    def fix_for(self, target: str) -> FixKind:
        """The fix kind on this target: a target table may override the rule's (`fix = "safe"`
        where the target has the API that another target lacks)."""
        return FixKind(self.target(target).get("fix", self.fix.value))

    def message_for(self, target: str) -> str:
        return self.target(target).get("message", self.message).strip()

    @property
    def checks_code(self) -> bool:
        """A rule about source code (migrate), not about the environment or a run."""
        return self.extra.get("engine") not in NON_CODE_ENGINES


def rules_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_rules", here.parent / "rules"):
        if candidate.is_dir():
            return candidate
    raise RuleError(f"no rules folder next to {here}")


def _parse(path: Path) -> Rule:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RuleError(f"{path}: {exc}") from exc
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise RuleError(f"{path}: missing keys {missing}")
    code = data["code"]
    if not _CODE.match(code) or not path.name.startswith(f"{code}-"):
        raise RuleError(f"{path}: code {code!r} must look like TPU123 and start the file name")
    if path.stem != f"{code}-{data['name']}":
        raise RuleError(f"{path}: file must be named {code}-{data['name']}.toml")
    targets = data.get("targets", {})
    unknown = set(targets) - set(TARGETS)
    if unknown:
        raise RuleError(f"{path}: unknown targets {sorted(unknown)}")
    examples = []
    for raw in data.get("examples", []):
        if "before" not in raw:
            raise RuleError(f"{path}: an example has no 'before'")
        expected = {t: raw[t] for t in TARGETS if t in raw}
        codes = tuple(raw["codes"]) if "codes" in raw else None
        target_codes = {t: tuple(raw[f"codes_{t}"]) for t in TARGETS if f"codes_{t}" in raw}
        examples.append(Example(raw["before"], expected, codes, target_codes))
    code_rule = data.get("engine") not in NON_CODE_ENGINES
    if not examples and code_rule:  # environment checks and run findings have no code
        raise RuleError(f"{path}: a rule needs at least one example (examples are its tests)")
    try:
        severity, fix = Severity(data["severity"]), FixKind(data["fix"])
        for table in targets.values():
            FixKind(table.get("fix", fix.value))
    except ValueError as exc:
        raise RuleError(f"{path}: {exc}") from exc
    known = set(_REQUIRED) | {"targets", "examples", "triggers", "message", "statement_triggers"}
    return Rule(
        code=code,
        name=data["name"],
        severity=severity,
        fix=fix,
        summary=data["summary"].strip(),
        why=data["why"].strip(),
        triggers=tuple(data.get("triggers", ("cuda",) if code_rule else ())),
        targets=targets,
        examples=tuple(examples),
        path=path,
        message=data.get("message", "").strip(),
        extra={k: v for k, v in data.items() if k not in known},
        statement_triggers=tuple(data.get("statement_triggers", ())),
    )


@lru_cache(maxsize=1)
def load_rules() -> dict[str, Rule]:
    """All rules by code, sorted by code."""
    rules: dict[str, Rule] = {}
    for path in sorted(rules_dir().glob("TPU*.toml")):
        rule = _parse(path)
        if rule.code in rules:
            raise RuleError(f"{path}: duplicate code {rule.code} (also {rules[rule.code].path})")
        rules[rule.code] = rule
    return rules


def select_rules(select: list[str] | None, ignore: list[str] | None) -> list[Rule]:
    """Rules whose code starts with a prefix in `select` (all when empty), minus `ignore`."""
    rules = [r for r in load_rules().values() if r.checks_code]
    chosen = [r for r in rules if not select or any(r.code.startswith(p) for p in select)]
    return [r for r in chosen if not any(r.code.startswith(p) for p in (ignore or ()))]


def unknown_prefixes(prefixes: list[str]) -> list[str]:
    codes = load_rules()
    return [p for p in prefixes if not any(code.startswith(p) for code in codes)]
