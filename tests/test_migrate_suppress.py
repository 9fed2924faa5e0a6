"""`# tpukit: ignore[...]` in migrate: a suppressed finding is neither reported nor fixed."""

from __future__ import annotations

import json

from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import select_rules

ALL = MigrateOptions(rules=select_rules([], []))
STRICT = MigrateOptions(rules=select_rules([], []), strict=True)


def test_a_suppressed_cuda_call_stays_while_the_next_line_is_rewritten():
    source = "import torch\na = x.cuda()  # tpukit: ignore[TPU102]\nb = y.cuda()\n"
    migration = migrate_source(source, "t.py", ALL)
    lines = migration.new_source.splitlines()
    assert "a = x.cuda()  # tpukit: ignore[TPU102]" in lines
    assert "b = y.to(torch_xla.device())" in lines
    assert [(f.code, f.location.line) for f in migration.findings] == [("TPU102", 3)]
    [silenced] = migration.suppressed
    assert (silenced["code"], silenced["line"]) == ("TPU102", 2)
    assert silenced["suppressed_by"] == "line 2: # tpukit: ignore[TPU102]"
    assert silenced["applied"] is False   # the line stays as written


def test_what_a_suppressed_fix_needed_is_not_added_imports_and_helpers_alike():
    for line in ("x = y.cuda()", "used = torch.cuda.memory_allocated()"):
        source = f"import torch\n{line}  # tpukit: ignore\n"
        migration = migrate_source(source, "t.py", ALL)
        assert migration.new_source == source and not migration.changed
        assert migration.findings == [] and migration.suppressed


def test_a_code_prefix_and_a_file_comment_suppress_and_other_codes_do_not():
    source = "# tpukit: ignore-file[TPU11]\nimport torch\ntorch.cuda.synchronize()\nx.cuda()\n"
    out = migrate_source(source, "t.py", ALL).new_source
    assert "torch.cuda.synchronize()" in out and "x.to(torch_xla.device())" in out


def test_an_unused_comment_is_tpu009_with_strict_only():
    source = "import torch\nx = y.cuda()\nz = 1  # tpukit: ignore[TPU102]\n"
    assert "TPU009" not in [f.code for f in migrate_source(source, "t.py", ALL).findings]
    found = [(f.code, f.location.line) for f in migrate_source(source, "t.py", STRICT).findings]
    assert ("TPU009", 3) in found and ("TPU102", 2) in found
    untouched = "z = 1  # tpukit: ignore\n"  # a file the prefilter skips still has its comment
    assert [f.code for f in migrate_source(untouched, "t.py", STRICT).findings] == ["TPU009"]


def test_the_cli_lists_suppressed_findings_in_json_and_strict_reports_unused(tmp_path, run_cli):
    (tmp_path / "train.py").write_text(
        "import torch\na = x.cuda()  # tpukit: ignore[TPU102]\nb = y.cuda()\n"
        "c = 1  # tpukit: ignore[TPU501]\n")
    proc = run_cli("migrate", "--check", "--format", "json", "train.py", cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert [(f["code"], f["line"]) for f in report["findings"]] == [("TPU102", 3)]
    [silenced] = report["summary"]["suppressed"]
    assert silenced["line"] == 2 and silenced["suppressed_by"].startswith("line 2:")
    strict = json.loads(run_cli("migrate", "--check", "--strict", "--format", "json", "train.py",
                                cwd=tmp_path).stdout)
    assert ("TPU009", 4) in [(f["code"], f["line"]) for f in strict["findings"]]


TRAIN = """import torch
from torch.utils.data import DataLoader

device = torch.device("cuda"){device_comment}
model = torch.nn.Linear(2, 2).to(device)
loader = DataLoader(range(8), batch_size=2, drop_last=True)
scaler = torch.cuda.amp.GradScaler()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    with torch.cuda.amp.autocast():{autocast_comment}
        loss = model(x.to(device)).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
"""


def test_a_rewrite_that_relies_on_a_suppressed_rule_is_reported_not_applied():
    # fp16 autocast kept by a comment keeps its loss scaling; a CUDA device kept by one gets
    # no MpDeviceLoader that would copy batches to it
    source = TRAIN.format(device_comment="", autocast_comment="  # tpukit: ignore[TPU201]")
    migration = migrate_source(source, "t.py", ALL)
    new = migration.new_source
    assert "scaler = torch.cuda.amp.GradScaler()" in new and "scaler.step(opt)" in new
    assert "pl.MpDeviceLoader(loader, device)" in new  # TPU301 needs TPU101, not TPU201
    held = [f for f in migration.findings if f.code == "TPU203"]
    assert len(held) == 4 and not any(f.applied for f in held)
    assert all("relies on TPU201's rewrite, which `# tpukit: ignore[TPU201]` at line 10 turns off"
               in f.message for f in held)
    source = TRAIN.format(device_comment="  # tpukit: ignore[TPU101]", autocast_comment="")
    new = migrate_source(source, "t.py", ALL).new_source
    assert "for x in loader:" in new and "MpDeviceLoader" not in new
    assert "scaler.step(opt)" not in new and "    opt.step()" in new  # TPU203 still applies
    # with no comment, both apply
    new = migrate_source(TRAIN.format(device_comment="", autocast_comment=""), "t.py", ALL).new_source
    assert "MpDeviceLoader" in new and "scaler.step(opt)" not in new
