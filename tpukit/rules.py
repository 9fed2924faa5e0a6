"""Loads and validates the rule files in rules/ (one TOML file per rule).

The folder is `rules/` at the top of a source checkout (and an editable install) and
`tpukit/_rules/` inside a wheel, where pyproject.toml's force-include puts it.
"""

from __future__ import annotations

import re
import string
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tpukit.findings import FixKind, Message, Severity

TARGETS = ("xla", "torchtpu")
_CODE = re.compile(r"^TPU\d{3}$")
_REQUIRED = ("code", "name", "severity", "fix", "summary", "why", "reference")
# Rules about the environment (doctor), a running script (run), suppression comments or shell
# scripts (migrate's scan of *.sh files), a port's verification (verify), the runtime layer's
# call sites (shim), not about Python source code.
NON_CODE_ENGINES = ("doctor", "runner", "shell", "shim", "suppress", "verify")


class RuleError(Exception):
    """A rule file is malformed: a bug in tpukit, reported with the file's name."""


# -- the schema of a rule file: every key a rule file may hold, checked at load, so that a typo
# (`remvoe = ...`) is an error at its line instead of a mapping that silently does nothing.
ENGINE_KINDS = ("call-map", "cuda-only-import") + NON_CODE_ENGINES
_TOP_KEYS = frozenset(_REQUIRED) | {"engine", "message", "triggers", "statement_triggers", "targets",
                                    "examples", "needs", "runs_as_written"}
# `runs_as_written = true`: the CUDA code this rule changes runs on a TPU host as written (the
# port is for reproducibility or speed), measured there: `tpukit run` does not count it among
# the idioms that fail on a TPU (TPU704).
_ENGINE_KEYS = {"runner": {"fixes", "lowered_on_tpu"}, "cuda-only-import": {"modules"}}
# A target table (`[targets.xla]`): the keys the transforms read.
_TARGET_KEYS = frozenset({
    "aliases", "attribute", "at_import", "backend", "before", "bucket_view", "calls", "device_type", "drop",
    "drop_modes", "env", "equivalents", "exported", "expression", "fix", "helper", "imports",
    "insert", "instead",
    "internal", "keep_returned", "lowered", "message", "messages", "move_to", "moved", "note", "oom_errors", "remove", "rename",
    "rendezvous_env", "replace", "skip", "world_size",
})
# Of those, the keys any rule's table may hold: what the rule does in words (shown by `tpukit
# rules CODE`) and the settings Rule itself reads (fix, skip, message, messages). Every other key is read by one transform, which declares it (Transform.table_keys):
# check_table_keys refuses a key the rule's own transform does not read, such as another
# rule's key, which the global set above lets through.
DOC_KEYS = frozenset({"replace", "insert", "remove", "instead", "note", "drop"})
RULE_KEYS = frozenset({"fix", "skip", "message", "messages"})
# `[targets.T.calls."torch.cuda.x"]`: one mapped call.
_CALL_KEYS = frozenset({
    "as_device", "as_device_note", "as_type", "as_type_note", "before_launch",
    "before_launch_helper", "before_launch_note", "file_lacks_group", "gpu_count", "helper", "instead",
    "lacking_in_package", "lacking_note", "lacking_statements", "library_keeps", "note",
    "otherwise", "per_process", "per_process_note", "remove", "replace", "statements",
    "value_ok", "when",
})
# A call entry's finding for a call left as it is: a string (`instead`, `otherwise`: the fix;
# `gpu_count`: the cause) or a table of MANUAL_PARTS. It has no `what`: the engine says the call.
MANUAL_KEYS = ("instead", "otherwise", "gpu_count")
MANUAL_PARTS = ("cause", "fix")
# Tables whose keys are names (of messages, modules, variables), each mapped to a string.
_NAME_TABLES = ("moved", "internal", "env")
# The parts of a message written as a table (findings.Message)
MESSAGE_PARTS = ("what", "cause", "fix")
_FIELD = re.compile(r"^[a-z_][a-z0-9_]*$")
_EXAMPLE_KEYS = frozenset({"before", "codes", "left", "owner", "findings"} | set(TARGETS)
                          | {f"{key}_{t}" for t in TARGETS for key in ("codes", "left", "findings")})
# What an example's `findings` entry may say of the findings of one code: a line, whether it was
# applied, its severity, how many there are (0: none), words its message says. Each entry
# needs at least one finding like it (exactly `count`, if given).
FINDING_KEYS = {"code": str, "line": int, "applied": bool, "severity": str, "count": int,
                "says": str}
# Whose code an example is: the user's program (ported whole), or a package's library code
# (`--library-mode`: CUDA-only paths and the package's own choices left as they are).
EXAMPLE_OWNERS = ("program", "library")


def _line_of(text: str, key: str, after: str = "") -> int:
    """The line of `key = ...` in a TOML text (after the line that starts table `after`), 1 if
    not found: tomllib keeps no positions."""
    lines = text.splitlines()
    start = 0
    if after:
        for i, line in enumerate(lines):
            if line.strip().startswith("[") and after in line:
                start = i
                break
    pattern = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\")\s*=")
    # or the header of a table by that name (`[targets.xla.calls]` in a message file)
    header = re.compile(rf"^\s*\[+\s*{re.escape(after + '.' if after else '')}{re.escape(key)}\s*[\].]")
    for i in range(start, len(lines)):
        if pattern.match(lines[i]) or header.match(lines[i]):
            return i + 1
    return 1


def _unknown(path: Path, text: str, keys, known, where: str, table: str = "") -> None:
    import difflib

    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise RuleError(f"{_display(path)}:{_line_of(text, key, table)}: unknown key '{key}' in "
                            f"{where}{hint}")


def check_table_keys(rule: "Rule", reads: frozenset[str], reader: str) -> None:
    """Raise RuleError at the first key of a `[targets.T]` table of `rule` that neither every
    table may hold (DOC_KEYS, RULE_KEYS) nor `reader` (the rule's transform) `reads`."""
    known = DOC_KEYS | RULE_KEYS | reads
    for target, table in rule.targets.items():
        if set(table) <= known:
            continue
        own = ", ".join(sorted(reads)) or "no key of its own"
        _unknown(rule.path, rule.path.read_text(encoding="utf-8"), table, known,
                 f"[targets.{target}]: {reader} reads {own}", f"targets.{target}")


def _display(path: Path) -> str:
    """rules/NAME.toml, rules/engines/NAME.toml: the path as the checkout names it."""
    if path.parent.name == "engines":
        return f"{path.parent.parent.name}/engines/{path.name}"
    return f"{path.parent.name}/{path.name}"


def _template_problem(template) -> str | None:
    """What is wrong with a message template, or None: a string, or a table of MESSAGE_PARTS
    (a message in parts, findings.Message) whose values are strings; its fields are
    `{lowercase_name}`s (filled by Transform.say), and a brace of its text is written `{{` or
    `}}`."""
    if isinstance(template, dict):
        unknown = sorted(set(template) - set(MESSAGE_PARTS))
        if unknown or not template:
            return f"a message table holds {', '.join(MESSAGE_PARTS)} (not {', '.join(unknown)})"
        for part in template.values():
            problem = _template_problem(part) if isinstance(part, str) else "not a string"
            if problem:
                return problem
        return None
    if not isinstance(template, str):
        return "not a string or a table of " + ", ".join(MESSAGE_PARTS)
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"not a template ({exc}); a brace of the text is written {{{{ or }}}}"
    for _, name, spec, conversion in parts:
        if name is not None and (not _FIELD.match(name) or spec or conversion):
            return f"field '{name}' (a field is a {{lowercase_name}}, with no conversion or format)"
    return None


def manual_message(value: str | dict, part: str = "fix") -> Message:
    """A call entry's MANUAL_KEYS value as a Message: a table's parts, or a string as `part`."""
    return Message(**value) if isinstance(value, dict) else Message(**{part: value})


def _manual_problem(value) -> str | None:
    """What is wrong with a MANUAL_KEYS value, or None: a string, or a table of one or both
    MANUAL_PARTS, each a string."""
    if isinstance(value, str):
        return None
    parts = ", ".join(MANUAL_PARTS)
    if not isinstance(value, dict) or not value or not all(isinstance(v, str) for v in value.values()):
        return f"not a string or a table of strings ({parts})"
    unknown = sorted(set(value) - set(MANUAL_PARTS))
    return f"a table holds {parts}, not {', '.join(unknown)}" if unknown else None


def check_schema(path: Path, text: str, data: dict) -> None:
    """Raise RuleError at the first key or value the schema does not know."""
    engine = data.get("engine")
    if engine is not None and engine not in ENGINE_KINDS:
        raise RuleError(f"{_display(path)}:{_line_of(text, 'engine')}: unknown engine {engine!r} "
                        f"(one of {', '.join(ENGINE_KINDS)})")
    _unknown(path, text, data, _TOP_KEYS | _ENGINE_KEYS.get(engine, set()), "the rule")
    for key in ("summary", "why", "message", "reference"):
        if key in data and not isinstance(data[key], str):
            raise RuleError(f"{_display(path)}:{_line_of(text, key)}: '{key}' must be a string")
    if not str(data.get("reference", "https://")).startswith("https://"):
        raise RuleError(f"{_display(path)}:{_line_of(text, 'reference')}: 'reference' must be an "
                        f"https:// address")
    for key in ("triggers", "statement_triggers", "needs"):
        if key in data and not (isinstance(data[key], list) and all(isinstance(w, str) for w in data[key])):
            raise RuleError(f"{_display(path)}:{_line_of(text, key)}: '{key}' must be a list of strings")
    for target, table in data.get("targets", {}).items():
        if not isinstance(table, dict):
            raise RuleError(f"{_display(path)}:{_line_of(text, target)}: targets.{target} must be a table")
        _unknown(path, text, table, _TARGET_KEYS, f"[targets.{target}]", f"targets.{target}")
        for name, call in table.get("calls", {}).items():
            if not isinstance(call, dict):
                raise RuleError(f"{_display(path)}:{_line_of(text, name)}: targets.{target}.calls.{name} "
                                f"must be a table")
            _unknown(path, text, call, _CALL_KEYS, f'[targets.{target}.calls."{name}"]', name)
            for key in MANUAL_KEYS:
                problem = _manual_problem(call[key]) if key in call else None
                if problem:
                    line = _line_of(text, key, f'{target}.calls."{name}"')
                    raise RuleError(f"{_display(path)}:{line}: targets.{target}.calls.{name}.{key}: "
                                    f"{problem}")
        for key in _NAME_TABLES:
            for name, value in table.get(key, {}).items():
                if not isinstance(value, str):
                    raise RuleError(f"{_display(path)}:{_line_of(text, name, key)}: "
                                    f"targets.{target}.{key}.{name} must be a string")
        for name, template in table.get("messages", {}).items():
            problem = _template_problem(template)
            if problem:
                line = _line_of(text, name, f"targets.{target}.messages")
                raise RuleError(f"{_display(path)}:{line}: targets.{target}.messages.{name}: "
                                f"{problem}")
    for example in data.get("examples", []):
        _unknown(path, text, example, _EXAMPLE_KEYS, "[[examples]]")


def _example_findings(path: Path, entries: list) -> tuple[dict, ...]:
    """An example's `findings` entries, each checked against FINDING_KEYS."""
    for entry in entries:
        bad = ({k for k in entry if not isinstance(entry[k], FINDING_KEYS.get(k, ()))}
               if isinstance(entry, dict) else {"(not a table)"})
        if bad or "code" not in entry:
            raise RuleError(f"{path}: an example's findings entry {entry!r}: "
                            + (f"bad keys {sorted(bad)}" if bad else "no 'code'")
                            + f" (keys: {', '.join(FINDING_KEYS)})")
    return tuple(entries)


@dataclass(frozen=True)
class Example:
    before: str
    expected: dict[str, str]  # target -> migrated source; a target absent here is not tested
    codes: tuple[str, ...] | None = None  # exactly the codes reported on `before`, if given
    # `codes_<target>`: the codes on a target where they differ from `codes`
    target_codes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    owner: str = "program"  # one of EXAMPLE_OWNERS
    # exactly the codes of the findings left for a person (not applied), if given; `left_<target>`
    # where a target differs
    left: tuple[str, ...] | None = None
    target_left: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # findings described by code, line, applied, severity, count, says (FINDING_KEYS);
    # `findings_<target>` where a target differs
    findings: tuple[dict, ...] = ()
    target_findings: dict[str, tuple[dict, ...]] = field(default_factory=dict)

    def codes_for(self, target: str) -> tuple[str, ...] | None:
        return self.target_codes.get(target, self.codes)

    def left_for(self, target: str) -> tuple[str, ...] | None:
        return self.target_left.get(target, self.left)

    def findings_for(self, target: str) -> tuple[dict, ...]:
        return self.target_findings.get(target, self.findings)


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: Severity
    fix: FixKind
    summary: str
    why: str
    reference: str  # the public page to read on the rule's subject (SARIF helpUri)
    triggers: tuple[str, ...]  # a file without any of these is not parsed
    targets: dict[str, dict]
    examples: tuple[Example, ...]
    path: Path
    message: str = ""
    extra: dict = field(default_factory=dict)
    # Words a statement must contain to be traversed (default: the triggers).
    statement_triggers: tuple[str, ...] = ()
    # Rules whose rewrites this one's rely on: where a comment suppresses one of them in a
    # file, this rule's findings there are reported, not fixed (engine._held).
    needs: tuple[str, ...] = ()

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

    def maps(self, target: str) -> bool:
        """The target's table maps something: more than the wording of the findings."""
        return any(key != "messages" for key in self.target(target))

    def template(self, target: str, key: str) -> str | None:
        """The template of message `key` on `target`: `[targets.xla.messages]` holds every
        message, `[targets.torchtpu.messages]` the ones TorchTPU words otherwise (a key it
        does not name is xla's there too); then the same two tables of the rule's engine
        (rules/engines/ENGINE.toml: the messages every rule of a data-driven engine shares).
        None where none has it."""
        shared = engine_messages(self.extra.get("engine") or "")
        for messages in (self.target(target).get("messages", {}),
                         self.target("xla").get("messages", {}),
                         shared.get(target, {}), shared.get("xla", {})):
            if key in messages:
                return messages[key]
        return None

    def say(self, target: str, key: str, /, **values) -> str | Message:
        """The message `key` on `target`, its `{fields}` filled from `values`: every text a
        migrate rule reports is a template in its rule file. A key that is not there is a
        RuleError (tests/test_rule_messages.py finds any in the source first)."""
        template = self.template(target, key)
        if template is None:
            tables = " or ".join(f"[targets.{t}.messages]" for t in dict.fromkeys((target, "xla")))
            engine = self.extra.get("engine")
            shared = f" (nor in rules/engines/{engine}.toml)" if engine_messages(engine or "") \
                else ""
            raise RuleError(f"{_display(self.path)}: no message '{key}' in {tables}{shared}")
        return filled(template, values)

    @property
    def checks_code(self) -> bool:
        """A rule about source code (migrate), not about the environment or a run."""
        return self.extra.get("engine") not in NON_CODE_ENGINES


def rules_dir() -> Path:
    return _installed_rules_dir()


@lru_cache(maxsize=None)
def _installed_rules_dir() -> Path:
    """The rules folder beside the package, found once (every catalog read asks for it)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_rules", here.parent / "rules"):
        if candidate.is_dir():
            return candidate
    raise RuleError(f"no rules folder next to {here}")


def _parse(path: Path) -> Rule:
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RuleError(f"{path}: {exc}") from exc
    check_schema(path, text, data)
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
        owner = raw.get("owner", "program")
        if owner not in EXAMPLE_OWNERS:
            raise RuleError(f"{path}: an example's owner is {owner!r}, not one of "
                            f"{', '.join(EXAMPLE_OWNERS)}")
        left = tuple(raw["left"]) if "left" in raw else None
        target_left = {t: tuple(raw[f"left_{t}"]) for t in TARGETS if f"left_{t}" in raw}
        findings = _example_findings(path, raw.get("findings", []))
        target_findings = {t: _example_findings(path, raw[f"findings_{t}"])
                           for t in TARGETS if f"findings_{t}" in raw}
        examples.append(Example(raw["before"], expected, codes, target_codes, owner, left,
                                target_left, findings, target_findings))
    code_rule = data.get("engine") not in NON_CODE_ENGINES
    if not examples and code_rule:  # environment checks and run findings have no code
        raise RuleError(f"{path}: a rule needs at least one example (examples are its tests)")
    try:
        severity, fix = Severity(data["severity"]), FixKind(data["fix"])
        for table in targets.values():
            FixKind(table.get("fix", fix.value))
    except ValueError as exc:
        raise RuleError(f"{path}: {exc}") from exc
    known = set(_REQUIRED) | {"targets", "examples", "triggers", "message", "statement_triggers",
                              "needs"}
    return Rule(
        code=code,
        name=data["name"],
        severity=severity,
        fix=fix,
        summary=data["summary"].strip(),
        why=data["why"].strip(),
        reference=data["reference"],
        triggers=tuple(data.get("triggers", ("cuda",) if code_rule else ())),
        targets=targets,
        examples=tuple(examples),
        path=path,
        message=data.get("message", "").strip(),
        extra={k: v for k, v in data.items() if k not in known},
        statement_triggers=tuple(data.get("statement_triggers", ())),
        needs=tuple(data.get("needs", ())),
    )


# rules/engines/NAME.toml: the data-driven engines' messages, and the migrate engine's own.
MESSAGE_FILES = ENGINE_KINDS + ("migrate",)


def engine_say(engine: str, key: str, /, target: str = "xla", **values) -> str | Message:
    """Message `key` of rules/engines/ENGINE.toml on `target` (xla's where TorchTPU words it
    the same), its `{fields}` filled from `values`; a key the file lacks is a RuleError."""
    messages = engine_messages(engine)
    template = messages.get(target, {}).get(key, messages.get("xla", {}).get(key))
    if template is None:
        raise RuleError(f"rules/engines/{engine}.toml: no message '{key}'")
    return filled(template, values)


def filled(template: str | dict, values: dict) -> str | Message:
    """A template with its `{fields}` filled: a string stays one (a part of another message's
    text), a table of MESSAGE_PARTS is a Message."""
    if isinstance(template, dict):
        return Message(**{part: text.format(**values) for part, text in template.items()})
    return template.format(**values)


def engine_messages(engine: str) -> dict[str, dict[str, str]]:
    """Target -> {key -> template} of rules/engines/ENGINE.toml (the messages an engine's code
    says for every rule built on it), {} where the engine has no such file. Checked like a
    rule file's message tables: a file holds `[targets.T.messages]` tables and nothing else.
    Read once per rules folder: a folder read in passing (a test's) leaves no answer behind."""
    return _engine_messages(rules_dir(), engine)


@lru_cache(maxsize=None)
def _engine_messages(folder: Path, engine: str) -> dict[str, dict[str, str]]:
    path = folder / "engines" / f"{engine}.toml"
    if engine not in MESSAGE_FILES or not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RuleError(f"{path}: {exc}") from exc
    _unknown(path, text, data, {"targets"}, "an engine's message file")
    _unknown(path, text, data.get("targets", {}), set(TARGETS), "[targets]", "targets")
    messages = {}
    for target, table in data.get("targets", {}).items():
        _unknown(path, text, table, {"messages"}, f"[targets.{target}]", f"targets.{target}")
        messages[target] = table.get("messages", {})
        for name, template in messages[target].items():
            problem = _template_problem(template)
            if problem:
                line = _line_of(text, name, f"targets.{target}.messages")
                raise RuleError(f"{_display(path)}:{line}: targets.{target}.messages.{name}: "
                                f"{problem}")
    return messages


@lru_cache(maxsize=1)
def load_rules() -> dict[str, Rule]:
    """All rules by code, sorted by code."""
    rules: dict[str, Rule] = {}
    for path in sorted(rules_dir().glob("TPU*.toml")):
        rule = _parse(path)
        if rule.code in rules:
            raise RuleError(f"{path}: duplicate code {rule.code} (also {rules[rule.code].path})")
        rules[rule.code] = rule
    for name in MESSAGE_FILES:  # rules/engines/: checked with the rule files, not on first use
        engine_messages(name)
    for rule in rules.values():
        unknown = [code for code in rule.needs if code not in rules]
        if unknown:
            raise RuleError(f"{_display(rule.path)}:{_line_of(rule.path.read_text('utf-8'), 'needs')}: "
                            f"'needs' names no rule {unknown[0]}")
    return rules


def select_rules(select: list[str] | None, ignore: list[str] | None) -> list[Rule]:
    """Rules whose code starts with a prefix in `select` (all when empty), minus `ignore`."""
    rules = [r for r in load_rules().values() if r.checks_code]
    chosen = [r for r in rules if not select or any(r.code.startswith(p) for p in select)]
    return [r for r in chosen if not any(r.code.startswith(p) for p in (ignore or ()))]


def unknown_prefixes(prefixes: list[str]) -> list[str]:
    codes = load_rules()
    return [p for p in prefixes if not any(code.startswith(p) for code in codes)]
