"""Inline suppression comments (`# tpukit: ignore[...]`, `# tpukit: ignore-file[...]`)."""

from __future__ import annotations

from tpukit.findings import Finding, Location, Severity
from tpukit.suppress import Suppressions, split, unused_findings


def _finding(code: str, line: int, end_line: int | None = None) -> Finding:
    return Finding(code, Severity.WARNING, "m", Location("t.py", line, 1, end_line, 2))


SOURCE = """\
import torch
x = y.item()  # tpukit: ignore[TPU501]
z = w.item()  # tpukit: ignore[TPU5, TPU702]
q = 1  # tpukit: ignore
s = "# tpukit: ignore[TPU101]"
"""


def test_line_comment_names_codes_and_prefixes():
    sup = Suppressions.from_source(SOURCE)
    assert [(s.line, s.codes) for s in sup.items] == [(2, ("TPU501",)), (3, ("TPU5", "TPU702")), (4, ())]
    assert sup.covering("TPU501", 2).line == 2
    assert sup.covering("TPU503", 2) is None          # another code on that line
    assert sup.covering("TPU503", 3).line == 3        # a prefix
    assert sup.covering("TPU101", 4).line == 4        # no brackets: every code
    assert sup.covering("TPU101", 5) is None          # inside a string: not a comment


def test_a_multi_line_finding_is_covered_by_a_comment_on_any_of_its_lines():
    sup = Suppressions.from_source("a = f(\n    b,  # tpukit: ignore[TPU402]\n)\n")
    assert sup.covering("TPU402", 1, 3) is not None
    assert sup.covering("TPU402", 3, 3) is None


def test_file_comment_covers_every_line():
    sup = Suppressions.from_source("# tpukit: ignore-file[TPU302]\nimport torch\n")
    assert sup.items[0].whole_file and sup.covering("TPU302", 40) is not None
    assert sup.covering("TPU301", 40) is None


def test_split_lists_what_was_silenced_and_by_which_comment():
    sup = Suppressions.from_source(SOURCE)
    kept, suppressed = split([_finding("TPU501", 2), _finding("TPU501", 6)], sup)
    assert [f.location.line for f in kept] == [6]
    assert suppressed[0]["code"] == "TPU501" and suppressed[0]["suppressed_by"] == "line 2: # tpukit: ignore[TPU501]"


def test_unused_comments_and_bad_codes_are_tpu009():
    sup = Suppressions.from_source("x = 1  # tpukit: ignore[TPU501]\ny = 2  # tpukit: ignore[E501]\n")
    split([], sup)
    found = unused_findings("t.py", sup)
    assert [(f.code, f.location.line) for f in found] == [("TPU009", 1), ("TPU009", 2)]
    assert "silences nothing" in found[0].message and "E501" in found[1].message


def test_a_file_without_the_word_costs_nothing_and_suppresses_nothing():
    sup = Suppressions.from_source("x = 1  # noqa\n")
    assert not sup and split([_finding("TPU501", 1)], sup)[1] == []


def test_untokenizable_source_still_reads_comments():
    sup = Suppressions.from_source('x = (\n  1  # tpukit: ignore[TPU501]\n')
    assert sup.covering("TPU501", 2) is not None
