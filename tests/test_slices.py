"""TPU505: a device tensor sliced at a Python-int offset becomes an index_select with an index
built on the host (one graph for every offset), with Python's slice semantics kept."""

from __future__ import annotations

import re
import textwrap

import pytest

from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import select_rules

RULES = select_rules([], [])


def migrate(source: str, target: str = "xla"):
    options = MigrateOptions(rules=RULES, target=target)
    return migrate_source(textwrap.dedent(source).lstrip("\n"), "t.py", options)


WORD_LM = """
import torch
device = torch.device("cuda")
def batchify(data, bsz):
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)
def get_batch(source, i, bptt=4):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)
train_data = batchify(torch.arange(96), 4)
for i in range(0, train_data.size(0) - 1, 4):
    data, targets = get_batch(train_data, i)
"""


@pytest.mark.parametrize("target", ["xla", "torchtpu"])
def test_a_batchified_corpus_passed_to_get_batch_is_indexed_on_the_host(target):
    migration = migrate(WORD_LM, target)
    assert ("source.index_select(0, torch.arange(source.size(0))[i:i + seq_len]"
            ".to(source.device))") in migration.new_source
    assert [f.code for f in migration.findings].count("TPU505") == 2
    again = migrate(migration.new_source, target)
    assert again.new_source == migration.new_source  # a fixed point


def test_the_rewrite_keeps_pythons_slice_semantics():
    torch = pytest.importorskip("torch")
    migration = migrate("import torch\nx = torch.randn(7, 3).cuda()\ny = x[a:b]\n")
    expr = re.search(r"^y = (.*)$", migration.new_source, re.M).group(1)
    assert "index_select" in expr
    x = torch.randn(7, 3)
    for a in range(-9, 10):
        for b in range(-9, 10):
            got = eval(expr, {"torch": torch, "x": x, "a": a, "b": b})  # noqa: S307
            assert torch.equal(got, x[a:b]), (a, b)


def test_a_slice_of_another_dimension_is_indexed_along_it():
    result = migrate("import torch\nx = torch.randn(4, 64).cuda()\nfor t in range(0, 64, 8):\n"
                     "    w = x[:, t:t + 8]\n").new_source
    assert "w = x.index_select(1, torch.arange(x.size(1))[t:t + 8].to(x.device))" in result


@pytest.mark.parametrize("line", ["x[i:i + 4] = 0", "x[i:i + 4] += 1", "x[i:i + 4].zero_()"])
def test_a_slice_written_to_stays_a_view_and_is_reported(line):
    migration = migrate(f"import torch\nx = torch.randn(16).cuda()\nfor i in range(0, 16, 4):\n"
                        f"    {line}\n    y = x[i:i + 4]\n")
    assert line in migration.new_source
    assert "y = x.index_select(0," in migration.new_source
    written = [f for f in migration.findings if f.code == "TPU505" and not f.applied]
    assert len(written) == 1 and "written to" in written[0].message


def test_host_tensors_fixed_bounds_and_open_ends_are_left_alone():
    source = """
    import torch
    x = torch.randn(16).cuda()
    host = torch.randn(16)
    for i in range(0, 16, 4):
        a, b, c = host[i:i + 4], x[0:4], x[i:]
        d = x[i:i + 4]
    """
    migration = migrate(source)
    assert "a, b, c = host[i:i + 4], x[0:4], x[i:]" in migration.new_source
    assert [f.location.line for f in migration.findings if f.code == "TPU505"] == [6]


def test_a_slice_with_one_fixed_bound_is_left_alone():
    # transformers' timesfm decode loop: `input_padding[:, 0 : final_out.shape[1]]` grows by a
    # patch per step, a new shape (and graph) whether sliced or index_selected
    source = """
    import torch
    x = torch.randn(4, 64).cuda()
    out = torch.randn(4, 8).cuda()
    for step in range(4):
        grown = x[:, 0 : out.shape[1]]
        tail = x[:, step:16]
        window = x[:, step : step + 8]
    """
    migration = migrate(source)
    assert "grown = x[:, 0 : out.shape[1]]" in migration.new_source
    assert "tail = x[:, step:16]" in migration.new_source
    assert [f.location.line for f in migration.findings if f.code == "TPU505"] == [7]

