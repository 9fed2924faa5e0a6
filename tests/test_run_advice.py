"""`tpukit run` advice, profile and HTML on XLA:CPU through the console script.

varlen.py pads each batch to its own longest sample: the run must advise buckets, and the same
script with those buckets applied through tpukit.buckets must compile at most that many graphs
and print the same losses. head_dim.py has heads of 64 (SDPA) and 32 (nn.MultiheadAttention):
both are named with their numbers; its run also captures a profile."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, tpukit_executable

pytest.importorskip("torch_xla")

RUN = FIXTURES / "run"
ENV = {**os.environ, "NO_COLOR": "1", "PJRT_DEVICE": "CPU", "COLUMNS": "200"}


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def tpukit_run(out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([tpukit_executable(), "run", "--json", str(out / "report.json"), *args],
                          env=ENV, capture_output=True, text=True, timeout=600, cwd=out)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads((out / "report.json").read_text())


def losses(proc: subprocess.CompletedProcess) -> list[float]:
    line = next(l for l in proc.stdout.splitlines() if l.startswith("losses"))
    return [float(x) for x in line.split()[1:]]


@pytest.fixture(scope="module")
def varlen(tmp_path_factory):
    out = tmp_path_factory.mktemp("varlen")
    return (out, *tpukit_run(out, "--html", str(out / "report.html"), str(RUN / "varlen.py"),
                             "--steps", "16"))


@pytest.fixture(scope="module")
def bucketed(varlen):
    _, _, report = varlen
    (advice,) = [f for f in report["findings"] if f["code"] == "TPU706"]
    out = varlen[0] / "bucketed"
    out.mkdir()
    buckets = ",".join(map(str, advice["extra"]["buckets"]))
    return (advice, *tpukit_run(out, str(RUN / "varlen.py"), "--steps", "16",
                                "--buckets", buckets))


def test_varlen_gets_bucket_advice_at_the_loader_line(varlen):
    _, _, report = varlen
    (advice,) = [f for f in report["findings"] if f["code"] == "TPU706"]
    extra = advice["extra"]
    assert advice["line"] == line_of(RUN / "varlen.py", "for tokens, labels in loader:")
    assert extra["inputs"][0] == {"name": "batch[0]", "dim": 1}
    assert {"name": "batch[1]", "dim": 1} in extra["inputs"]
    assert extra["distinct_sizes"] > extra["budget"] == 4
    assert len(extra["buckets"]) == extra["compiles_with_buckets"] <= 4
    assert max(extra["buckets"]) == max(int(s) for s in extra["sizes"])
    assert 0 < extra["padding_overhead"] < extra["powers_of_two_overhead"]
    assert f"BucketCollate({extra['buckets']}, dim=0)" in extra["snippet"]
    assert advice["explanation"]["fix"].startswith(
        f"`DataLoader(..., collate_fn=BucketCollate({extra['buckets']}")
    assert advice["explanation"]["cause"].startswith("XLA compiles a graph per size")
    assert report["summary"]["distinct_graphs"] >= extra["distinct_sizes"]


def test_a_length_that_varies_names_the_collate_fn_that_pads(varlen, bucketed):
    _, _, report = varlen
    found = [f for f in report["findings"] if f["code"] == "TPU701" and f["extra"]["changes"]]
    assert found and all(f["extra"]["collate"] == {
        "name": "pad_to_longest", "path": str(RUN / "varlen.py"),
        "line": line_of(RUN / "varlen.py", "def pad_to_longest")} for f in found)
    assert "collate_fn `pad_to_longest` (varlen.py:" in found[0]["message"]
    _, _, bucketed_report = bucketed
    # tpukit's own BucketCollate is not the user's code: never named as the place to fix
    assert not [f for f in bucketed_report["findings"] if "collate" in f.get("extra", {})]


def test_the_advised_buckets_bound_the_compiles_and_keep_the_losses(varlen, bucketed):
    _, proc, report = varlen
    advice, bucketed_proc, bucketed_report = bucketed
    assert bucketed_report["summary"]["distinct_graphs"] <= len(advice["extra"]["buckets"])
    assert bucketed_report["summary"]["distinct_graphs"] < report["summary"]["distinct_graphs"]
    assert not [f for f in bucketed_report["findings"] if f["code"] == "TPU706"]
    assert losses(bucketed_proc) == pytest.approx(losses(proc), abs=2e-4)


def test_html_report_is_self_contained_with_chart_findings_and_advice(varlen):
    out, _, report = varlen
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "Plotly.newPlot" in page and "plotly.js" in page.lower()
    # nothing fetched when opened: every script inline, no stylesheet or image links
    assert re.findall(r"<script[^>]*>", page) == ["<script>"] * page.count("<script")
    assert "<link" not in page and "<img" not in page
    assert "compiled a graph" in page  # the legend of compile steps on the chart
    assert "TPU701" in page and "TPU706" in page and "BucketCollate(" in page
    assert json.dumps(report["summary"]["steps"]) in page


@pytest.fixture(scope="module")
def head_dim(tmp_path_factory):
    out = tmp_path_factory.mktemp("head_dim")
    return (out, *tpukit_run(out, "--format", "json", "--profile", "--logdir", str(out / "prof"),
                             "--profile-steps", "2:3", str(RUN / "head_dim.py")))


def test_head_dim_64_is_named_at_its_class_with_numbers(head_dim):
    _, proc, report = head_dim
    path = RUN / "head_dim.py"
    by_dim = {f["extra"]["head_dim"]: f for f in report["findings"] if f["code"] == "TPU705"}
    assert sorted(by_dim) == [32, 64]
    sdpa = by_dim[64]
    assert sdpa["line"] == line_of(path, "class SelfAttention")
    assert sdpa["extra"]["site"]["module"] == "Model.attn"
    call_line = line_of(path, "scaled_dot_product_attention(q")
    assert sdpa["extra"]["site"]["call_at"]["line"] == call_line
    assert sdpa["extra"]["padded_head_dim"] == 128 and sdpa["extra"]["mxu_fill_now"] == 0.5
    assert sdpa["extra"]["tpu_generation"] == "v5e" and sdpa["extra"]["generation_assumed"]
    # seq 32, embed 256, batch 8, float32: attention share 32 / (32 + 6 * 256)
    assert sdpa["extra"]["layer_flops_overhead"] == round(32 / (32 + 6 * 256), 4)
    assert sdpa["extra"]["extra_activation_bytes_per_layer"] == 4 * 8 * 4 * 32 * 64 * 4
    assert "+100% FLOPs" in sdpa["message"] and "2 heads of 128" in sdpa["message"]
    fix = {"pad": "pad q, k and v to head dim 128",
           "wider_heads": "for a model trained from scratch, use 2 heads of 128"}
    assert sdpa["explanation"]["fix"].startswith(fix[sdpa["extra"]["recommendation"]])
    mha = by_dim[32]
    assert mha["line"] == line_of(path, "x, _ = self.cross(")  # torch's class: the calling line
    assert mha["extra"]["padded_head_dim"] == 128
    assert '"code": "TPU705"' in proc.stdout  # --format json


def test_profile_writes_an_xplane_and_prints_the_top_ops(head_dim):
    out, proc, report = head_dim
    planes = list((out / "prof" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(planes) == 1 and planes[0].stat().st_size > 0
    profile = report["summary"]["profile"]
    assert profile["steps"] == [2, 3] and profile["error"] is None
    assert profile["ops_source"] == "host" and profile["hardware"] == "CPU_ONLY"
    assert len(profile["top_ops"]) >= 3
    assert [s["stepnum"] for s in profile["step_breakdown"]] == ["train_step 2", "train_step 3"]
    table = proc.stderr[proc.stderr.index("Top ops by self time, steps 2-3"):]
    rows = [row for row in table.splitlines() if row.startswith("│")]
    assert len(rows) == len(profile["top_ops"])
    assert profile["top_ops"][0]["name"][:20] in rows[0]
    assert f"tensorboard --logdir {out / 'prof'}" in proc.stderr


def test_with_format_json_the_report_follows_the_script_output_on_stdout(head_dim):
    _, proc, report = head_dim
    script_output, _, rest = proc.stdout.partition("done\n")
    assert script_output == ""
    assert json.loads(rest)["summary"]["profile"]["steps"] == report["summary"]["profile"]["steps"]
