"""torch_xla's persistent compilation cache under `tpukit run` (tpukit/run/compile_cache.py):
which folder a run uses, what it reports, and, on XLA:CPU, what the real cache does (written by
the first run, unreadable in the second: the CPU client cannot load executables)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import tpukit_executable

from tpukit.render.run_summary import _cache_text
from tpukit.run import compile_cache as cc


def test_by_default_a_run_keeps_its_graphs_in_the_users_cache_folder(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    choice = cc.choose(env, None, enabled=True, started=False)
    folder = tmp_path / "tpukit" / "xla-compile-cache"
    assert (choice.path, choice.source) == (str(folder), "tpukit")
    assert folder.is_dir()
    # what `xr.initialize_cache(path)` sets: torch_xla reads both at its first graph
    assert env[cc.PATH_VARIABLE] == str(folder) and env[cc.READ_ONLY_VARIABLE] == "0"


def test_the_users_own_cache_variable_is_used_as_it_is(tmp_path):
    env = {cc.PATH_VARIABLE: str(tmp_path / "mine"), cc.READ_ONLY_VARIABLE: "1",
           cc.SETTING_VARIABLE: str(tmp_path / "tpukit's")}
    choice = cc.choose(env, None, enabled=True, started=False)
    assert (choice.path, choice.source, choice.read_only) == (str(tmp_path / "mine"), "user", True)
    assert env[cc.READ_ONLY_VARIABLE] == "1"


def test_the_option_names_the_folder_over_the_variables(tmp_path):
    env = {cc.PATH_VARIABLE: str(tmp_path / "mine"), cc.SETTING_VARIABLE: str(tmp_path / "t")}
    choice = cc.choose(env, str(tmp_path / "given"), enabled=True, started=False)
    assert (choice.path, choice.source) == (str(tmp_path / "given"), "option")
    assert env[cc.PATH_VARIABLE] == str(tmp_path / "given")


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_turned_off_no_cache_variable_reaches_torch_xla(tmp_path, how):
    env = {cc.PATH_VARIABLE: str(tmp_path / "mine"), "XDG_CACHE_HOME": str(tmp_path)}
    if how == "variable":
        env[cc.SETTING_VARIABLE] = "0"
    choice = cc.choose(env, None, enabled=how != "flag", started=False)
    assert (choice.path, choice.source) == (None, "off")
    assert cc.PATH_VARIABLE not in env and not (tmp_path / "tpukit").exists()


def test_a_folder_that_cannot_be_made_turns_the_cache_off_and_says_why(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {cc.SETTING_VARIABLE: str(blocker / "cache")}
    choice = cc.choose(env, None, enabled=True, started=False)
    assert choice.path is None and choice.source == "unwritable"
    assert str(blocker / "cache") in choice.problem and cc.PATH_VARIABLE not in env
    cache = cc.summary(choice, {"hits": 0, "misses": 0, "failures": 0}, 0.0, 0)
    (finding,) = cc.findings(cache, "TPU", "train.py")
    assert finding.code == "TPU711" and "no persistent compilation cache" in finding.message


def test_once_torch_xla_made_its_cache_the_run_reports_what_it_found(tmp_path):
    env = {cc.PATH_VARIABLE: str(tmp_path)}
    choice = cc.choose(env, None, enabled=False, started=True)  # too late to turn it off
    assert (choice.path, choice.source) == (str(tmp_path), "started")
    assert env[cc.PATH_VARIABLE] == str(tmp_path)


def _cache(**counts):
    totals = {"hits": 0, "misses": 0, "failures": 0}
    after = counts.pop("hits_after_warmup", 0)
    totals.update(counts)
    return cc.summary(cc.CacheChoice("/c", "tpukit"), totals, 0.5, after)


def test_unreadable_graphs_are_explained_by_the_device():
    (cpu,) = cc.findings(_cache(failures=3), "CPU", "train.py")
    assert "3 graph(s)" in cpu.message and "XLA:CPU cannot load" in cpu.message
    (tpu,) = cc.findings(_cache(failures=3), "TPU", "train.py")
    assert "XLA:CPU" not in tpu.message and "another torch_xla or libtpu" in tpu.message
    assert tpu.extra["failures"] == 3


def test_graphs_loaded_after_warm_up_say_their_causes_go_unnamed():
    (finding,) = cc.findings(_cache(hits=9, hits_after_warmup=4), "TPU", "train.py")
    assert "4 graph(s) after warm-up were loaded" in finding.message
    assert "--no-compile-cache" in finding.message
    assert cc.findings(_cache(hits=9, misses=2), "TPU", "train.py") == []


def test_the_summary_line_says_where_and_what_the_cache_did():
    assert _cache_text(_cache(hits=2, misses=1, failures=1)) == (
        "/c: 2 loaded (0.50 s), 1 compiled and written, 1 unreadable (compiled again)")
    off = cc.summary(cc.CacheChoice(None, "off"), {"hits": 0, "misses": 0, "failures": 0}, 0, 0)
    assert _cache_text(off) == "off (--no-compile-cache)"


TINY = """\
import torch, torch_xla
d = torch_xla.device()
m = torch.nn.Linear(8, 2).to(d)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(3):
    loss = m(torch.ones(4, 8).to(d)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    torch_xla.sync()
print("done")
"""


def _run(tmp_path: Path, name: str, *options: str, env: dict | None = None) -> dict:
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    report = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [tpukit_executable(), "run", "--json", str(report), *options, str(script)],
        env={**os.environ, "PJRT_DEVICE": "CPU", "NO_COLOR": "1", **(env or {})},
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(report.read_text())


@pytest.mark.xla
def test_on_xla_cpu_the_cache_is_written_then_found_unreadable(tmp_path):
    pytest.importorskip("torch_xla")
    folder = tmp_path / "cache"
    first = _run(tmp_path, "first", "--compile-cache", str(folder))
    cache = first["summary"]["compile_cache"]
    assert (cache["path"], cache["source"]) == (str(folder), "option")
    assert cache["misses"] == first["summary"]["compiles"] >= 1 and cache["failures"] == 0
    assert len(list(folder.iterdir())) == cache["misses"]  # one file per graph compiled
    assert not [f for f in first["findings"] if f["code"] == "TPU711"]
    second = _run(tmp_path, "second", "--compile-cache", str(folder))
    cache = second["summary"]["compile_cache"]
    assert cache["hits"] == 0 and cache["failures"] == first["summary"]["compile_cache"]["misses"]
    assert second["summary"]["compiles"] == first["summary"]["compiles"]  # compiled again
    (finding,) = [f for f in second["findings"] if f["code"] == "TPU711"]
    assert "XLA:CPU cannot load a serialized executable" in finding["message"]


@pytest.mark.xla
def test_no_compile_cache_writes_nothing_even_where_the_variable_asks(tmp_path):
    pytest.importorskip("torch_xla")
    folder = tmp_path / "asked"
    report = _run(tmp_path, "off", "--no-compile-cache",
                  env={cc.PATH_VARIABLE: str(folder)})
    assert report["summary"]["compile_cache"]["source"] == "off"
    assert not folder.exists()
