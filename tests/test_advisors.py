"""The advisors and the profile summary, on hand-made records (no XLA): bucket advice from
step shapes, head-dim numbers, xprof table parsing, --profile-steps, and the run's usage errors."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import tpukit_executable

from tpukit.run.advisors import bucket_findings, head_dim_findings, head_dim_numbers
from tpukit.run.analysis import Loops
from tpukit.run.attention import CONFIG, SDPA, AttentionSite, config_heads
from tpukit.run.probe import Step
from tpukit.run.profile import parse_steps, viewer_commands
from tpukit.run.xprof_summary import PYTHON_TIME, device_ops, host_ops, steps, top


def _step(index: int, length: int, batch: int = 8, compiles: int = 1) -> Step:
    step = Step(index, start=float(index), end=index + 0.5, compiles=compiles)
    step.shapes = {"batch[0]": ((batch, length), "int64"), "batch[1]": ((batch, length), "int64"),
                   "Model.forward(x)": ((batch, length), "int64")}
    step.origins = dict.fromkeys(step.shapes, ("train.py", 30))
    step.boundary_at = ("train.py", 40)
    return step


def test_bucket_advice_for_a_varying_sequence_dim():
    lengths = [10, 12, 30, 31, 50, 12, 10, 64, 30, 11]
    steps = [_step(i, n) for i, n in enumerate(lengths, 1)]
    (finding,) = bucket_findings(steps, Loops(steps, 2), budget=3, script="train.py")
    extra = finding.extra
    assert finding.code == "TPU706" and finding.location.line == 30
    assert [i["name"] for i in extra["inputs"]][0] == "batch[0]"  # the DataLoader batch first
    assert {i["name"] for i in extra["inputs"]} == {"batch[0]", "batch[1]", "Model.forward(x)"}
    assert extra["distinct_sizes"] == 7 and extra["compiles_with_buckets"] == 3
    assert extra["buckets"] == [12, 31, 64]
    # per step: 10->12, 12, 30->31, 31, 50->64, 12, 10->12, 64, 30->31, 11->12 (every input is
    # [8, n], so the ratio is the same in elements)
    padded = [2, 0, 1, 0, 14, 0, 2, 0, 1, 1]
    assert extra["padding_overhead"] == round(sum(padded) / sum(lengths), 4)
    assert "BucketCollate([12, 31, 64], dim=0)" in extra["snippet"]
    assert extra["by_budget"][3]["buckets"] == [12, 31, 64]


def test_no_bucket_advice_within_the_budget():
    steps = [_step(i, n) for i, n in enumerate([16, 32, 16, 32, 16], 1)]
    assert bucket_findings(steps, Loops(steps, 2), budget=4, script="train.py") == []


def test_no_bucket_advice_when_the_sizes_do_not_drive_compiles():
    steps = [_step(i, n, compiles=0) for i, n in enumerate([10, 12, 30, 31, 50, 64], 1)]
    assert bucket_findings(steps, Loops(steps, 2), budget=2, script="train.py") == []


def test_a_forward_input_alone_gets_pad_to_bucket():
    steps = []
    for i, n in enumerate([5, 6, 7, 8, 9, 10], 1):
        step = Step(i, start=float(i), end=i + 0.5, compiles=1)
        step.shapes = {"Net.forward(x)": ((4, 3, n), "float32")}
        steps.append(step)
    (finding,) = bucket_findings(steps, Loops(steps, 2), budget=2, script="train.py")
    assert finding.extra["inputs"] == [{"name": "Net.forward(x)", "dim": 2}]
    assert "pad_to_bucket(x, 2, " in finding.extra["snippet"]


def _site(**kw) -> AttentionSite:
    base = dict(source=SDPA, module="GPT.h.0.attn", cls="Attention", class_at=("model.py", 12),
                heads=12, head_dim=64, seq_len=1024, batch=8, dtype="bfloat16", element_size=2,
                call_at=("model.py", 40), modules=["GPT.h.0.attn", "GPT.h.1.attn"])
    base.update(kw)
    return AttentionSite(**base)


def test_head_dim_numbers_on_v5e():
    n = head_dim_numbers(_site(), 64, 128, 128)
    assert n["mxu_fill_now"] == 0.5
    assert n["attention_matmul_flops_overhead"] == 1.0
    # standard block: attention share = T / (T + 6E) with E = 768, T = 1024
    assert n["layer_flops_overhead"] == pytest.approx(round(1024 / (1024 + 6 * 768), 4))
    assert n["extra_activation_bytes_per_layer"] == 4 * 8 * 12 * 1024 * 64 * 2
    assert n["wider_heads"] == {"heads": 6, "head_dim": 128}


def test_head_dim_finding_on_v6e_pads_to_256_at_the_class_line(tmp_path):
    model = tmp_path / "model.py"
    model.write_text("x = 1\n")
    (finding,) = head_dim_findings([_site(class_at=(str(model), 12))], "v6e", False, "train.py")
    assert finding.code == "TPU705"
    assert (finding.location.path, finding.location.line) == (str(model), 12)
    assert finding.extra["padded_head_dim"] == 256 and finding.extra["mxu_fill_now"] == 0.25
    assert "GPT.h.0.attn and 1 more" in finding.message and "+300% FLOPs" in finding.message
    assert "3 heads of 256" in finding.message
    # +300% of attention at seq 1024, embed 768 is +54% of the layer: wider heads, not padding
    assert finding.extra["recommendation"] == "wider_heads"
    assert finding.explanation.cause.endswith(
        "padding costs more than it can gain: prefer the wider heads")
    assert finding.explanation.fix == "for a model trained from scratch, use 3 heads of 256"
    assert head_dim_findings([_site(head_dim=128)], "v5e", False, "train.py") == []


def test_padding_is_advised_only_while_it_is_cheap():
    (v5e,) = head_dim_findings([_site()], "v5e", False, "train.py")
    assert v5e.extra["recommendation"] == "pad" and "more than it can gain" not in v5e.message
    toy = _site(heads=4, head_dim=8, seq_len=16)  # embed 32: no wider heads either
    (finding,) = head_dim_findings([toy], "v5e", False, "train.py")
    assert finding.extra["recommendation"] == "leave"
    assert finding.message.endswith("leave the head dim as it is")
    assert finding.explanation.fix == ""  # nothing to change


def test_config_heads_reads_module_or_config_attributes():
    class Config:
        n_head, n_embd = 12, 768

    class Block:
        config = Config()

    class Explicit:
        num_heads, head_dim = 8, 80

    assert config_heads(Block()) == (12, 64)
    assert config_heads(Explicit()) == (8, 80)
    assert config_heads(object()) is None
    assert CONFIG == "config attributes"


def test_host_ops_self_time_subtracts_nested_events():
    events = [
        {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 100, "name": "train_step 3",
         "args": {"step_name": "train_step 3"}},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 10, "dur": 50, "name": "Compile"},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 20, "dur": 20, "name": "Lower"},
        {"ph": "X", "pid": 1, "tid": 2, "ts": 5, "dur": 30, "name": "Execute"},
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name"},
    ]
    ops = {op["name"]: op for op in host_ops(events)}
    assert ops[PYTHON_TIME]["self_us"] == 50
    assert ops["Compile"]["self_us"] == 30 and ops["Compile"]["total_us"] == 50
    assert ops["Lower"]["self_us"] == 20 and ops["Execute"]["self_us"] == 30
    ranked = top(list(ops.values()), 2)
    assert [op["name"] for op in ranked] == [PYTHON_TIME, "Compile"]
    assert ranked[0]["self_share"] == pytest.approx(50 / 130, abs=1e-4)


def test_device_ops_keep_device_rows_only():
    cols = [{"id": i} for i in ("host_or_device", "type", "operation", "occurrences",
                                "total_time", "total_self_time")]
    table = {"cols": cols, "rows": [
        {"c": [{"v": "Device"}, {"v": "convolution"}, {"v": "conv.1"}, {"v": 4}, {"v": 90.0},
               {"v": 80.0}]},
        {"c": [{"v": "Device"}, {"v": "IDLE"}, {"v": "IDLE"}, {"v": 0}, {"v": 5.0}, {"v": 5.0}]},
        {"c": [{"v": "Host"}, {"v": "Dataset"}, {"v": "next"}, {"v": 4}, {"v": 9.0}, {"v": 9.0}]},
    ]}
    assert device_ops([table]) == [{"name": "conv.1", "category": "convolution", "occurrences": 4,
                                    "self_us": 80.0, "total_us": 90.0}]
    assert device_ops([{"cols": cols, "rows": []}]) == []


def test_overview_steps_are_read_from_the_step_table():
    table = {"cols": [{"id": "stepnum"}, {"id": "stepTimeMs"}, {"id": "tooltip"}],
             "rows": [{"c": [{"v": "train_step 3"}, {"v": 4.5}, {"v": "..."}]}]}
    assert steps([{"cols": [{"id": "x"}], "rows": []}, table]) == [
        {"stepnum": "train_step 3", "stepTimeMs": 4.5}]


def test_profile_steps_parse():
    assert parse_steps("3:5") == (3, 5)
    assert parse_steps("4") == (4, 4)
    for bad in ("0:2", "5:3", "a:b", ""):
        with pytest.raises(ValueError, match="--profile-steps"):
            parse_steps(bad)


def test_viewer_commands_name_the_logdir(tmp_path):
    commands = viewer_commands(tmp_path)
    assert commands[0] == f"tensorboard --logdir {tmp_path}"
    assert commands[1].startswith("xprof") and commands[1].endswith(f"--logdir {tmp_path}")


@pytest.mark.parametrize("args, message", [
    (["--profile-steps", "9:2", "--profile"], "need 1 <= A <= B"),
    (["--logdir", "x"], "--logdir and --profile-steps go with --profile"),
    (["--tpu-generation", "v9"], "--tpu-generation takes v2, v3, v4, v5e, v5p, v6e, v7"),
    (["--explain-graphs", "--no-graph-diffs"], "contradict each other"),
])
def test_run_usage_errors_are_one_line_and_exit_2(args, message, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    proc = subprocess.run([tpukit_executable(), "run", *args, str(script)],
                          env={**os.environ, "NO_COLOR": "1"}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "ran" not in proc.stdout


def test_the_tpu_generation_comes_from_the_accelerator_type():
    from tpukit.run.command import generation_of, tpu_generation

    assert generation_of("v5litepod-8") == "v5e" and generation_of("v6e-8") == "v6e"
    assert generation_of("v5p-16") == "v5p" and generation_of("v4-8") == "v4"
    assert generation_of("tpu7x-8") == "v7" and generation_of("weird") is None
    assert tpu_generation("v6e", "CPU") == ("v6e", False)
    assert tpu_generation(None, "CPU") == ("v5e", True)


@pytest.fixture
def fake_profiler(monkeypatch):
    """torch_xla's profiler pieces the Profiler calls, recording what happens in order."""
    import sys
    import types

    events: list = []

    class TraceMe:
        def __init__(self, name, **kw):
            self.label = f"{name} {kw['step_num']}"

        def __enter__(self):
            events.append(("enter", self.label))

        def __exit__(self, *exc):
            events.append(("exit", self.label))

    torch_xla = types.ModuleType("torch_xla")
    torch_xla._XLAC = types.SimpleNamespace(profiler=types.SimpleNamespace(TraceMe=TraceMe))
    xp = types.SimpleNamespace(start_trace=lambda d: events.append(("start", d)),
                               stop_trace=lambda: events.append(("stop",)))
    xm = types.SimpleNamespace(wait_device_ops=lambda: events.append(("wait",)))
    monkeypatch.setitem(sys.modules, "torch_xla", torch_xla)
    monkeypatch.setitem(sys.modules, "torch_xla.debug.profiler", xp)
    monkeypatch.setitem(sys.modules, "torch_xla.core.xla_model", xm)
    monkeypatch.setitem(sys.modules, "torch_xla.debug", types.SimpleNamespace(profiler=xp))
    monkeypatch.setitem(sys.modules, "torch_xla.core", types.SimpleNamespace(xla_model=xm))
    torch_xla.debug = sys.modules["torch_xla.debug"]
    torch_xla.core = sys.modules["torch_xla.core"]
    return events


def test_profiler_traces_exactly_the_window(fake_profiler, tmp_path):
    from tpukit.run.profile import Profiler

    profiler = Profiler(tmp_path, 2, 3)
    for index in range(1, 6):
        profiler.step_begins(index)
        profiler.step_ended(index, final=False)
    profiler.close()
    assert fake_profiler == [("start", str(tmp_path)), ("enter", "train_step 2"),
                             ("exit", "train_step 2"), ("enter", "train_step 3"),
                             ("exit", "train_step 3"), ("wait",), ("stop",)]
    assert profiler.captured == [2, 3] and profiler.error is None


def test_profiler_stops_at_the_script_end_inside_the_window(fake_profiler, tmp_path):
    from tpukit.run.profile import Profiler

    profiler = Profiler(tmp_path, 2, 4)
    profiler.step_begins(1)
    profiler.step_ended(1, final=False)
    profiler.step_begins(2)
    profiler.step_ended(2, final=False)
    profiler.step_begins(3)  # the script ends before this step's boundary
    profiler.close()
    assert fake_profiler[-3:] == [("exit", "train_step 3"), ("wait",), ("stop",)]
    assert profiler.captured == [2, 3]
