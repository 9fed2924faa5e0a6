"""The rule files' schema: an unknown key or a wrong type is an error at its file and line."""

from __future__ import annotations

import ast
import shutil

import pytest

from tpukit.rules import RuleError, _parse, load_rules, rules_dir


def _copy_with(tmp_path, name: str, old: str, new: str):
    source = rules_dir() / name
    text = source.read_text()
    assert old in text
    path = tmp_path / "rules" / name
    path.parent.mkdir()
    path.write_text(text.replace(old, new, 1))
    return path, text.replace(old, new, 1)


def test_every_rule_file_in_the_repository_passes_the_schema():
    assert len(load_rules()) >= 70


def test_a_misspelt_call_key_names_its_file_line_and_the_key_it_meant(tmp_path):
    path, text = _copy_with(tmp_path, "TPU111-cuda-set-device.toml", "\nremove = ", "\nremvoe = ")
    line = text.splitlines().index(next(l for l in text.splitlines() if l.startswith("remvoe"))) + 1
    with pytest.raises(RuleError) as exc:
        _parse(path)
    assert str(exc.value).startswith(f"rules/TPU111-cuda-set-device.toml:{line}: unknown key 'remvoe'")
    assert "did you mean 'remove'?" in str(exc.value)


def test_a_misspelt_top_level_key(tmp_path):
    path, _ = _copy_with(tmp_path, "TPU112-cuda-synchronize.toml", "\ntriggers = ", "\ntrigers = ")
    with pytest.raises(RuleError, match=r"TPU112-cuda-synchronize.toml:12: unknown key 'trigers' in the rule "
                                        r"\(did you mean 'triggers'\?\)"):
        _parse(path)


def test_a_misspelt_target_key_and_an_example_key(tmp_path):
    path, _ = _copy_with(tmp_path, "TPU112-cuda-synchronize.toml", "[[examples]]\nbefore", "[[examples]]\nbefor")
    with pytest.raises(RuleError, match=r"unknown key 'befor' in \[\[examples\]\]"):
        _parse(path)
    shutil.rmtree(tmp_path / "rules")
    path, _ = _copy_with(tmp_path, "TPU303-step-barrier.toml", "[targets.xla]", "[targets.xla]\nsomething = 1")
    with pytest.raises(RuleError, match=r"unknown key 'something' in \[targets.xla\]"):
        _parse(path)


def test_an_examples_owner_is_the_program_or_library_code(tmp_path):
    path, _ = _copy_with(tmp_path, "TPU102-cuda-method.toml", '[[examples]]\nowner = "library"',
                         '[[examples]]\nowner = "vendor"')
    with pytest.raises(RuleError, match=r"TPU102-cuda-method.toml: an example's owner is 'vendor', "
                                        r"not one of program, library"):
        _parse(path)
    owners = {e.owner for rule in load_rules().values() for e in rule.examples}
    assert owners == {"program", "library"}


@pytest.mark.parametrize("entry,problem", [
    ('{ code = "TPU102", lien = 3 }', r"bad keys \['lien'\]"),
    ('{ code = "TPU102", applied = "no" }', r"bad keys \['applied'\]"),
    ('{ line = 3 }', "no 'code'"),
])
def test_an_examples_findings_entry_is_checked(tmp_path, entry, problem):
    path, _ = _copy_with(tmp_path, "TPU102-cuda-method.toml", '[[examples]]\nowner = "library"',
                         f'[[examples]]\nfindings = [{entry}]\nowner = "library"')
    with pytest.raises(RuleError, match=rf"TPU102-cuda-method.toml: an example's findings entry .*{problem}"):
        _parse(path)


def test_a_library_example_runs_as_library_code():
    # the same source as a library example and as the program's: a library module that
    # imports a CUDA-only package is left as it is, the program's is ported
    from test_rules import migrated

    from tpukit.rules import Example

    source = "import torch\nimport triton\nx = torch.zeros(2).cuda()\n"
    as_library = migrated(Example(source, {}, owner="library"), "xla", source)
    as_program = migrated(Example(source, {}), "xla", source)
    assert as_library.new_source == source and ".cuda()" not in as_program.new_source


def test_each_table_holds_only_what_its_own_transform_reads():
    from tpukit.migrate.transforms.base import check_tables  # (it registers every transform)

    check_tables(load_rules().values())  # the repository's rules: no RuleError


def test_another_rules_key_is_refused_at_its_line(tmp_path):
    # `bucket_view` is TPU402's key: the global set of target keys knows it, CudaMethod does not
    from tpukit.migrate.transforms.base import check_tables

    path, text = _copy_with(tmp_path, "TPU102-cuda-method.toml", '[targets.xla]\n',
                            '[targets.xla]\nbucket_view = true\n')
    rule = _parse(path)  # the schema of all rule files lets it through
    line = text.splitlines().index("bucket_view = true") + 1
    with pytest.raises(RuleError, match=rf"^rules/TPU102-cuda-method.toml:{line}: unknown key "
                                        r"'bucket_view' in \[targets.xla\]: CudaMethod .* reads no key "
                                        r"of its own"):
        check_tables([rule])


def test_every_key_a_transform_reads_from_its_table_is_declared():
    """The declarations cannot go stale: a literal key a transform module reads from its
    table (`self.mapping["k"]`, `self.mapping.get("k")`) is in its class's table_keys."""
    import inspect
    import sys

    import tpukit.migrate.engine  # noqa: F401
    from tpukit.migrate.transforms.base import ENGINES, TRANSFORMS
    from tpukit.rules import DOC_KEYS, RULE_KEYS

    def read(tree) -> set[str]:
        keys = set()
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Subscript) and _is_mapping(node.value):
                key = node.slice
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "get" and _is_mapping(node.func.value) and node.args):
                key = node.args[0]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                keys.add(key.value)
        return keys

    checked = 0
    for cls in {*TRANSFORMS.values(), *ENGINES.values()}:
        tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
        undeclared = read(tree) - cls.table_keys - DOC_KEYS - RULE_KEYS
        assert not undeclared, f"{cls.__name__} reads {sorted(undeclared)} without declaring them"
        checked += bool(cls.table_keys)
    assert checked >= 10


def _is_mapping(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "mapping"


def test_an_unknown_engine_and_a_wrong_type(tmp_path):
    path, _ = _copy_with(tmp_path, "TPU112-cuda-synchronize.toml", 'engine = "call-map"', 'engine = "cal-map"')
    with pytest.raises(RuleError, match=r"TPU112-cuda-synchronize.toml:13: unknown engine 'cal-map'"):
        _parse(path)
    shutil.rmtree(tmp_path / "rules")
    path, _ = _copy_with(tmp_path, "TPU112-cuda-synchronize.toml", 'triggers = ["cuda"]', 'triggers = "cuda"')
    with pytest.raises(RuleError, match=r":12: 'triggers' must be a list of strings"):
        _parse(path)


def test_every_rule_names_a_public_page_and_sarif_and_explain_link_it():
    import io
    import json

    from rich.console import Console

    from tpukit.explain import explain, rules_json

    for rule in load_rules().values():
        assert rule.reference.startswith("https://"), rule.code
    rule = load_rules()["TPU303"]
    out = io.StringIO()
    explain(rule, Console(file=out, width=200))
    assert f"Read: {rule.reference}" in out.getvalue()
    listing = io.StringIO()
    rules_json([rule], listing)
    assert json.loads(listing.getvalue())[0]["reference"] == rule.reference


def test_a_reference_that_is_not_https_is_refused(tmp_path):
    path, _ = _copy_with(tmp_path, "TPU112-cuda-synchronize.toml", 'reference = "https://', 'reference = "http://')
    with pytest.raises(RuleError, match=r"TPU112-cuda-synchronize.toml:6: 'reference' must be an https:// address"):
        _parse(path)


def test_a_message_is_a_template_of_named_fields(tmp_path):
    for broken, problem in (('"`{code` is a CUDA device', r"not a template"),
                            ('"`{0}` is a CUDA device', r"field '0'"),
                            ('"`{code!r}` is a CUDA device', r"field 'code'")):
        path, text = _copy_with(tmp_path, "TPU101-cuda-device.toml",
                                'object = { what = "`{code}` is a CUDA device',
                                f"object = {{ what = {broken}")
        line = next(n for n, l in enumerate(text.splitlines(), 1) if l.startswith("object ="))
        with pytest.raises(RuleError, match=rf"^rules/TPU101-cuda-device.toml:{line}: "
                                            rf"targets.xla.messages.object: {problem}"):
            _parse(path)
        shutil.rmtree(tmp_path / "rules")


# TPU911's first `instead` (torch.cuda.set_stream on xla)
_STREAMS_INSTEAD = 'instead = { cause = "XLA has no streams", fix = "remove it" }'


@pytest.mark.parametrize("table,problem", [
    ('{ what = "a stream", fix = "remove it" }', r"a table holds cause, fix, not what"),
    ('{ cause = "XLA has no streams", fix = 1 }', r"not a string or a table of strings"),
    ("{}", r"not a string or a table of strings"),
])
def test_an_instead_table_holds_a_cause_and_a_fix_as_strings(tmp_path, table, problem):
    path, text = _copy_with(tmp_path, "TPU911-cuda-only-streams.toml", _STREAMS_INSTEAD,
                            f"instead = {table}")
    line = text.splitlines().index(f"instead = {table}") + 1
    with pytest.raises(RuleError, match=rf"^rules/TPU911-cuda-only-streams.toml:{line}: "
                                        rf"targets.xla.calls.torch.cuda.set_stream.instead: {problem}"):
        _parse(path)


def test_an_instead_table_of_one_part_loads_as_that_part(tmp_path):
    from tpukit.findings import Message
    from tpukit.rules import manual_message

    path, _ = _copy_with(tmp_path, "TPU911-cuda-only-streams.toml", _STREAMS_INSTEAD,
                         'instead = { fix = "remove it" }')
    entry = _parse(path).target("xla")["calls"]["torch.cuda.set_stream"]
    assert manual_message(entry["instead"]) == Message(fix="remove it")


def test_explain_says_an_instead_table_as_its_cause_and_fix():
    import io

    from rich.console import Console

    from tpukit.explain import explain

    out = io.StringIO()
    explain(load_rules()["TPU911"], Console(file=out, width=400))
    assert "torch.cuda.set_stream(...) finding: XLA has no streams. Fix: remove it" in out.getvalue()


def test_needs_names_rules_that_exist(tmp_path, monkeypatch):
    import tpukit.rules as rules

    for source in sorted(rules_dir().glob("TPU20[13]-*.toml")):
        (tmp_path / source.name).write_text(source.read_text(encoding="utf-8").replace(
            'needs = ["TPU201"]', 'needs = ["TPU299"]'), encoding="utf-8")
    monkeypatch.setattr(rules, "rules_dir", lambda: tmp_path)
    rules.load_rules.cache_clear()
    try:
        with pytest.raises(RuleError, match=r"TPU203-grad-scaler.toml:\d+: 'needs' names no rule "
                                            r"TPU299"):
            rules.load_rules()
    finally:
        monkeypatch.undo()
        rules.load_rules.cache_clear()
    assert load_rules()["TPU203"].needs == ("TPU201",)
