"""`tpukit run`'s pieces that need no XLA: the debug-log reader, shape diffs, the analysis."""

from __future__ import annotations

import pytest

from tpukit.findings import Explanation, Finding, Location, Severity, said
from tpukit.rules import load_rules
from tpukit.run.analysis import analyse
from tpukit.run.debuglog import DebugLog, GraphEvent
from tpukit.run.loops import Loops
from tpukit.run.probe import HostRead, Probe, Step
from tpukit.run.shapes import describe, diff, signature

BLOCK = """\
Compilation Analysis: ================================================================================
Compilation Analysis: Compilation Cause
Compilation Analysis:   most likely user code trying to access tensor value before torch_xla.sync
Compilation Analysis: Graph Info: 
Compilation Analysis:   Graph Hash: 30a673416229794a9ef783550d878c2a
Compilation Analysis:   Number of Graph Inputs: 3
Compilation Analysis:   Number of Graph Outputs: 1
Compilation Analysis: Python Frame Triggered Execution: 
Compilation Analysis:   sync (/venv/lib/python3.11/site-packages/torch_xla/torch_xla.py:87)
Compilation Analysis:   <module> (/tmp/train.py:13)
Compilation Analysis: --------------------------------------------------------------------------------
Compilation Analysis: ================================================================================

Computation hash: c7a2bf7c43393bb1159bde537c8798d7

Post Compilation Analysis: ================================================================================
Post Compilation Analysis: Graph input size: 0.000000 GB
Post Compilation Analysis: ================================================================================
"""


def test_debug_log_parses_a_compilation_block(tmp_path):
    path = tmp_path / "debug.txt"
    path.write_text(BLOCK)
    (event,) = DebugLog(path).read_new()
    assert event.kind == "compile"
    assert event.graph_hash == "30a673416229794a9ef783550d878c2a"
    assert event.cause.startswith("most likely user code")
    assert event.frames[-1] == ("<module>", "/tmp/train.py", 13)


def test_debug_log_keeps_a_half_written_block_for_the_next_read(tmp_path):
    path = tmp_path / "debug.txt"
    cut = BLOCK.index("Number of Graph Outputs") + 10  # mid-line, mid-block
    path.write_text(BLOCK[:cut])
    log = DebugLog(path)
    assert log.read_new() == []
    path.write_text(BLOCK + BLOCK.replace("Compilation", "Execution"))
    events = log.read_new()
    assert [e.kind for e in events] == ["compile", "execute"]
    assert events[0].graph_hash == "30a673416229794a9ef783550d878c2a"


def test_shape_diff_names_the_dimension():
    old = {"x": ((16, 52), "int64")}
    new = {"x": ((16, 57), "int64")}
    (change,) = diff(old, new)
    assert describe(change) == "x: [16, 52] -> [16, 57] (dim 1)"


def test_shape_diff_reports_dtype_and_rank_changes():
    dtype = diff({"x": ((4,), "float32")}, {"x": ((4,), "bfloat16")})
    assert describe(dtype[0]) == "x: float32 -> bfloat16"
    rank = diff({"x": ((4,), "float32")}, {"x": ((4, 1), "float32")})
    assert describe(rank[0]) == "x: [4] -> [4, 1] (rank)"
    assert diff({"x": ((4,), "float32")}, {"x": ((4,), "float32")}) == []


def test_signature_walks_tuples_and_dicts():
    class T:
        def __init__(self, *shape):
            self.shape, self.dtype = shape, "torch.float32"

    names = signature((T(2, 3), {"mask": T(2)}), "batch")
    assert names == {"batch[0]": ((2, 3), "float32"), "batch[1]['mask']": ((2,), "float32")}


def _probe_with(steps: list[Step]) -> Probe:
    probe = Probe(None)
    probe.steps = steps
    return probe


def _step(index, *, compiles=0, shapes=None, reads=(), fallbacks=None) -> Step:
    step = Step(index, start=float(index), end=index + 0.5, compiles=compiles,
                shapes=shapes or {}, fallbacks=fallbacks or {})
    step.reads = list(reads)
    step.boundary_at = ("train.py", 40)
    return step


def test_compiles_without_a_debug_log_still_give_a_recompile_finding():
    steps = [_step(1, compiles=1), _step(2), _step(3, compiles=1)]
    analysis = analyse(_probe_with(steps), warmup=2, script="train.py")
    (finding,) = [f for f in analysis.findings if f.code == "TPU701"]
    assert finding.extra["step"] == 3 and finding.location.line == 40
    assert analysis.stats.recompiles_after_warmup == 1


def test_a_read_in_every_step_is_a_warning_and_a_rare_one_is_info():
    every = [HostRead("item", "train.py", 30, 4)]
    steps = [_step(i, reads=every + ([HostRead("cpu", "train.py", 50, 64)] if i == 5 else []))
             for i in range(1, 7)]
    analysis = analyse(_probe_with(steps), warmup=2, script="train.py")
    by_line = {f.location.line: f for f in analysis.findings if f.code == "TPU703"}
    assert by_line[30].severity is Severity.WARNING and by_line[30].extra["per_step"] == 1.0
    assert by_line[50].severity is Severity.INFO
    assert analysis.failures(["sync"]) == ["sync"]


def test_fail_on_names_only_what_happened():
    steps = [_step(i) for i in range(1, 5)]
    analysis = analyse(_probe_with(steps), warmup=2, script="train.py")
    assert analysis.failures(["recompile", "fallback", "sync"]) == []
    assert analysis.stats.steps == 4 and analysis.stats.steady_steps == 2


def test_an_explicit_pjrt_device_wins():
    from tpukit.run.command import choose_device

    env = {"PJRT_DEVICE": "TPU"}
    assert choose_device(env) is None and env == {"PJRT_DEVICE": "TPU"}


def test_without_a_tpu_the_run_goes_to_xla_cpu_with_a_notice(monkeypatch):
    from tpukit.run import command, torchtpu

    monkeypatch.setattr(torchtpu, "glob", lambda pattern: [])
    env: dict = {}
    assert "XLA:CPU" in command.choose_device(env) and env["PJRT_DEVICE"] == "CPU"


def test_with_tpu_chips_and_libtpu_the_run_goes_to_the_tpu(monkeypatch):
    from tpukit.run import command, torchtpu

    monkeypatch.setattr(torchtpu, "glob",
                        lambda pattern: ["/dev/accel0"] if "accel" in pattern else [])
    monkeypatch.setattr(command.importlib.util, "find_spec", lambda name: object())
    env: dict = {}
    assert command.choose_device(env) is None and env["PJRT_DEVICE"] == "TPU"


def _compiling(index: int, **kwargs) -> Step:
    """A step that compiled one new graph at /tmp/train.py:56."""
    step = _step(index, compiles=1, **kwargs)
    step.graphs = [GraphEvent("compile", f"hash{index}", frames=[("fwd", "/tmp/train.py", 56)])]
    return step


def _recompiles(steps: list[Step], models: set[str] = frozenset()) -> tuple[list, object]:
    probe = _probe_with(steps)
    probe.models = set(models)
    analysis = analyse(probe, warmup=2, script="train.py")
    return [f for f in analysis.findings if f.code == "TPU701"], analysis


def test_compiles_that_stop_after_the_first_steps_are_a_long_warm_up_at_info():
    steps = [_compiling(i) for i in range(1, 5)] + [_step(i) for i in range(5, 9)]
    found, analysis = _recompiles(steps, {"DistributedDataParallel"})
    assert [f.extra["step"] for f in found] == [3, 4]
    assert all(f.severity is Severity.INFO and f.extra["warmup_steps"] == 4 for f in found)
    cause = found[0].explanation.cause
    assert "warm-up longer than --warmup 2" in cause and "DistributedDataParallel does this" in cause
    assert "`--warmup 4`" in cause and found[0].explanation.fix == ""
    assert analysis.failures(["recompile"]) == []
    assert analysis.stats.recompiles_after_warmup == 2  # still counted: they happened
    assert analysis.stats.recompiles_in_long_warmup == 2
    plain, _ = _recompiles(steps)
    assert "DistributedDataParallel" not in plain[0].message and plain[0].severity is Severity.INFO


@pytest.mark.parametrize("pattern", [
    "11...1....",  # a quiet gap, then a compile: not warm-up
    "1111..",      # too few quiet steps after the last compile to call it settled
    "1111",        # the run ended while still compiling
])
def test_compiles_that_do_not_settle_stay_warnings(pattern):
    steps = [_compiling(i) if c == "1" else _step(i) for i, c in enumerate(pattern, 1)]
    found, analysis = _recompiles(steps, {"DistributedDataParallel"})
    assert found and all(f.severity is Severity.WARNING for f in found)
    assert not any("warm-up longer" in f.message for f in found)
    assert analysis.failures(["recompile"]) == ["recompile"]
    assert analysis.stats.recompiles_in_long_warmup == 0


def test_compiles_from_data_dependent_fallbacks_are_not_called_warm_up():
    # nonzero's output size follows the data: the compiles stop once each size was seen
    steps = ([_compiling(i, fallbacks={"aten::nonzero": 1}) for i in range(1, 5)]
             + [_step(i, fallbacks={"aten::nonzero": 1}) for i in range(5, 9)])
    found, analysis = _recompiles(steps)
    assert found and all(f.severity is Severity.WARNING for f in found)
    assert all("aten::nonzero" in f.message for f in found)
    assert analysis.stats.recompiles_in_long_warmup == 0


def test_two_graphs_of_one_step_are_not_compared_with_each_other():
    first, second = _compiling(3), GraphEvent("compile", "other", frames=[("f", "/tmp/train.py", 56)])
    first.graphs.append(second)
    first.compiles, first.compile_s = 2, 3.0
    steps = [_compiling(1), _compiling(2), first] + [_step(i) for i in range(4, 6)]
    (found,), _ = _recompiles(steps)  # one cause: one finding for both graphs
    assert found.extra["previous_step"] == 2 and "against step 3's" not in found.message
    assert [g["graph_hash"] for g in found.extra["graphs"]] == ["hash3", "other"]
    assert "2 new graphs for one cause (3.00 s; hashes hash3, other)" in found.message


def test_a_ragged_last_batch_that_recompiles_every_graph_of_its_step_is_one_finding():
    full, ragged = {"batch[0]": ((64, 10), "float32")}, {"batch[0]": ((40, 10), "float32")}
    lines = (56, 61, 70)

    def step(index, shapes, compiles):
        made = _step(index, compiles=len(lines) if compiles else 0, shapes=shapes)
        if compiles:
            made.graphs = [GraphEvent("compile", f"h{index}-{n}", frames=[("f", "/tmp/train.py", n)])
                           for n in lines]
            made.compile_s = 15.8 if index > 1 else 1.0
        return made

    steps = [step(1, full, True)] + [step(i, full, False) for i in range(2, 6)] + [step(6, ragged, True)]
    (found,), analysis = _recompiles(steps)
    assert found.location.line == 56 and found.extra["step"] == 6
    assert "3 new graphs for one cause (15.80 s;" in found.message
    assert "at this line and train.py:61, train.py:70" in found.message
    assert "[64, 10] -> [40, 10]" in found.explanation.cause and "drop_last" in found.explanation.fix
    assert [(g["line"]) for g in found.extra["graphs"]] == [56, 61, 70]
    assert analysis.stats.recompiles_after_warmup == 3


def test_a_shape_change_in_a_long_warm_up_is_still_named():
    shape = {"batch[0]": ((8, 12), "int64")}
    longer = {"batch[0]": ((8, 20), "int64")}
    steps = ([_compiling(1, shapes=shape), _compiling(2, shapes=shape),
              _compiling(3, shapes=longer)] + [_step(i, shapes=longer) for i in range(4, 8)])
    (found,), _ = _recompiles(steps)
    assert found.severity is Severity.WARNING and found.extra["changes"]
    assert "[8, 12] -> [8, 20]" in found.message


# -- --explain-graphs: the HLO difference between two graphs ---------------------------------
def _hlo(*lines: str) -> list:
    from tpukit.run.graphs import parse_graph

    return parse_graph(list(lines))


def _user(path: str) -> bool:
    return path.startswith("/tmp/")


CONST = ('  %c.1 = f32[] constant({value}), metadata={{op_type="prim__Constant" '
         'source_file="/tmp/train.py" source_line=12}}')
MUL = ('  %m.2 = f32[4]{{0}} multiply(f32[4]{{0}} %p0.1, f32[] %c.1), metadata={{op_type="aten__mul" '
       'source_file="/tmp/train.py" source_line={line}}}')


def test_a_constant_that_changed_is_named_with_both_values_and_its_line():
    from tpukit.run.graphs import diff_graphs, fix_for

    diff = diff_graphs(_hlo(CONST.format(value="0.001"), MUL.format(line=13)),
                       _hlo(CONST.format(value="0.002"), MUL.format(line=13)), _user)
    assert (diff.op, diff.kind, diff.line) == ("constant", "changed", 12)
    assert diff.what == "`constant` 0.001 -> 0.002"
    assert "make it a tensor" in fix_for(diff)


def test_an_op_in_one_graph_only_is_named_as_added():
    from tpukit.run.graphs import diff_graphs, fix_for

    before = _hlo(CONST.format(value="2"))
    after = _hlo(CONST.format(value="2"), MUL.format(line=30))
    diff = diff_graphs(before, after, _user)
    assert (diff.op, diff.kind, diff.line) == ("multiply", "added", 30)
    assert "torch.where" in fix_for(diff)
    assert diff_graphs(after, after, _user) is None


def test_a_difference_at_a_user_line_is_preferred_to_one_in_library_code():
    from tpukit.run.graphs import diff_graphs

    library = ('  %s.3 = f32[2]{0} sine(f32[2]{0} %p0.1), metadata={op_type="aten__sin" '
               'source_file="/usr/lib/torch/nn.py" source_line=5}')
    before = _hlo(library.replace("f32[2]", "f32[3]"), CONST.format(value="1"))
    after = _hlo(library, CONST.format(value="5"))
    assert diff_graphs(before, after, _user).line == 12


def test_findings_are_ordered_by_what_they_cost():
    # A host read that waited 3 s outranks a recompile that took 0.5 s; a fallback's own time
    # is not measured, so it comes after both.
    slow = [HostRead("item", "train.py", 30, 4, wait_s=0.5)]
    steps = [_step(i, reads=slow, fallbacks={"aten::nonzero": 1} if i == 4 else None)
             for i in range(1, 7)]
    steps[4] = _compiling(5, reads=slow)
    steps[4].compile_s = 0.5
    analysis = analyse(_probe_with(steps), warmup=2, script="train.py")
    assert [f.code for f in analysis.findings][:2] == ["TPU703", "TPU701"]
    assert analysis.findings[0].extra["wait_s"] == 3.0 and "3.00 s waiting" in analysis.findings[0].message
    assert analysis.stats.host_wait_s == 3.0
    assert [f.code for f in analysis.findings].index("TPU702") == 2


def test_every_run_finding_explains_itself_in_fields_said_one_way():
    # A read every step, a fallback, a recompile: each finding's cause and fix are fields, its
    # message is said from them, and a saved report reads them back.
    slow = [HostRead("item", "train.py", 30, 4, wait_s=0.5)]
    steps = [_step(i, reads=slow, fallbacks={"aten::nonzero": 1} if i == 4 else None)
             for i in range(1, 7)]
    steps[4] = _compiling(5, reads=slow)
    analysis = analyse(_probe_with(steps), warmup=2, script="train.py")
    by_code = {f.code: f for f in analysis.findings}
    assert set(by_code) == {"TPU701", "TPU702", "TPU703"}
    read, fallback = by_code["TPU703"].explanation, by_code["TPU702"].explanation
    assert read.cause == "the host waits for the device every step"
    fixes = {code: load_rules()[code].extra["fixes"] for code in ("TPU702", "TPU703")}
    assert read.fix == fixes["TPU703"]["item"]
    assert fallback.cause.startswith("each call copies tensors to the host")
    assert fallback.fix == fixes["TPU702"]["aten::nonzero"]
    assert "fix" not in by_code["TPU702"].extra and "fix" not in by_code["TPU703"].extra
    for found in analysis.findings:
        why = found.explanation
        assert found.message.endswith(f": {why.cause}" + (f". Fix: {why.fix}" if why.fix else ""))
        again = Finding.from_dict(found.to_dict())
        assert again.explanation == why and again.message == found.message


def test_the_message_convention_says_cause_then_fix_and_leaves_out_what_is_missing():
    why = Explanation("the batch shrank", "drop_last=True", (Location("train.py", 9),))
    assert said("step 6 compiled", why) == "step 6 compiled: the batch shrank. Fix: drop_last=True"
    assert said("step 6 compiled", Explanation("warm-up")) == "step 6 compiled: warm-up"
    assert said("step 6 compiled", Explanation(fix="pad")) == "step 6 compiled. Fix: pad"
    assert Explanation.from_dict(why.to_dict()) == why
    assert why.to_dict()["where"] == [{"path": "train.py", "line": 9}]


def _at(index: int, kind: str, hashes: list[str], line: int) -> Step:
    step = _step(index, compiles=len(hashes) if kind == "compile" else 0)
    step.graphs = [GraphEvent(kind, h, frames=[("f", "/tmp/train.py", line)]) for h in hashes]
    return step


def test_a_lines_first_graph_after_warm_up_is_not_a_recompile_when_nothing_replaces_it():
    # an evaluation (or a log line) that first runs at step 5 and never compiles again
    steps = [_compiling(1), _step(2), _step(3), _step(4), _at(5, "compile", ["eval"], 80),
             _step(6), _at(7, "execute", ["eval"], 80)]
    found, analysis = _recompiles(steps)
    (first,) = found
    assert first.extra["step"] == 5 and first.severity is Severity.INFO
    assert "first ran after warm-up" in first.explanation.cause and "not a recompile" in first.explanation.cause
    assert first.explanation.fix == ""  # nothing to change
    assert analysis.failures(["recompile"]) == []
    assert analysis.stats.recompiles_after_warmup == 0
    assert analysis.stats.first_graphs_after_warmup == 1


def test_a_first_graph_that_a_later_one_replaces_stays_a_recompile_warning():
    steps = [_compiling(1), _step(2), _step(3), _at(4, "compile", ["a"], 80), _at(5, "compile", ["b"], 80)]
    found, analysis = _recompiles(steps)
    assert [f.severity for f in found] == [Severity.WARNING, Severity.WARNING]
    assert analysis.stats.recompiles_after_warmup == 2 and analysis.stats.first_graphs_after_warmup == 0


def test_several_graphs_from_one_line_that_later_steps_run_again_are_no_missing_barrier():
    # torchvision's make_grid reads four values with float(): four graphs cut at one line in
    # the first step, the same four run in every later step
    hashes = ["g1", "g2", "g3", "g4"]
    steps = [_at(1, "compile", hashes, 92)] + [_at(i, "execute", hashes, 92) for i in range(2, 5)]
    found, _ = _recompiles(steps)
    assert not [f for f in found if f.extra.get("kind") == "no-barrier"]
    # one step only (a loop that nothing ends): the finding
    found, _ = _recompiles([_at(1, "compile", hashes, 92)])
    (grew,) = [f for f in found if f.extra.get("kind") == "no-barrier"]
    assert "nothing ends the loop's iterations" in grew.explanation.cause
    assert grew.explanation.fix.startswith("add `torch_xla.sync()`")


def test_several_graphs_from_one_line_that_reads_as_often_are_read_cuts_not_a_missing_barrier():
    # imagenet's ProgressMeter formats four tensors in one f-string each step; here the line
    # also compiles anew in the next step, so the graphs do not simply repeat
    hashes = ["g1", "g2", "g3", "g4"]
    first = _at(1, "compile", hashes, 478)
    first.reads = [HostRead("format", "/tmp/train.py", 478, 4) for _ in hashes]
    first.boundary = "MpDeviceLoader"
    second = _at(2, "compile", ["g5"], 478)
    found, analysis = _recompiles([first, second])
    (cut,) = [f for f in found if f.extra.get("kind") == "read-cut"]
    assert not [f for f in found if f.extra.get("kind") == "no-barrier"]
    assert "read the device 4 time(s) (`format` x4)" in cut.message and "torch.stack" in cut.explanation.fix
    assert cut.fails_on == "sync"
    # a step that nothing ends (the whole loop is one step): the missing barrier, as before
    first.boundary = "end"
    found, _ = _recompiles([first])
    assert [f.extra["kind"] for f in found if f.extra.get("kind")] == ["no-barrier"]


def test_one_cause_over_several_steps_is_one_finding():
    # a batch whose length varies: each step's graph is new, for the same change of dim 1
    def step(index, length):
        made = _step(index, compiles=1, shapes={"batch": ((8, length), "int64")})
        made.graphs = [GraphEvent("compile", f"h{index}", frames=[("f", "/tmp/train.py", 78)])]
        made.compile_s = 0.5
        return made

    steps = [step(1, 10), step(2, 10)] + [step(i, 10 + i) for i in range(3, 8)]
    steps[1].compiles, steps[1].graphs = 0, []
    found, analysis = _recompiles(steps)
    (one,) = found
    assert one.extra["steps"] == [3, 4, 5, 6, 7] and one.extra["compile_s"] == 2.5
    assert one.message.startswith("5 steps (3, 4, 5, 6, 7) recompiled at this line for one cause, "
                                  "5 new graph(s), 2.50 s in all: ")
    why = one.explanation
    assert "step 4: [8, 13] -> [8, 14]" in why.cause and "and 1 more" in why.cause
    assert "6 sizes of dim 1: 10..17" in why.cause and why.fix.startswith("pad dim 1")
    assert one.message.endswith(f": {why.cause}. Fix: {why.fix}")  # the one convention
    assert analysis.stats.recompiles_after_warmup == 5   # the count is unchanged


def test_graphs_a_line_runs_in_every_step_are_said_once_with_what_tells_them_apart(tmp_path):
    # two variants of one step from one line, each compiled once and reused: not recompiles;
    # said once, at info, with the first difference at the user's line (--explain-graphs) or
    # with the line that switches DDP's gradient sync
    from tpukit.run.recompiles import recompile_findings

    graphs = {"a": _hlo(CONST.format(value="2")),
              "b": _hlo(CONST.format(value="2"), MUL.format(line=30))}
    steps = [_at(1, "compile", ["a", "b"], 80)] + [_at(i, "execute", ["a", "b"], 80)
                                                   for i in range(2, 7)]

    def variants(script="train.py", **kwargs):
        found = recompile_findings(steps, Loops(steps, 2), script, **kwargs).findings
        return [f for f in found if f.extra.get("kind") == "variants"]

    (said,) = variants(graphs=graphs)
    assert said.severity is Severity.INFO and said.location.line == 80
    assert said.extra["graph_diff"]["line"] == 30 and "train.py:30" in said.message
    assert "each compiled once and reused" in said.message
    assert variants() == []  # no HLO, no DDP: nothing the step times do not say already
    script = tmp_path / "train.py"
    script.write_text("import torch\n# model.no_sync() is DDP's\nfor batch in data:\n"
                      "    with model.no_sync():\n        loss.backward()\n")
    for step in steps:  # the graphs come from the script's line 5, after the switch
        step.graphs = [GraphEvent(g.kind, g.graph_hash, frames=[("f", str(script), 5)])
                       for g in step.graphs]
    (ddp,) = variants(str(script), models={"DistributedDataParallel"})
    assert ddp.extra["sync_toggle"]["line"] == 4 and "`with model.no_sync():`" in ddp.explanation.cause
    assert [w.line for w in ddp.explanation.where] == [4]
    for step in steps:  # a line before the switch is not one it governs
        step.graphs = [GraphEvent(g.kind, g.graph_hash, frames=[("f", str(script), 3)])
                       for g in step.graphs]
    assert variants(str(script), models={"DistributedDataParallel"}) == []
    for step in steps:
        step.graphs = [GraphEvent(g.kind, g.graph_hash, frames=[("f", "/tmp/train.py", 80)])
                       for g in step.graphs]
    # a line whose graphs differ from step to step is not a fixed set of variants
    steps[4] = _at(5, "execute", ["a"], 80)
    assert variants(graphs=graphs) == []


# -- graph_capture: the graph a barrier or read compiled, tied to the debug log's hash ---------
def test_a_capture_is_tied_to_the_graph_its_line_compiled():
    import sysconfig

    from tpukit.run.graph_capture import GraphCapture

    capture = GraphCapture()
    first, second = _hlo(MUL.format(line=7)), _hlo(MUL.format(line=8))
    capture._ops.update(own1=first, own2=second)
    library = sysconfig.get_paths()["purelib"] + "/torch_xla/torch_xla.py"
    at_sync = [("sync", library, 87), ("<module>", "/tmp/train.py", 20)]
    capture.after((("/tmp/train.py", 20), "own1"), compiled=True)
    capture.after((("/tmp/train.py", 15), "own2"), compiled=False)  # ran a cached graph
    capture.after((("/tmp/train.py", 20), "own2"), compiled=True)
    capture.step_ended([
        GraphEvent("compile", "read", frames=[("item", "/tmp/train.py", 15)]),
        GraphEvent("compile", "a", frames=at_sync), GraphEvent("execute", "a", frames=at_sync),
        GraphEvent("compile", "b", frames=at_sync)], 2)
    # in order, at their own line; the read compiled nothing for its capture
    assert capture.graphs == {"a": first, "b": second}
    capture.step_ended([GraphEvent("compile", "c", frames=at_sync)], 3)
    assert "c" not in capture.graphs  # each capture ties once, in its own step
    # lines (IR debug): in the first steps and the step after one that compiled
    assert capture.wants_lines(3) and capture.wants_lines(4)
    capture.step_ended([GraphEvent("execute", "c", frames=at_sync)], 4)
    assert not capture.wants_lines(5)
    # an evaluation's first graph, from a line that never ran: no recompile
    evaluation = [("<module>", "/tmp/train.py", 30)]
    capture.step_ended([GraphEvent("compile", "e", frames=evaluation)], 5)
    assert capture.wants_lines(6)  # the step after it only
    capture.step_ended([GraphEvent("execute", "c", frames=at_sync)], 6)
    assert not capture.wants_lines(7)
    # a line that ran graphs in 2+ earlier steps compiles again: lines for the rest of the run
    capture.step_ended([GraphEvent("compile", "d", frames=at_sync)], 7)
    capture.step_ended([GraphEvent("execute", "d", frames=at_sync)], 8)
    assert capture.wants_lines(9)


def test_a_capture_that_fails_leaves_the_run_alone(monkeypatch):
    from tpukit.run import graph_capture

    def broken(frame):
        raise RuntimeError("no XLA here")

    monkeypatch.setattr(graph_capture, "held_tensors", broken)
    capture = graph_capture.GraphCapture()
    taken = capture.before_sync(None, ("/tmp/train.py", 20))
    capture.after(taken, compiled=True)
    capture.step_ended([GraphEvent("compile", "h", frames=[("<module>", "/tmp/train.py", 20)])], 1)
    assert taken is None and capture.graphs == {} and capture.seconds >= 0


def test_a_graph_without_lines_is_diffed_by_opcode_at_the_other_graphs_line():
    # one graph lowered with IR debug off (a steady step before any recompile armed it)
    from tpukit.run.graphs import diff_graphs

    lined = _hlo(CONST.format(value="1"), MUL.format(line=13))
    bare = [op.__class__(op.op, op.shape, op.detail.replace("1", "2") if op.op == "constant"
                         else op.detail, "", 0) for op in lined]
    for before, after in ((lined, bare), (bare, lined)):
        difference = diff_graphs(before, after, _user)
        assert difference.kind == "changed" and difference.op == "constant"
        assert (difference.path, difference.line) == ("/tmp/train.py", 12)


def test_a_package_installed_outside_the_interpreter_is_not_the_user_s_code(tmp_path):
    # `pip install --target DEPS torchvision` on PYTHONPATH: torchvision's save_image was
    # named as the script's own line (TPU703 at DEPS/torchvision/utils.py:92)
    from tpukit.run.frames import is_user_file

    deps = tmp_path / "deps"
    (deps / "dep-1.0.dist-info").mkdir(parents=True)
    (deps / "dep-1.0.dist-info" / "RECORD").write_text(
        "dep/__init__.py,sha256=x,0\ndep/utils.py,sha256=y,10\nsix.py,sha256=z,5\n"
        "dep-1.0.dist-info/RECORD,,\n")
    for name in ("dep/__init__.py", "dep/utils.py", "six.py", "train.py", "mine/model.py"):
        (deps / name).parent.mkdir(parents=True, exist_ok=True)
        (deps / name).write_text("")
    other_venv = tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "pkg.py"
    other_venv.parent.mkdir(parents=True)
    other_venv.write_text("")
    assert not is_user_file(str(deps / "dep" / "utils.py"))
    assert not is_user_file(str(deps / "six.py"))
    assert not is_user_file(str(other_venv))
    # what no RECORD lists stays the user's, even beside installed packages
    assert is_user_file(str(deps / "train.py"))
    assert is_user_file(str(deps / "mine" / "model.py"))


def test_xla_cpu_gets_the_compile_flags_and_a_tpu_never_does():
    # the setting benchmarks/xla_cpu_compile.py measured (LLVM -O0: 0.43x-0.55x of the time to
    # the first step on dcgan and ResNet-18, the same losses)
    from tpukit.run.command import xla_cpu_compile_flags

    cpu = {"PJRT_DEVICE": "CPU", "XLA_FLAGS": "--xla_dump_to=/tmp/d"}
    assert xla_cpu_compile_flags(cpu) == "--xla_backend_optimization_level=0"
    assert cpu["XLA_FLAGS"] == "--xla_dump_to=/tmp/d --xla_backend_optimization_level=0"
    tpu = {"PJRT_DEVICE": "TPU"}
    assert xla_cpu_compile_flags(tpu) is None and "XLA_FLAGS" not in tpu
    mine = {"PJRT_DEVICE": "CPU", "XLA_FLAGS": "--xla_backend_optimization_level=3"}
    assert xla_cpu_compile_flags(mine) is None  # the user's own level stays
    off = {"PJRT_DEVICE": "CPU", "TPUKIT_XLA_CPU_FLAGS": "0"}
    assert xla_cpu_compile_flags(off) is None and "XLA_FLAGS" not in off


def test_a_fallback_torch_xla_lowers_on_a_tpu_is_information_off_a_tpu_and_fails_on_one():
    # torch_xla 2.9 runs upsample_nearest2d_backward on the CPU on any device but a TPU (its
    # aten_xla_type.cpp checks the device): on XLA:CPU the finding says nothing is to change
    # for a TPU and does not fail --fail-on fallback; on a TPU it would be the port's.
    steps = [_step(i, fallbacks={"aten::upsample_nearest2d_backward": 2, "aten::nonzero": 1})
             for i in range(1, 5)]
    for device, lowered_fails in (("CPU", False), ("TPU", True)):
        analysis = analyse(_probe_with(steps), warmup=1, script="train.py", device=device)
        by_op = {f.extra["op"]: f for f in analysis.findings if f.code == "TPU702"}
        upsample, nonzero = by_op["aten::upsample_nearest2d_backward"], by_op["aten::nonzero"]
        assert nonzero.fails_on == "fallback" and nonzero.severity is not Severity.INFO
        assert (upsample.fails_on == "fallback") == lowered_fails
        assert (upsample.severity is Severity.INFO) == (not lowered_fails)
        assert ("nothing to change for a TPU" in upsample.explanation.fix) == (not lowered_fails)
        assert analysis.failures(["fallback"]) == ["fallback"]
    only_cpu = [_step(i, fallbacks={"aten::upsample_nearest2d_backward": 2}) for i in range(1, 5)]
    assert analyse(_probe_with(only_cpu), warmup=1, script="train.py",
                   device="CPU").failures(["fallback"]) == []


PARAM = ('  %p.1 = s64[] parameter(0), metadata={{op_type="xla__device_data" '
         'source_file="/tmp/train.py" source_line={line}}}')
FILL = ('  %b.2 = s64[1,1]{{1,0}} broadcast(s64[] %p.1), dimensions={{}}, metadata={{'
        'op_type="aten__expand" source_file="/tmp/train.py" source_line=15}}')


@pytest.mark.parametrize("value,special", [("1", True), ("0", True), ("-1", True), ("2", False)])
def test_a_number_compiled_in_as_a_special_scalar_is_named_with_its_bounded_fix(value, special):
    # `inp.fill_(word_id)` (pytorch-tutorial's sampling loop): torch_xla passes the number as
    # a parameter, but compiles 0, 1 and -1 in as constants (measured on XLA:CPU: fill_ with
    # 5, 7, 3 share a graph, 0, 1, -1 each compile their own)
    from tpukit.run.graphs import diff_graphs, fix_for

    before = _hlo(PARAM.format(line=15), FILL)
    after = _hlo(CONST.format(value=value).replace("f32[]", "s64[]").replace(
        "source_line=12", "source_line=15"), FILL.replace("%p.1", "%c.1"))
    for diff in (diff_graphs(before, after, _user), diff_graphs(after, before, _user)):
        assert (diff.op == "special-scalar") == special
        if special:
            assert diff.line == 15 and f"`constant({value})`" in diff.what
            assert "XLA_NO_SPECIAL_SCALARS=1" in fix_for(diff)
    # a parameter at one line, another line's constant 1 in its place: not one number
    elsewhere = diff_graphs(_hlo(PARAM.format(line=15)), _hlo(CONST.format(value="1")), _user)
    assert elsewhere.op != "special-scalar"


def test_a_special_scalar_gives_way_to_a_change_in_place_but_not_to_renumbered_parameters():
    # the parameter that went renumbers the others (`parameter(1)` -> `parameter(0)`): still
    # the number; with a slice whose bounds changed as well, not (a change each step outranks
    # a bounded variant)
    from tpukit.run.graphs import diff_graphs

    weights = ('  %w.{n} = f32[4]{{0}} parameter({n}), metadata={{op_type="xla__device_data" '
               'source_file="/tmp/train.py" source_line=3}}')
    cut = ('  %s.5 = f32[2]{{0}} slice(f32[4]{{0}} %w.1), slice={{[{start}:{stop}]}}, '
           'metadata={{op_type="xla__select" source_file="/tmp/train.py" source_line=20}}')
    one = CONST.format(value="1").replace("f32[]", "s64[]").replace("line=12", "line=15")
    before = _hlo(PARAM.format(line=15), weights.format(n=1), cut.format(start=0, stop=2))
    after = _hlo(one, weights.format(n=0), cut.format(start=0, stop=2))
    assert diff_graphs(before, after, _user).op == "special-scalar"
    moved = _hlo(one, weights.format(n=0), cut.format(start=2, stop=4))
    assert diff_graphs(before, moved, _user).op != "special-scalar"
