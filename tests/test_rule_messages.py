"""Every message a migrate rule reports is a template in its rule file (issue 16).

`Transform.say("key", **fields)` reads `[targets.xla.messages]`, or `[targets.torchtpu.messages]`
where TorchTPU words a message otherwise (a key it does not name falls back to xla's). These
tests read the transforms' source with `ast`: every key a rule's code says is in that rule's
table for each target it runs on, and no message text is written in Python any more: what
flows into `report()`, `fix_or_report()` or a field of `say()` (through variables, parameters,
attributes and the helpers that return a message) holds no string literal of words.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import TARGETS, RuleError, engine_messages, load_rules, select_rules

ROOT = Path(__file__).resolve().parent.parent
TRANSFORMS = ROOT / "tpukit" / "migrate" / "transforms"
SHELL = ROOT / "tpukit" / "migrate" / "shell.py"

# Keys said on code paths that only run where the target table maps what they need, which only
# TorchTPU's does: they are in [targets.torchtpu.messages] alone.
TORCHTPU_ONLY = {
    "TPU117": {"why_moved", "why_exported", "internal"},  # `rename`, `moved`, `internal`
    "TPU404": {"spawn"},  # `before`: set_tpu_launch_env before mp.spawn
    "TPU408": {"mode"},  # `drop_modes`
}
# The call-map engine (api_map.py) says its own texts for every rule built on it: they are in
# rules/engines/call-map.toml, which a rule file's key of the same name overrides.
API_MAP = TRANSFORMS / "api_map.py"

# Message text: a space, and a word that is not part of a name or of code (a key, a name, or
# code such as ", torch.arange(" or "xm.optimizer_step(" has none).
_WORD = re.compile(r"(?<![\w.])[A-Za-z]{2,}(?![\w.(])")
# The calls whose argument is a message: name -> (its position in a call, the keyword).
_REPORTS = {"report": (2, "message"), "fix_or_report": (1, "message")}


def _is_text(value) -> bool:
    return isinstance(value, str) and any(c.isspace() for c in value) and bool(_WORD.search(value))


class Source:
    """The functions, classes and assignments of a set of modules, for following what flows
    into a message."""

    def __init__(self, paths: list[Path]) -> None:
        self.modules = {path: ast.parse(path.read_text(encoding="utf-8")) for path in paths}
        self.parent: dict[ast.AST, ast.AST] = {}
        self.module_of: dict[ast.AST, Path] = {}
        self.functions: dict[str, list[ast.FunctionDef]] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.calls: dict[str | None, list[ast.Call]] = {}  # by the name called
        for path, tree in self.modules.items():
            for node in ast.walk(tree):
                for child in ast.iter_child_nodes(node):
                    self.parent[child] = node
                self.module_of[node] = path
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.functions.setdefault(node.name, []).append(node)
                elif isinstance(node, ast.ClassDef):
                    self.classes[node.name] = node
                elif isinstance(node, ast.Call):
                    self.calls.setdefault(_name(node.func), []).append(node)

    def enclosing(self, node: ast.AST, kinds) -> list:
        found = []
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, kinds):
                found.append(node)
        return found

    def hierarchy(self, cls: ast.ClassDef) -> list[ast.ClassDef]:
        """`cls` and its bases that are defined here."""
        out, todo = [], [cls]
        while todo:
            current = todo.pop()
            if current not in out:
                out.append(current)
                todo += [self.classes[b.id] for b in current.bases
                         if isinstance(b, ast.Name) and b.id in self.classes]
        return out


def _name(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _bound(target: ast.expr, value: ast.expr | None, name: str) -> list[ast.expr]:
    """What `target = value` binds to `name` (the matching item of a tuple, else all of it)."""
    if isinstance(target, ast.Name):
        return [value] if target.id == name and value is not None else []
    if isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            return [v for t, v in zip(target.elts, value.elts) for v in _bound(t, v, name)]
        return [value] if any(_bound(t, value, name) for t in target.elts) else []
    return []


class MessageFlow:
    """The literals of words that reach a message. `check(expr, at)` walks an expression that
    is (part of) a message, at the node it stands in: a name is followed to what is assigned to
    it (in its function, the enclosing ones, its module), a parameter to what every caller
    passes, `self.x` to what the class assigns it, a call of a function defined here to what
    it returns. A `say()` call is a message from the rule file: its fields are checked where it
    stands, its key is not text."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.found: list[tuple[Path, int, str]] = []
        self._seen: set = set()

    def check_all(self) -> list[tuple[Path, int, str]]:
        for name, (position, keyword) in _REPORTS.items():
            for call in self.source.calls.get(name, ()):
                self.check_argument(call, position, keyword)
        for call in self.source.calls.get("say", ()):
            for value in [*call.args[1:], *(k.value for k in call.keywords)]:
                self.check(value, call)
        return self.found

    def check_argument(self, call: ast.Call, position: int, keyword: str) -> None:
        """The argument of `call` at `position` (of its positional arguments) or `keyword`."""
        positional = [a for a in call.args if not isinstance(a, ast.Starred)]
        if 0 <= position < len(positional):  # (-1: a method's `self`, the call's receiver)
            self.check(positional[position], call)
        for k in call.keywords:
            if k.arg == keyword:
                self.check(k.value, call)

    def check(self, expr: ast.AST, at: ast.AST) -> None:
        if (id(expr), id(at)) in self._seen:
            return
        self._seen.add((id(expr), id(at)))
        if isinstance(expr, ast.Constant):
            if _is_text(expr.value):
                self._literal(expr, expr.value)
        elif isinstance(expr, ast.JoinedStr):
            for part in expr.values:
                if isinstance(part, ast.Constant) and _is_text(part.value):
                    self._literal(expr, part.value)
                elif isinstance(part, ast.FormattedValue):
                    self.check(part.value, at)
        elif isinstance(expr, ast.Name):
            self._name(expr.id, at)
        elif isinstance(expr, ast.Attribute):
            if isinstance(expr.value, ast.Name) and expr.value.id == "self":
                self._attribute(expr.attr, at)
            else:
                self.check(expr.value, at)
        elif isinstance(expr, ast.Call):
            if _name(expr.func) == "say":
                return  # a message of the rule file's; its fields are checked as they stand
            if isinstance(expr.func, ast.Attribute):
                self.check(expr.func.value, at)  # "...".format(...), "...".join(...)
            for definition in self.source.functions.get(_name(expr.func), ()):
                for node in ast.walk(definition):
                    if isinstance(node, ast.Return) and node.value is not None:
                        self.check(node.value, node)
            for arg in [*expr.args, *(k.value for k in expr.keywords)]:
                self.check(arg, at)
        elif isinstance(expr, ast.Lambda):
            return  # a fix's builder, not its message
        else:
            for child in ast.iter_child_nodes(expr):
                self.check(child, at)

    def _literal(self, node: ast.AST, text: str) -> None:
        self.found.append((self.source.module_of[node], node.lineno, text))

    def _name(self, name: str, at: ast.AST) -> None:
        scopes = self.source.enclosing(at, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for scope in scopes:
            if isinstance(scope, ast.Lambda):
                continue
            params = [a.arg for a in (*scope.args.posonlyargs, *scope.args.args)]
            if name in params:
                # a method is called as `x.method(...)`: its `self` is not in the call
                method = bool(self.source.enclosing(scope, ast.ClassDef)) and params[0] == "self"
                for call in self.source.calls.get(scope.name, ()):
                    self.check_argument(call, params.index(name) - method, name)
                return
            values = self._assigned(scope, name)
            if values:
                for value, where in values:
                    self.check(value, where)
                return
        module = self.source.modules[self.source.module_of[at]]
        for value, where in self._assigned(module, name, top_level=True):
            self.check(value, where)

    def _assigned(self, scope: ast.AST, name: str, top_level: bool = False):
        nodes = scope.body if top_level else ast.walk(scope)
        for node in nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    yield from ((v, node) for v in _bound(target, node.value, name))
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                yield from ((v, node) for v in _bound(node.target, node.value, name))
            elif isinstance(node, (ast.For, ast.comprehension)):
                yield from ((v, node) for v in _bound(node.target, node.iter, name))
            elif isinstance(node, ast.NamedExpr):
                yield from ((v, node) for v in _bound(node.target, node.value, name))

    def _attribute(self, attr: str, at: ast.AST) -> None:
        """`self.attr`: what the class (and its bases here) assigns to it, or holds under it."""
        classes = self.source.enclosing(at, ast.ClassDef)
        for cls in self.source.hierarchy(classes[0]) if classes else ():
            for node in cls.body:
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                        self.check(node.value, node)
            for node in ast.walk(cls):
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        while isinstance(target, ast.Subscript):  # self.attr[key] = value
                            target = target.value
                        if (isinstance(target, ast.Attribute) and target.attr == attr
                                and isinstance(target.value, ast.Name) and target.value.id == "self"):
                            self.check(node.value, node)


def _literals(paths: list[Path]) -> list[tuple[Path, int, str]]:
    return MessageFlow(Source(paths)).check_all()


def _transform_files() -> list[Path]:
    return sorted(p for p in TRANSFORMS.rglob("*.py") if p.name != "__init__.py")


def test_no_transform_writes_message_text_in_python():
    found = _literals(_transform_files())
    assert API_MAP in _transform_files()
    elsewhere = [f"{p.name}:{line}: {text!r}" for p, line, text in found]
    assert not elsewhere, ("message text written in Python; make it a template in the rule "
                           "file's [targets.xla.messages] and say it:\n" + "\n".join(elsewhere))


def test_shell_scan_writes_no_message_text_in_python():
    assert _literals([SHELL]) == []


@pytest.mark.parametrize("case", [
    "direct", "variable", "parameter", "attribute", "helper", "suffix", "field"])
def test_the_check_finds_message_text_wherever_it_flows_from(tmp_path, case):
    # One transform that writes a message in Python, each time by another way in.
    body = {
        "direct": 'self.ctx.report(self.rule, node, f"`{code}` is CUDA", False)',
        "variable": 'message = "x is CUDA"\n        self.fix_or_report(node, message, build)',
        "parameter": 'self._say_it(node, "x is CUDA")',
        "attribute": 'self.fix_or_report(node, self.TEXT, build)',
        "helper": 'self.fix_or_report(node, self._message(), build)',
        "suffix": 'self.fix_or_report(node, self.say("k") + " (not rewritten)", build)',
        "field": 'self.fix_or_report(node, self.say("k", why="it is CUDA"), build)',
    }[case]
    path = tmp_path / "rule.py"
    path.write_text(f'''
class Rule(Transform):
    TEXT = "x is CUDA"

    def leave_Call(self, node, updated):
        code = self.ctx.short(node)
        {body}

    def _say_it(self, node, message):
        self.ctx.report(self.rule, node, message, applied=False)

    def _message(self):
        return "x is CUDA"
''')
    found = _literals([path])
    assert found and all(p == path for p, _, _ in found), found
    # and the same transform, with the rule file's message, passes
    path.write_text(path.read_text().replace(body, 'self.fix_or_report(node, self.say("k", '
                                             'code=code), build)'))
    assert [text for _, _, text in _literals([path]) if "x is CUDA" not in text] == []


# -- every key a rule's code says is in its rule file ------------------------------------------

def _decorated_codes(cls: ast.ClassDef, rules) -> set[str]:
    codes = set()
    for decorator in cls.decorator_list:
        if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name)):
            continue
        words = [a.value for a in decorator.args if isinstance(a, ast.Constant)]
        if decorator.func.id == "transform":
            codes.update(words)
        elif decorator.func.id == "engine":
            codes.update(r.code for r in rules.values() if r.extra.get("engine") in words)
    return codes


def _said_keys() -> dict[str, dict[str, int]]:
    """Rule code -> {key said -> a line that says it}, from the transforms (a class's keys are
    its rules', and a base class's are those of every rule class built on it)."""
    rules = load_rules()
    source = Source([p for p in _transform_files() if p != API_MAP])
    by_class: dict[ast.ClassDef, set[str]] = {
        cls: _decorated_codes(cls, rules) for cls in source.classes.values()}
    for cls in by_class:  # a base's say() runs for the rules of the classes built on it
        for base in source.hierarchy(cls)[1:]:
            by_class[base] |= by_class[cls]
    said: dict[str, dict[str, int]] = {}
    for call in source.calls.get("say", ()):
        if any(f.name == "say" for f in source.enclosing(call, ast.FunctionDef)):
            continue  # Transform.say itself, which passes the key on to Rule.say
        where = f"{source.module_of[call].name}:{call.lineno}"
        key = call.args[0] if call.args else None
        assert isinstance(key, ast.Constant) and isinstance(key.value, str), (
            f"{where}: say()'s key is a literal, so that this test can find it in the rule file")
        assert len(call.args) == 1, f"{where}: say() takes no default text: the rule file has it"
        classes = source.enclosing(call, ast.ClassDef)
        codes = by_class.get(classes[-1], set()) if classes else set()
        assert codes, f"{where}: say({key.value!r}) in code that is no rule's transform"
        for code in codes:
            said.setdefault(code, {}).setdefault(key.value, call.lineno)
    return said


def _targets_run(rule) -> list[str]:
    return [t for t in TARGETS if not rule.skips(t)]


def _missing(rule, target: str, key: str) -> bool:
    return rule.template(target, key) is None


def test_every_key_a_rule_says_is_in_its_rule_file_for_every_target_it_runs_on():
    rules = load_rules()
    said = _said_keys()
    assert len(said) >= 40
    missing = []
    for code, keys in sorted(said.items()):
        rule = rules[code]
        for key, line in sorted(keys.items()):
            only = "torchtpu" if key in TORCHTPU_ONLY.get(code, ()) else None
            for target in _targets_run(rule):
                if (only is None or target == only) and _missing(rule, target, key):
                    missing.append(f"{rule.path.name}: [targets.{target}.messages] has no "
                                   f"'{key}' (said at line {line})")
    assert not missing, "\n".join(missing)


def test_torchtpu_only_keys_are_torchtpus_alone():
    rules = load_rules()
    for code, keys in TORCHTPU_ONLY.items():
        rule = rules[code]
        for key in keys:
            assert key in rule.target("torchtpu").get("messages", {}), (code, key)
            assert key not in rule.target("xla").get("messages", {}), (code, key)


def _run_said_keys() -> dict[str, dict[str, int]]:
    """Rule code -> {key -> line}: the run side's `rule.say(target, KEY, ...)` calls, each in a
    function that takes its rule as `load_rules()["TPU7xx"]`."""
    said: dict[str, dict[str, int]] = {}
    for path in sorted((ROOT / "tpukit" / "run").rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef):
                continue
            codes = {n.slice.value for n in ast.walk(function) if isinstance(n, ast.Subscript)
                     and isinstance(n.slice, ast.Constant) and str(n.slice.value).startswith("TPU")}
            for call in ast.walk(function):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "say" and len(call.args) == 2
                        and all(isinstance(a, ast.Constant) for a in call.args)):
                    for code in codes:
                        said.setdefault(code, {})[call.args[1].value] = call.lineno
    return said


def test_every_key_the_run_says_is_in_its_rule_file():
    rules = load_rules()
    said = _run_said_keys()
    assert said, "no run finding says a message from its rule file"
    for code, keys in said.items():
        for key in keys:
            assert rules[code].template("xla", key) is not None, (code, key)


def test_every_message_in_a_rule_file_is_said():
    """A message no code says is left over (or misspelt: the code says another key)."""
    said = _said_keys()
    for code, keys in _run_said_keys().items():
        said.setdefault(code, {}).update(keys)
    said["TPU414"] = {key: 0 for key in _shell_keys()}
    for rule in load_rules().values():  # a call-map rule may word the engine's keys itself
        if rule.extra.get("engine") == "call-map":
            said.setdefault(rule.code, {}).update(dict.fromkeys(_engine_keys(), 0))
    unsaid = [f"{rule.path.name}: [targets.{t}.messages] {key}"
              for rule in load_rules().values() for t in TARGETS
              for key in rule.target(t).get("messages", {}) if key not in said.get(rule.code, {})]
    assert not unsaid, "\n".join(unsaid)


def test_a_torchtpu_message_differs_from_the_xla_one_it_overrides():
    """TorchTPU's table names only the messages it words otherwise: the same text twice is
    one text in two places."""
    same = [f"{rule.path.name}: {key}" for rule in load_rules().values()
            for key, text in rule.target("torchtpu").get("messages", {}).items()
            if rule.target("xla").get("messages", {}).get(key) == text]
    assert not same, "\n".join(same)


def _engine_keys() -> dict[str, int]:
    """Key -> a line that says it, from api_map.py (the call-map engine)."""
    source = Source([API_MAP])
    said = {}
    for call in source.calls.get("say", ()):
        key = call.args[0] if call.args else None
        assert isinstance(key, ast.Constant) and len(call.args) == 1, f"api_map.py:{call.lineno}"
        said.setdefault(key.value, call.lineno)
    return said


def test_every_key_the_call_map_engine_says_is_in_its_message_file():
    said = _engine_keys()
    assert {"removed", "value", "value_removed", "attribute_name", "import_time"} <= set(said)
    shared = engine_messages("call-map")
    assert set(said) <= set(shared["xla"]), set(said) - set(shared["xla"])
    # and every call-map rule finds each one on every target it runs on
    for rule in load_rules().values():
        if rule.extra.get("engine") == "call-map":
            for target in _targets_run(rule):
                assert [k for k in said if _missing(rule, target, k)] == [], (rule.code, target)


def test_every_message_of_the_engine_file_is_said_and_torchtpu_words_its_own():
    said = _engine_keys()
    shared = engine_messages("call-map")
    for target, messages in shared.items():
        assert set(messages) <= set(said), (target, set(messages) - set(said))
    for key, text in shared["torchtpu"].items():
        assert shared["xla"].get(key) != text, key
        assert "XLA" not in str(text), key  # a message in parts too


def test_a_rule_file_key_wins_over_the_engines_and_a_missing_one_names_the_engine_file():
    rule = load_rules()["TPU407"]
    assert rule.template("xla", "value") == engine_messages("call-map")["xla"]["value"]
    assert rule.template("torchtpu", "value_removed")["cause"].startswith(
        "it has no TorchTPU equivalent")
    own = dataclasses.replace(rule, targets={**rule.targets, "xla": {
        **rule.target("xla"), "messages": {"value": "mine"}}})
    assert own.template("xla", "value") == "mine"
    with pytest.raises(RuleError, match=r"no message 'nope' .* \(nor in rules/engines/"
                                        r"call-map.toml\)"):
        rule.say("xla", "nope")


def test_an_engine_message_file_is_checked_like_a_rule_file(tmp_path, monkeypatch):
    import tpukit.rules as rules

    (tmp_path / "engines").mkdir()
    path = tmp_path / "engines" / "call-map.toml"
    monkeypatch.setattr(rules, "rules_dir", lambda: tmp_path)
    for text, error in [
        ('[targets.xla.messages]\nvalue = "ok"\n[targets.xla.calls]\n',
         r"engines/call-map.toml:3: unknown key 'calls' in \[targets.xla\]"),
        ('[targets.xla.messages]\nvalue = "a {Field}"\n',
         r"engines/call-map.toml:2: targets.xla.messages.value: field 'Field'"),
        ('[targets.tpu.messages]\nvalue = "ok"\n', r"unknown key 'tpu' in \[targets\]"),
    ]:
        path.write_text(text)
        rules._engine_messages.cache_clear()
        with pytest.raises(RuleError, match=error):
            rules.engine_messages("call-map")
    rules._engine_messages.cache_clear()


def _shell_keys() -> set[str]:
    tree = ast.parse(SHELL.read_text(encoding="utf-8"))
    return {call.args[1].value for call in ast.walk(tree) if isinstance(call, ast.Call)
            and _name(call.func) == "say" and len(call.args) > 1
            and isinstance(call.args[1], ast.Constant)}


def test_the_shell_scan_says_keys_of_its_rule_file():
    rule = load_rules()["TPU414"]
    keys = _shell_keys()
    assert keys == {"launch", "per_node"}
    for key in keys:
        for target in TARGETS:
            assert not _missing(rule, target, key), (target, key)


def test_a_key_missing_from_the_rule_file_is_an_error_that_names_the_tables():
    rule = load_rules()["TPU101"]
    with pytest.raises(RuleError, match=r"rules/TPU101-cuda-device.toml: no message 'nope' in "
                                        r"\[targets.torchtpu.messages\] or \[targets.xla.messages\]"):
        rule.say("torchtpu", "nope")
    assert rule.say("torchtpu", "in_choice") == rule.say("xla", "in_choice")  # xla's wording
    assert "TorchTPU" in rule.say("torchtpu", "object", code="x").fix  # its own


# -- the migrate engine's own texts (rules/engines/migrate.toml) --------------------------------
MIGRATE = ROOT / "tpukit" / "migrate"


def _migrate_keys() -> dict[str, str]:
    """Key -> where it is said: `engine_say("migrate", KEY, ...)` calls, and the `where_`/`then_`
    keys guards.py hands to `_put_back` (said into guard_left's fields)."""
    said = {}
    for path in sorted(MIGRATE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and _name(node.func) == "engine_say" \
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == "migrate":
                key = node.args[1]
                if isinstance(key, ast.Constant):
                    said.setdefault(key.value, f"{path.name}:{node.lineno}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"(?:where|then)_[a-z_]+", node.value):
                said.setdefault(node.value, f"{path.name}:{node.lineno}")
    return said


def test_every_key_the_migrate_engine_says_is_in_its_message_file_and_every_one_is_said():
    said = _migrate_keys()
    assert {"guard_left", "where_after", "then_no_loop", "splat_left", "cuda_only_code",
            "why_called_at_import"} <= set(said)
    messages = engine_messages("migrate")["xla"]
    assert [f"{where}: {key}" for key, where in said.items() if key not in messages] == []
    assert sorted(set(messages) - set(said)) == []


def test_a_guards_finding_is_worded_by_the_migrate_message_file(monkeypatch):
    import tpukit.rules as rules

    real = rules.engine_messages("migrate")
    worded = {"xla": {**real["xla"], "guard_left": "LEFT {guard} | {left} | {where} | {then}"}}
    monkeypatch.setattr(rules, "engine_messages",
                        lambda engine: worded if engine == "migrate" else {})
    result = migrate_source("import torch\nfor i in range(torch.cuda.device_count()):\n"
                            "    torch.cuda.get_device_capability(i)\n", "t.py",
                            MigrateOptions(rules=select_rules(None, None)))
    assert any(f.message == ("LEFT torch.cuda.device_count() | torch.cuda.get_device_capability "
                             "|  in the loop it counts | 0 on a TPU, so the loop does not run")
               for f in result.findings), [f.message for f in result.findings]


def test_a_message_in_parts_is_said_one_way_and_a_part_adds_to_it():
    from tpukit.findings import Message

    base = Message("`x.cuda()` -> `x.to(device)`", "XLA has its own device", "moved")
    assert str(base) == "`x.cuda()` -> `x.to(device)`: XLA has its own device. Fix: moved"
    assert str(Message("`x`", fix="port it")) == "`x`. Fix: port it"
    added = base + Message(" (not rewritten)", "it is written to", "port it by hand")
    assert added == Message("`x.cuda()` -> `x.to(device)` (not rewritten)",
                            "XLA has its own device; it is written to", "moved; port it by hand")
    assert added.explanation.cause == "XLA has its own device; it is written to"
    with pytest.raises(TypeError):
        base + " (text)"  # a piece of a message is a Message too


def test_a_call_left_as_it_is_says_its_entrys_cause_and_fix():
    # `instead`, `otherwise` and `gpu_count` written as tables of a cause and a fix (TPU911,
    # TPU407, TPU110): the finding carries both as its explanation
    source = ("import torch\nimport torch.distributed as dist\ntorch.cuda.set_stream(s)\n"
              "dist.barrier(group=g)\nn_gpu = torch.cuda.device_count()\nbatch = 8 * n_gpu\n")
    result = migrate_source(source, "x.py", MigrateOptions(rules=select_rules([], []), target="xla"))
    said = {f.code: f for f in result.findings}
    stream = said["TPU911"]
    assert (stream.explanation.cause, stream.explanation.fix) == ("XLA has no streams", "remove it")
    assert stream.message == "`torch.cuda.set_stream(s)`: XLA has no streams. Fix: remove it"
    assert said["TPU407"].explanation.fix == "keep it, or port it by hand"
    assert said["TPU407"].explanation.cause.endswith("`xm.rendezvous` would wait for every process")
    assert said["TPU110"].explanation.fix == "set it by hand"
    assert said["TPU110"].explanation.cause.startswith("a GPU count")
