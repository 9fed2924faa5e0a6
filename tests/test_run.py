"""`tpukit run` on XLA:CPU through the real console script: each fixture in fixtures/run/ does
one wrong thing at a known step and line, and the report must name exactly that."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, tpukit_executable

pytest.importorskip("torch_xla")

RUN = FIXTURES / "run"
CPU = {"PJRT_DEVICE": "CPU"}


def line_of(path: Path, text: str) -> int:
    """The 1-based line of `text` in a fixture, so that tests follow edits to the fixture."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def by_code(report: dict, code: str) -> list[dict]:
    return [f for f in report["findings"] if f["code"] == code]


@pytest.fixture(scope="module")
def shape_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("shape")
    proc = subprocess.run(
        [tpukit_executable(), "run", "--json", str(out / "report.json"), "--fail-on", "recompile",
         str(RUN / "shape_change.py"), "--steps", "10"],
        env={**os.environ, "NO_COLOR": "1", **CPU}, capture_output=True, text=True, timeout=300)
    return proc, json.loads((out / "report.json").read_text())


def test_the_script_output_stays_on_stdout_and_the_report_on_stderr(shape_run):
    proc, _ = shape_run
    assert proc.stdout == "done\n"
    assert "tpukit run: " in proc.stderr and "TPU701" in proc.stderr


def test_fail_on_recompile_exits_1(shape_run):
    proc, report = shape_run
    assert proc.returncode == 1, proc.stderr
    assert report["summary"]["failed_on"] == ["recompile"]


def test_a_smaller_batch_is_named_with_its_step_line_and_dim(shape_run):
    _, report = shape_run
    sync_line = line_of(RUN / "shape_change.py", "torch_xla.sync()")
    forward_line = line_of(RUN / "shape_change.py", "loss = torch.nn.functional.cross_entropy")
    (step6,) = [f for f in by_code(report, "TPU701") if f["extra"]["step"] == 6]
    assert step6["line"] == sync_line
    assert step6["extra"]["previous_step"] == 5
    (change,) = step6["extra"]["changes"]
    assert change == {"name": "Tagger.forward(tokens)", "old": [8, 12], "new": [6, 12],
                      "old_dtype": "int64", "new_dtype": "int64", "dims": [0], "line": forward_line}
    why = step6["explanation"]
    assert "[8, 12] -> [6, 12] (dim 0)" in why["cause"] and "drop_last=True" in why["fix"]
    assert step6["message"].endswith(f": {why['cause']}. Fix: {why['fix']}")


def test_padding_to_each_batch_length_recompiles_every_step_on_dim_1(shape_run):
    # one cause over three steps: one finding naming each step and its sizes
    _, report = shape_run
    (padded,) = [f for f in by_code(report, "TPU701") if f["extra"]["step"] >= 8]
    assert padded["extra"]["steps"] == [8, 9, 10]
    by_step = {o["step"]: o for o in padded["extra"]["occurrences"]}
    assert by_step[8]["changes"][0]["old"] == [8, 12] and by_step[8]["changes"][0]["new"] == [8, 20]
    assert padded["explanation"]["cause"].count("step 9: [8, 20] -> [8, 21]") == 1
    assert padded["explanation"]["fix"].startswith("pad dim 1")
    assert padded["message"].startswith("3 steps (8, 9, 10) recompiled at this line for one cause")
    assert all(o["changes"][0]["dims"] == [1] for o in by_step.values())
    assert padded["extra"]["compile_s"] == round(sum(o["compile_s"] for o in by_step.values()), 6)


def test_a_graph_seen_before_is_not_a_recompile(shape_run):
    _, report = shape_run
    steps = {s for f in by_code(report, "TPU701") for s in f["extra"].get("steps", [f["extra"]["step"]])}
    assert 7 not in steps  # step 7 is back to [8, 12]: XLA's cache hit, no compile
    assert report["summary"]["recompiles_after_warmup"] == 4


def test_the_json_report_carries_every_step(shape_run):
    _, report = shape_run
    summary = report["summary"]
    assert summary["steps"] == 10 and summary["warmup"] == 2 and summary["outcome"] == "ok"
    records = summary["step_records"]
    assert [r["step"] for r in records] == list(range(1, 11))
    assert records[5]["shapes"]["Tagger.forward(tokens)"]["shape"] == [6, 12]
    assert records[5]["compiles"] == 1 and len(records[5]["graphs_compiled"]) == 1
    assert records[6]["compiles"] == 0 and records[6]["executions"] >= 1
    assert summary["step_time_median_s"] > 0


@pytest.fixture(scope="module")
def fallback_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fallback")
    proc = subprocess.run(
        [tpukit_executable(), "run", "--format", "github", "--json", str(out / "report.json"),
         "--fail-on", "fallback,sync", str(RUN / "fallback_sync.py"), "--steps", "8"],
        env={**os.environ, "NO_COLOR": "1", **CPU}, capture_output=True, text=True, timeout=300)
    return proc, json.loads((out / "report.json").read_text())


def test_each_cpu_fallback_is_named_at_the_line_that_called_it(fallback_run):
    _, report = fallback_run
    script = RUN / "fallback_sync.py"
    lines = {f["line"] for f in by_code(report, "TPU702") if f["extra"]["op"] == "aten::nonzero"}
    assert line_of(script, "torch.nonzero(labels)") in lines
    assert line_of(script, "logits[logits > 0]") in lines
    finding = by_code(report, "TPU702")[0]
    assert finding["extra"]["per_step"] >= 2 and "torch.where" in finding["explanation"]["fix"]


def test_item_every_step_is_a_host_sync_warning(fallback_run):
    _, report = fallback_run
    (sync,) = by_code(report, "TPU703")
    assert sync["line"] == line_of(RUN / "fallback_sync.py", "total += loss.item()")
    assert sync["severity"] == "warning" and sync["extra"]["method"] == "item"
    assert sync["extra"]["count"] == 8 and sync["extra"]["per_step"] == 1.0
    assert "xm.add_step_closure" in sync["explanation"]["fix"]


def test_mpdeviceloader_iteration_ends_each_step(fallback_run):
    _, report = fallback_run
    records = report["summary"]["step_records"]
    assert len(records) == 8
    assert {r["boundary"] for r in records} == {"MpDeviceLoader"}
    assert records[2]["boundary_at"]["line"] == line_of(RUN / "fallback_sync.py", "in loader:")


def test_recompiles_from_data_dependent_shapes_point_at_the_fallbacks(fallback_run):
    _, report = fallback_run
    found = by_code(report, "TPU701")
    assert found
    for finding in found:
        assert not finding["extra"]["changes"]
        assert "aten::nonzero" in finding["message"]


def test_with_graph_diffs_data_dependent_recompiles_keep_their_cause(tmp_path):
    """The cause is known (sizes from CPU fallbacks): a diff of the two graphs would name
    a constant that is only the symptom, and its fix would be the wrong one."""
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [tpukit_executable(), "run", "--json", str(out), "--explain-graphs",
         str(RUN / "fallback_sync.py"), "--steps", "8"],
        env={**os.environ, "NO_COLOR": "1", **CPU}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = by_code(json.loads(out.read_text()), "TPU701")
    assert found and all("aten::nonzero" in f["message"] and "graph_diff" not in f["extra"]
                         for f in found)


def test_github_format_goes_to_stdout_after_the_script(fallback_run):
    proc, _ = fallback_run
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("mean loss ")
    assert any(line.startswith("::warning file=") and "TPU703" in line for line in lines[1:])


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


STEPS = """\
import sys
import torch
import torch_xla

x = torch.ones(4, device=torch_xla.device())
for step in range(int(sys.argv[1])):
    x = x * 2
    torch_xla.sync()
"""


def test_a_script_raising_inside_a_device_loader_loop_exits_with_its_own_code(tmp_path, run_cli):
    # The loader's worker threads are still alive when the script raises: the run ends with
    # the script's exit 1 after its report (one run aborted in the teardown, exit 134). No
    # worker processes: MpDeviceLoader's thread would fork them while the main thread runs XLA,
    # and a worker forked then can inherit a held lock (one CI run hung on an orphaned worker
    # waiting on a futex, its parent waiting for it); the processes' own exit path has a test
    # of its own (test_a_dataloaders_worker_processes_count_as_loader_workers)
    path = _script(tmp_path, """\
import torch
import torch_xla
import torch_xla.distributed.parallel_loader as pl
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4)
for step, (x,) in enumerate(pl.MpDeviceLoader(loader, torch_xla.device())):
    (x * 2).sum()
    torch_xla.sync()
    if step == 3:
        raise ValueError("bad batch")
""")
    proc = run_cli("run", "--format", "json", path, env=CPU)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "ValueError: bad batch" in proc.stderr
    assert json.loads(proc.stdout)["summary"]["exit_code"] == 1


def test_loader_threads_are_told_apart_by_their_target():
    import threading

    from tpukit.run.command import loader_threads_alive

    stop = threading.Event()

    def worker():
        stop.wait(10)

    assert not loader_threads_alive()
    worker.__module__ = "torch_xla.distributed.parallel_loader"
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    try:
        assert loader_threads_alive()
    finally:
        stop.set()
        thread.join()
    assert not loader_threads_alive()


def test_a_dataloaders_worker_processes_count_as_loader_workers():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from tpukit.run.command import loader_threads_alive

    loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2, num_workers=1)
    iterator = iter(loader)
    next(iterator)
    try:
        assert loader_threads_alive()
    finally:
        iterator._shutdown_workers()
    assert not loader_threads_alive()


def test_script_errors_print_a_clean_traceback_and_keep_the_steps(tmp_path, run_cli):
    path = _script(tmp_path, STEPS + "    if step == 2:\n        raise ValueError('bad batch')\n")
    proc = run_cli("run", "--format", "json", path, "5", env=CPU)
    assert proc.returncode == 1
    assert "Traceback (most recent call last):" in proc.stderr
    assert f'File "{path}", line 10, in <module>' in proc.stderr
    assert "ValueError: bad batch" in proc.stderr
    assert "tpukit" not in proc.stderr.split("Traceback", 1)[1].split("ValueError")[0]
    assert "runpy" not in proc.stderr
    summary = json.loads(proc.stdout)["summary"]
    assert summary["outcome"] == "error" and summary["error"] == "ValueError: bad batch"
    assert summary["steps"] == 3


def test_formatting_a_device_tensor_is_named_as_a_host_read(tmp_path, run_cli):
    # f"{x:.2f}" reads the device through Tensor.__format__ (an AverageMeter's __str__ does)
    path = _script(tmp_path, STEPS + "    print(f'{x.sum():.2f}')\n")
    proc = run_cli("run", "--json", tmp_path / "r.json", path, "5", env=CPU)
    assert proc.returncode == 0, proc.stderr
    (read,) = by_code(json.loads((tmp_path / "r.json").read_text()), "TPU703")
    assert read["line"] == line_of(path, "print(f'{x.sum():.2f}')")
    assert read["extra"]["method"] == "__format__" and read["extra"]["count"] == 5
    assert "`format(tensor)`" in read["message"] and "every N steps" in read["explanation"]["fix"]


def test_sys_exit_code_passes_through(tmp_path, run_cli):
    path = _script(tmp_path, STEPS + "sys.exit(7)\n")
    proc = run_cli("run", "--format", "json", path, "3", env=CPU)
    assert proc.returncode == 7
    assert json.loads(proc.stdout)["summary"]["steps"] == 3


def test_max_steps_ends_the_script_cleanly_and_reports(tmp_path, run_cli):
    path = _script(tmp_path, STEPS + "print('finished all steps')\n")
    proc = run_cli("run", "--max-steps", "4", "--format", "json", path, "50", env=CPU)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)["summary"]
    assert "finished all steps" not in proc.stdout
    assert summary["steps"] == 4 and summary["stopped_early"] and summary["outcome"] == "max-steps"


def test_module_mode_sets_argv_path_and_file_like_python(tmp_path, run_cli):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(
        "import sys, json\nimport torch_xla\n"
        "print(json.dumps({'argv': sys.argv, 'path0': sys.path[0], 'file': __file__, "
        "'name': __name__}))\n")
    proc = run_cli("run", "-m", "pkg.train", "--lr", "3", cwd=tmp_path, env=CPU)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[0])
    assert seen["argv"] == [str(package / "train.py"), "--lr", "3"]
    assert seen["path0"] == str(tmp_path) and seen["name"] == "__main__"


def test_script_mode_sets_argv_path_and_file_like_python(tmp_path, run_cli):
    _script(tmp_path, "import sys, json\nprint(json.dumps({'argv': sys.argv, "
                             "'path0': sys.path[0], 'file': __file__}))\n")
    proc = run_cli("run", "train.py", "--", "--lr", "3", cwd=tmp_path, env=CPU)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[0])
    assert seen == {"argv": ["train.py", "--lr", "3"], "path0": str(tmp_path), "file": "train.py"}
    assert "no TPU here: running on XLA:CPU" not in proc.stderr  # PJRT_DEVICE was set


def test_cuda_idioms_left_in_the_script_are_said_up_front(tmp_path, run_cli):
    path = _script(tmp_path, "import torch\nprint(torch.cuda.is_available())\n")
    proc = run_cli("run", "--format", "json", path, env=CPU)
    assert proc.returncode == 0, proc.stderr
    assert "still has 1 CUDA idiom(s)" in proc.stderr and "tpukit migrate" in proc.stderr
    report = json.loads(proc.stdout.split("\n", 1)[1])
    (finding,) = by_code(report, "TPU704")
    assert finding["line"] == 2
    # the code quoted is the script's own text at the idiom's span
    assert "first at line 2: `torch.cuda.is_available()`)" in finding["message"]


def test_the_cuda_idiom_warning_quotes_the_whole_call_from_the_source(tmp_path):
    from tpukit.run.command import _cuda_finding

    script = tmp_path / "train.py"
    script.write_text("import torch\n" * 135 + "        self.model.cuda()\n")
    # the code is read at the finding's span, not from its message's words
    idioms = [{"code": "TPU102", "line": 136, "col": 9, "end_line": 136, "end_col": 26,
               "message": "`self` moves"}]
    finding = _cuda_finding(str(script), idioms)
    assert "first at line 136: `self.model.cuda()`)" in finding.message
    assert finding.explanation.fix == f"run `tpukit migrate {script}` first"
    unread = _cuda_finding(str(tmp_path / "gone.py"), idioms)
    assert "first at line 136: TPU102)" in unread.message


def _grad_accum(tmp_path, *args) -> dict:
    out = tmp_path / "report.json"
    proc = subprocess.run([tpukit_executable(), "run", "--json", str(out), *args[:-1],
                           str(RUN / "grad_accum.py"), *args[-1]],
                          env={**os.environ, "NO_COLOR": "1", **CPU}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())["summary"]


def test_with_gradient_accumulation_a_step_is_an_optimizer_step(tmp_path):
    summary = _grad_accum(tmp_path, ["--iters", "5", "--accum", "4"])
    records = [r for r in summary["step_records"] if r["complete"]]
    assert summary["steps"] == 5 and len(records) == 5
    assert [r["micro_steps"] for r in records] == [4] * 5  # 4 barriers after a backward
    assert [r["optimizer_steps"] for r in records] == [1] * 5


def test_max_steps_counts_optimizer_steps_not_micro_steps(tmp_path):
    summary = _grad_accum(tmp_path, "--max-steps", "3", ["--iters", "8", "--accum", "4"])
    assert summary["steps"] == 3 and summary["stopped_early"] is True
    assert sum(r["micro_steps"] for r in summary["step_records"]) == 12


def test_without_an_optimizer_every_barrier_ends_a_step(tmp_path):
    # a hand-written update: no optimizer step to wait for
    summary = _grad_accum(tmp_path, ["--iters", "3", "--accum", "2", "--manual"])
    assert summary["steps"] == 9 and all(r["micro_steps"] == 0 for r in summary["step_records"])


def _slice_run(tmp_path, *options) -> list[dict]:
    out = tmp_path / "report.json"
    (tmp_path / "tmp").mkdir(exist_ok=True)  # the run's own temporary folder: its dump goes there
    proc = subprocess.run([tpukit_executable(), "run", "--json", str(out), *options,
                           str(RUN / "slice_offset.py"), "--steps", "6"],
                          env={**os.environ, "NO_COLOR": "1", **CPU,
                               "TMPDIR": str(tmp_path / "tmp")}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return by_code(json.loads(out.read_text()), "TPU701")


@pytest.mark.parametrize("options", [(), ("--explain-graphs",)])
def test_the_slice_and_its_line_are_named_when_no_shape_changed(tmp_path, options):
    # by default from the graphs the barriers capture (graph_capture.py), with
    # --explain-graphs from torch_xla's dump of every graph
    slice_line = line_of(RUN / "slice_offset.py", "chunk = corpus[i:i + bptt]")
    found = _slice_run(tmp_path, *options)
    first = min(found, key=lambda f: f["extra"]["step"])
    assert first["line"] == slice_line  # the slicing line, not the barrier's
    diff = first["extra"]["graph_diff"]
    assert diff["op"] == "slice" and diff["kind"] == "changed" and diff["line"] == slice_line
    step = first["extra"]["step"]  # offsets 10 * (step - 2) -> 10 * (step - 1)
    bounds = f"slice={{[{10 * (step - 2)}:{10 * (step - 1)}], [0:16]}}"
    assert f"{bounds} -> slice={{[{10 * (step - 1)}:{10 * step}], [0:16]}}" in first["explanation"]["cause"]
    # the same fix as migrate's TPU505, for this line's own slice (one compile for every offset)
    assert ("corpus.index_select(0, torch.arange(corpus.size(0))[i:i + bptt].to(corpus.device))"
            in first["explanation"]["fix"])
    assert not list((tmp_path / "tmp").glob("tpukit-graphs-*"))  # the dump is removed


def test_without_graph_diffs_the_finding_says_where_to_look(tmp_path):
    sync_line = line_of(RUN / "slice_offset.py", "torch_xla.sync()")
    found = _slice_run(tmp_path, "--no-graph-diffs")
    assert found and all(f["line"] == sync_line and "graph_diff" not in f["extra"] for f in found)
    assert "look for Python numbers" in found[0]["explanation"]["fix"]


def test_without_source_lines_the_finding_stays_at_the_barrier(tmp_path, monkeypatch):
    # XLA_HLO_DEBUG=0 and XLA_IR_DEBUG=0 set by the user: the graphs carry no Python lines, so
    # the difference is said at the barrier whose graph changed
    monkeypatch.setenv("XLA_HLO_DEBUG", "0")
    monkeypatch.setenv("XLA_IR_DEBUG", "0")
    sync_line = line_of(RUN / "slice_offset.py", "torch_xla.sync()")
    found = _slice_run(tmp_path)
    assert found and all(f["line"] == sync_line for f in found)


@pytest.mark.parametrize("explain", [True, False])
def test_a_loop_with_no_barrier_is_named_with_where_the_barrier_goes(tmp_path, explain):
    script = RUN / "no_barrier.py"
    out = tmp_path / "report.json"
    proc = subprocess.run([tpukit_executable(), "run", "--json", str(out),
                           *(["--explain-graphs"] if explain else []), str(script)],
                          env={**os.environ, "NO_COLOR": "1", **CPU}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (found,) = [f for f in by_code(json.loads(out.read_text()), "TPU701")
                if f["extra"].get("kind") == "no-barrier"]
    assert found["line"] == line_of(script, "{loss.item():.4f}")
    assert "6 different graphs from this line within one step" in found["message"]
    # each read's graph, captured before it ran (graph_capture.py), or the dump's
    sizes = found["extra"]["sizes"]
    assert len(sizes) == 6 and sizes == sorted(sizes) and sizes[0] < sizes[-1]
    assert f"grew from {sizes[0]} to {sizes[-1]} HLO instructions" in found["message"]
    if explain:
        update = line_of(script, "w -= 0.01 * w.grad")
        assert found["explanation"]["fix"] == f"add `torch_xla.sync()` after line {update}, the last of the loop's ops, in each iteration"
    else:
        # the loop ran in the first step, which the fallback tracer watches: its ops carry
        # the tracer's frame, not their line (IR debug is off there); the loop's end is read
        # from the script
        loop = line_of(script, "for iteration in range(args.iters):")
        assert (f"at the end of each iteration: after line {found['line']}, the last line of "
                f"the loop at line {loop}") in found["explanation"]["fix"]


@pytest.mark.parametrize("options", [[], ["--explain-graphs"]])
def test_the_ops_a_step_dependent_branch_adds_are_named(tmp_path, options):
    script = RUN / "branch.py"
    out = tmp_path / "report.json"
    proc = subprocess.run([tpukit_executable(), "run", "--json", str(out), *options,
                           str(script)], env={**os.environ, "NO_COLOR": "1", **CPU},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (found,) = by_code(json.loads(out.read_text()), "TPU701")  # step 4: the branch's graph
    branch = line_of(script, "loss = loss + 0.01 * model.weight.abs().sum()")
    assert found["extra"]["step"] == 4 and found["line"] == branch
    diff = found["extra"]["graph_diff"]
    assert diff["kind"] == "added" and diff["line"] == branch and diff["ops"][0] < diff["ops"][1]
    assert "are new in this graph" in found["explanation"]["cause"] and "`abs`" in found["message"]
    assert "torch.where" in found["explanation"]["fix"]


# A loop that runs until it is stopped: bounded, so a child the test fails to stop still ends
# (~2 min); it says "ready" once torch_xla is up.
ENDLESS = ("import time\nimport torch\nimport torch_xla\n"
           "x = torch.ones(4, device=torch_xla.device())\n"
           "print('ready', flush=True)\n"
           "for _ in range(2400):\n    x = x + 1\n    torch_xla.sync()\n"
           "    time.sleep(0.05)\n")


def _stopped_run(tmp_path, sig, *options, wait=lambda: time.sleep(1.0)):
    """`tpukit run OPTIONS endless.py`, sent `sig` once it is under way; (returncode, out, err)."""
    path = _script(tmp_path, ENDLESS)
    # A shell runs background jobs with SIGINT ignored, and Python installs its KeyboardInterrupt
    # handler only when SIGINT is not ignored: give the child the default, as a terminal would.
    proc = subprocess.Popen([tpukit_executable(), "run", *options, str(path)],
                            env={**os.environ, **CPU}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline() == "ready\n"
        wait()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # never leave the loop running past the test
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def test_ctrl_c_stops_with_a_report_and_exit_130(tmp_path):
    code, out, err = _stopped_run(tmp_path, signal.SIGINT, "--format", "json")
    assert code == 130, err
    summary = json.loads(out)["summary"]
    assert summary["outcome"] == "interrupted" and summary["steps"] >= 2


def test_sigterm_stops_with_a_report_and_exit_143(tmp_path):
    # `timeout`, a CI job's limit and a preempted VM send SIGTERM: the report still comes.
    code, out, err = _stopped_run(tmp_path, signal.SIGTERM, "--format", "json")
    assert code == 143, err
    summary = json.loads(out)["summary"]
    assert summary["outcome"] == "terminated" and summary["error"] == "SIGTERM"
    assert summary["steps"] >= 2 and summary["partial"] is False


def test_sigkill_leaves_the_steps_so_far_readable_with_tpukit_report(tmp_path, run_cli):
    saved = tmp_path / "run.json"

    def steps_written(least=3):
        for _ in range(600):  # the partial report is rewritten as steps end
            if saved.exists() and json.loads(saved.read_text())["summary"]["steps"] >= least:
                return
            time.sleep(0.1)
        raise AssertionError("no partial report with 3 steps in 60 s")

    code, out, err = _stopped_run(tmp_path, signal.SIGKILL, "--json", str(saved),
                                  wait=steps_written)
    assert code == -signal.SIGKILL and "tpukit run" not in err  # no final report: killed
    report = json.loads(run_cli("report", saved, "--format", "json", check_rc=0).stdout)
    summary = report["summary"]
    assert summary["partial"] is True and summary["outcome"] == "running"
    assert summary["steps"] >= 3 and len(summary["step_records"]) == summary["steps"]
    text = run_cli("report", saved, check_rc=0).stdout
    assert "did not finish" in text and "partial: the run did not finish" in text
    assert not list(tmp_path.glob(".run.json.*"))  # no temp file left by the atomic writes


def test_a_missing_script_is_one_line_and_exit_2(tmp_path, run_cli):
    proc = run_cli("run", tmp_path / "nope.py")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"tpukit: error: {tmp_path / 'nope.py'}: no such file"


def test_fail_on_rejects_unknown_kinds(run_cli):
    proc = run_cli("run", "--fail-on", "slow", "x.py")
    assert proc.returncode == 2 and "--fail-on takes recompile,fallback,sync" in proc.stderr


def test_output_file_needs_a_machine_format(run_cli):
    proc = run_cli("run", "-o", "report.txt", "x.py")
    assert proc.returncode == 2 and "-o/--output" in proc.stderr


def test_the_probe_leaves_torch_as_it_found_it():
    import torch
    import torch_xla
    from torch_xla._internal import pjrt

    from tpukit.run.probe import HOST_READS, Probe

    before = {name: torch.Tensor.__dict__.get(name) for name in (*HOST_READS, "to")}
    sync, spawn = torch_xla.sync, pjrt.spawn
    probe = Probe(None)
    probe.install()
    assert torch_xla.sync is not sync and torch.Tensor.item is not before["item"]
    assert pjrt.spawn is not spawn
    probe.uninstall()
    assert torch_xla.sync is sync and pjrt.spawn is spawn
    assert {name: torch.Tensor.__dict__.get(name) for name in before} == before


LAUNCHED = """\
import torch
import torch_xla
import torch_xla.runtime as xr
{import_line}


def train(index, steps):
    w = torch.ones(4, device=torch_xla.device())
    for _ in range(steps):
        w = w * 0.5 + 1
        torch_xla.sync()
    print(f"index {{index}} of {{xr.world_size()}}", flush=True)


if __name__ == "__main__":
    {launch}
"""


@pytest.mark.parametrize("import_line, launch", [
    ("", "torch_xla.launch(train, args=(6,))"),
    ("import torch_xla.distributed.xla_multiprocessing as xmp", "xmp.spawn(train, args=(6,))"),
])
def test_a_launched_function_runs_in_process_so_its_steps_are_seen(tmp_path, run_cli, import_line,
                                                                  launch):
    path = _script(tmp_path, LAUNCHED.format(import_line=import_line, launch=launch))
    proc = run_cli("run", "--json", tmp_path / "r.json", path, env=CPU)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "index 0 of 1\n"
    line = line_of(path, launch)
    assert f"{path}:{line}: the launch runs its function in this process at world size 1" in \
        proc.stderr
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert summary["launches"] == [{"path": str(path), "line": line, "requested": None,
                                    "processes": 1}]
    assert summary["steps"] == 6 and summary["recompiles_after_warmup"] == 0
    assert "launch" in proc.stderr and f"{path.name}:{line} ran in this process" in proc.stderr


def test_a_ddp_trainer_is_observed_through_its_launch_and_its_warm_up_is_not_a_failure(
        tmp_path, run_cli):
    # The migrated DDP fixture: torch_xla.launch at world size 1, DDP's graph changing in its
    # first 3 steps (the reducer rebuilds its buckets), then never again.
    script = FIXTURES / "ddp_spawn" / "xla.py"
    proc = run_cli("run", "--json", tmp_path / "r.json", "--fail-on", "recompile", script,
                   "--epochs", "2", "--out", tmp_path, env=CPU)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert summary["launches"][0]["line"] == line_of(script, "torch_xla.launch(")
    assert summary["steps"] >= 16 and summary["recompiles_after_warmup"] > 0
    assert summary["recompiles_in_long_warmup"] == summary["recompiles_after_warmup"]
    report = json.loads((tmp_path / "r.json").read_text())
    recompiles = by_code(report, "TPU701")
    assert recompiles and all(f["severity"] == "info" for f in recompiles)
    assert all("DistributedDataParallel does this" in f["explanation"]["cause"] for f in recompiles)
    assert {f["extra"]["warmup_steps"] for f in recompiles} == {3}
    assert (tmp_path / "model.pt").exists()


HELD = """
import sys, torch, torch_xla
from tpukit.run.graph_capture import held_tensors
device = torch_xla.device()
model = torch.nn.Linear(4, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model(torch.ones(3, 4, device=device)).sum().backward()
opt.step()
kept = {"losses": [model(torch.ones(1, 4, device=device)).sum()]}
on_cpu = torch.ones(2)
def inner():
    local = torch.zeros(2, device=device)
    return held_tensors(sys._getframe())
held = inner()
ids = [id(t) for t in held]
wanted = [model.weight, model.bias, model.weight.grad, kept["losses"][0],
          opt.state[model.weight]["momentum_buffer"]]
print(all(id(t) in ids for t in wanted), id(on_cpu) in ids, len(ids) == len(set(ids)),
      any(t.shape == (2,) and t.sum().item() == 0 for t in held))
"""


def _printed(tmp_path, source: str) -> list[str]:
    """What a snippet prints (split into words), run on XLA:CPU in a process of its own."""
    script = tmp_path / "snippet.py"
    script.write_text(source)
    proc = subprocess.run([sys.executable, str(script)], env={**os.environ, **CPU},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def test_the_barrier_capture_finds_what_the_users_frames_hold(tmp_path):
    # parameters, gradients and optimizer state through the module and optimizer, a loss in a
    # dict's list, a caller's local; never a CPU tensor, never one twice
    assert _printed(tmp_path, HELD) == ["True", "False", "True", "True"]


KEPT_ALIVE = """
import gc, sys, weakref
import torch, torch_xla
from tpukit.run.graph_capture import GraphCapture, held_tensors
gc.disable()  # the cycle collector would hide a reference cycle
device = torch_xla.device()
model = torch.nn.Linear(4, 2).to(device)
dropped = model(torch.ones(3, 4, device=device)).sum()
ref = weakref.ref(dropped)
held = held_tensors(sys._getframe())
found = any(t is dropped for t in held)
del held, dropped
print(found, ref() is None)
# a tensor with no ops pending is not hashed: hashing gave it a buffer of its own
moved = torch.tensor([1.0, 2.0]).to(device)
before = torch_xla._XLAC._get_xla_tensor_debug_info(moved)
GraphCapture().before_sync(sys._getframe(), ("t.py", 1))
print(torch_xla._XLAC._get_xla_tensor_debug_info(moved) == before)
"""


def test_the_barrier_capture_keeps_no_tensor_alive_and_changes_none(tmp_path):
    # PyTorch-GAN's gan.py compiled a graph more under `tpukit run` (at step 6, when Python's
    # cycle collector ran): the walk was a recursive closure, a reference cycle that kept the
    # tensors it found alive past the script's own references
    assert _printed(tmp_path, KEPT_ALIVE) == ["True", "True", "True"]


def test_the_barrier_capture_adds_no_compile(tmp_path):
    # hashing and lowering the pending graph before the sync must not change what XLA runs
    script = RUN / "slice_offset.py"
    plain = subprocess.run(
        [sys.executable, "-c", ("import runpy, sys; sys.argv = sys.argv[1:]; "
                                "runpy.run_path(sys.argv[0], run_name='__main__'); "
                                "import torch_xla.debug.metrics as met; "
                                "print('COMPILES', met.metric_data('CompileTime')[0])"),
         str(script), "--steps", "5"],
        env={**os.environ, **CPU}, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    out = tmp_path / "report.json"
    probed = subprocess.run([tpukit_executable(), "run", "--json", str(out), str(script),
                             "--steps", "5"], env={**os.environ, "NO_COLOR": "1", **CPU},
                            capture_output=True, text=True, timeout=300)
    assert probed.returncode == 0, probed.stderr
    report = json.loads(out.read_text())
    assert report["summary"]["compiles"] == int(plain.stdout.split("COMPILES")[1].split()[0]) == 5
    assert any("graph_diff" in f["extra"] for f in by_code(report, "TPU701"))



FAKE = """
import torch, torch_xla
from torch._subclasses.fake_tensor import FakeTensorMode
from tpukit.run.graph_capture import GraphCapture
capture = GraphCapture()
with FakeTensorMode():
    fake = torch.empty(2, device="xla")
print(capture.before_read(fake, ("t.py", 1)))
real = torch.ones(2, device=torch_xla.device()) * 2
print(capture.before_read(real, ("t.py", 2)) is not None)
"""


def test_a_fake_tensor_is_never_hashed(tmp_path):
    # torch.compile's tracing reads FakeTensors (varlen_seq_model): `_get_graph_hash` of one
    # aborted the whole run in a CHECK (exit 134)
    assert _printed(tmp_path, FAKE) == ["None", "True"]


def test_a_script_that_compiles_runs_to_its_end_with_graph_diffs(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([tpukit_executable(), "run", "--json", str(out),
                           str(FIXTURES / "varlen_seq_model" / "xla.py"), "--steps", "4"],
                          env={**os.environ, "NO_COLOR": "1", **CPU}, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)  # it saves gru_tagger.pt to "."
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(out.read_text())["summary"]["outcome"] == "ok"


def test_the_script_draws_the_random_numbers_python_would_give_it(tmp_path):
    """A seed set before the script (a sitecustomize, as the corpus harness sets one) reaches
    the script as it would under `python SCRIPT`: tpukit's own imports (rich draws 24 bits at
    import) do not move Python's, NumPy's or torch's global generators."""
    (tmp_path / "sitecustomize.py").write_text(
        "import random\nrandom.seed(0)\nimport numpy\nnumpy.random.seed(0)\n"
        "import torch\ntorch.manual_seed(0)\n")  # unseeded, torch 2.9 seeds itself per process
    script = tmp_path / "draw.py"
    script.write_text("import random, numpy, torch\n"
                      "print('drawn', random.random(), numpy.random.rand(), torch.rand(1).item())\n")
    env = {**os.environ, **CPU, "PYTHONPATH": str(tmp_path), "NO_COLOR": "1"}
    plain = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    run = subprocess.run([tpukit_executable(), "run", "--no-cuda-check", str(script)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    drawn = [line for line in plain.stdout.splitlines() if line.startswith("drawn")]
    assert drawn and drawn == [line for line in run.stdout.splitlines() if line.startswith("drawn")]
