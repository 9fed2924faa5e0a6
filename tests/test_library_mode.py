"""Library mode's contract (tpukit/migrate/library_mode.py): a package module ported with
--library-mode imports and runs as written wherever the process has not imported the TPU
runtime, and runs the port where it has."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tpukit.migrate import library_mode
from tpukit.migrate.engine import MigrateOptions, MigrationBug, migrate_source
from tpukit.migrate.ownership import Owner
from tpukit.rules import select_rules

LIBRARY = MigrateOptions(rules=select_rules([], []), owner=Owner.LIBRARY)

PACKAGE = '''
import torch

torch.backends.cudnn.benchmark = True


def default_device(device="cuda"):
    return torch.device(device)


def move(x):
    """Moves `x` to the GPU."""
    return x.cuda()


def checked(x):
    if torch.cuda.is_available():
        x = x.cuda()
    return x * 2


def timed(fn):
    out = fn()
    torch.cuda.synchronize()
    return out


class Runner:
    def run(self, x):
        with torch.autocast("cuda", enabled=False):
            y = x.cuda() * 2
        return y
'''

# Runs the package's functions and prints what each returned or raised (type and words).
PROBE = '''
import sys, torch
{block}
import pkg.lib as lib
print("imported torch_xla:", "torch_xla" in sys.modules)
def show(name, call):
    try:
        value = call()
        print(name, "->", getattr(value, "device", value))
    except Exception as exc:
        print(name, "raised", type(exc).__name__, str(exc).splitlines()[0][:60])
show("default_device", lambda: lib.default_device())
show("move", lambda: lib.move(torch.ones(2)))
show("checked", lambda: lib.checked(torch.ones(2)))
show("timed", lambda: lib.timed(lambda: 3))
show("run", lambda: lib.Runner().run(torch.ones(2)))
print("cudnn.benchmark:", torch.backends.cudnn.benchmark)
'''
# No torch_xla in this process, however it is asked for.
BLOCK = '''
class _NoXla:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch_xla":
            raise ImportError("no torch_xla on this host")
sys.meta_path.insert(0, _NoXla())
'''


def _port(tmp_path, source: str = PACKAGE):
    package = tmp_path / "pkg"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    text = textwrap.dedent(source).lstrip("\n")
    return migrate_source(text, str(package / "lib.py"), LIBRARY)


def _probe(folder, block: str) -> str:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": str(folder)}
    proc = subprocess.run([sys.executable, "-c", PROBE.format(block=block)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_ported_library_runs_as_written_without_the_runtime_and_ported_with_it(tmp_path):
    written = tmp_path / "written"
    ported = tmp_path / "ported"
    result = _port(ported)
    assert result.changed
    (ported / "pkg" / "lib.py").write_text(result.new_source)
    (written / "pkg").mkdir(parents=True)
    (written / "pkg" / "__init__.py").write_text("")
    (written / "pkg" / "lib.py").write_text(textwrap.dedent(PACKAGE).lstrip("\n"))
    # without torch_xla: every call returns or raises what the original does
    before = _probe(written, BLOCK)
    assert "move raised" in before and "imported torch_xla: False" in before
    assert _probe(ported, BLOCK) == before
    # importing the port never imports torch_xla, even where it is installed
    assert "imported torch_xla: False" in _probe(ported, "")
    # once the program has imported torch_xla, the port runs on XLA
    on_xla = _probe(ported, "import torch_xla")
    assert "move -> xla:0" in on_xla and "run -> xla:0" in on_xla and "timed -> 3" in on_xla
    assert "checked -> cpu" in on_xla  # the library's own question to the host's CUDA stays
    # the header keeps `device="cuda"` (it runs at import); a call on XLA rebinds the default
    assert "default_device -> xla" in on_xla


def test_library_mode_is_a_fixed_point_and_reports_kept_headers(tmp_path):
    result = _port(tmp_path)
    assert migrate_source(result.new_source, str(tmp_path / "pkg" / "lib.py"),
                          LIBRARY).new_source == result.new_source
    default = next(f for f in result.findings if f.location.line == 6)
    assert default.applied and 'def default_device(device="cuda"):' in result.new_source
    assert ('    if _tpukit_on_xla():\n        if device == "cuda":\n            device = "xla"\n'
            in result.new_source)
    # a default that is not a device's name string stays, and its finding is not applied
    kept = _port(tmp_path / "other", """
        import torch

        def pick(device=torch.device("cuda")):
            return device
        """)
    header = next(f for f in kept.findings if f.location.line == 3)
    assert not header.applied and "keeps a definition's header" in header.message
    assert "import torch_xla" not in result.new_source.split("def default_device")[0]


def test_imports_of_the_runtime_go_inside_the_branches_that_use_them(tmp_path):
    new = _port(tmp_path).new_source
    timed = new.split("def timed")[1].split("class Runner")[0]
    assert timed.index("if _tpukit_on_xla():") < timed.index("import torch_xla.core.xla_model")
    assert "import torch_xla" not in new.split("def _tpukit_on_xla")[0]


def test_a_port_that_would_change_the_written_code_is_refused(tmp_path, monkeypatch):
    # the contract is checked on the output: a confinement that let a rewrite through
    # unconfined leaves the file as it was, with an error at the file
    monkeypatch.setattr(library_mode.Confinement, "pair",
                        lambda self, old, new: [new])
    with pytest.raises(MigrationBug, match="code as written"):
        _port(tmp_path)


def test_the_contract_check_reads_back_the_written_side():
    source = "import torch\nx = torch.zeros(2).cuda()\n"
    good = ("import torch\n\ndef _tpukit_on_xla():\n    return False\n\n"
            "if _tpukit_on_xla():\n    x = torch.zeros(2)\nelse:\n    x = torch.zeros(2).cuda()\n")
    assert library_mode.broken_contract(source, good, "xla", {"_tpukit_on_xla"}) is None
    bad = good.replace("else:\n    x = torch.zeros(2).cuda()", "else:\n    x = torch.zeros(3)")
    assert library_mode.broken_contract(source, bad, "xla", {"_tpukit_on_xla"}) == "line 2"


@pytest.mark.parametrize("target", ["xla", "torchtpu"])
def test_both_targets_confine_to_their_own_runtime(tmp_path, target):
    import dataclasses

    options = dataclasses.replace(LIBRARY, target=target)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    new = migrate_source("import torch\n\n\ndef f(x):\n    return x.cuda()\n",
                         str(package / "lib.py"), options).new_source
    name, module = library_mode.TESTS[target]
    assert f"if {name}():" in new and f'sys.modules.get("{module}")' in new
    compile(new, "lib.py", "exec")


def _confined(tmp_path, source: str) -> str:
    result = _port(tmp_path, source)
    new = result.new_source
    compile(new, "lib.py", "exec")
    assert library_mode.broken_contract(textwrap.dedent(source).lstrip("\n"), new, "xla",
                                        {"_tpukit_on_xla"}) is None
    assert migrate_source(new, str(tmp_path / "pkg" / "lib.py"), LIBRARY).new_source == new
    return new


def test_headers_of_compound_statements_are_chosen_in_place(tmp_path):
    new = _confined(tmp_path, """
        import torch

        def run(model, x, steps):
            for _ in range(steps):
                with torch.cuda.amp.autocast():
                    y = model(x.cuda())
            return y
        """)
    assert ('with (torch.autocast("xla", dtype=torch.bfloat16) if _tpukit_on_xla() else '
            "torch.cuda.amp.autocast()):") in new
    assert "for _ in range(steps):\n" in new  # the loop is not duplicated


def test_an_elif_and_a_try_are_confined_inside(tmp_path):
    new = _confined(tmp_path, """
        import torch

        def place(x, mode):
            if mode == "a":
                x = x.cuda()
            elif mode == "b":
                torch.cuda.synchronize()
            try:
                x = x.cuda()
            except RuntimeError:
                pass
            return x
        """)
    assert 'elif mode == "b":\n        if _tpukit_on_xla():' in new
    assert "    try:\n        if _tpukit_on_xla():" in new


def test_a_module_level_statement_is_confined_at_import(tmp_path):
    new = _confined(tmp_path, """
        import torch
        torch.backends.cudnn.benchmark = True
        x = torch.zeros(2).cuda()
        """)
    assert "if _tpukit_on_xla():\n    x = torch.zeros(2).to(" in new


def test_a_librarys_build_script_is_confined_not_ported_as_a_program(tmp_path):
    # DeepSpeed's setup.py (a script, not a package module) decides which CUDA extensions to
    # build; ported as a program it imported torch_xla at the top and broke `pip install`
    source = ("import torch\nfrom setuptools import setup as build\n"
              "if torch.cuda.is_available():\n    x = torch.zeros(1).cuda()\nbuild(name='x')\n")
    new = migrate_source(source, str(tmp_path / "setup.py"), LIBRARY).new_source
    assert "import torch_xla" not in new.split("def _tpukit_on_xla")[0]
    assert library_mode.broken_contract(source, new, "xla", {"_tpukit_on_xla"}) is None
    # a script of the library that builds nothing (an example) is still a program
    example = migrate_source(source.replace("from setuptools import setup as build\n", "")
                             .replace("build(name='x')\n", ""), str(tmp_path / "ex.py"),
                             LIBRARY).new_source
    assert "_tpukit_on_xla" not in example and ".cuda()" not in example
