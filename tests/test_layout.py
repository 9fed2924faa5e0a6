"""The repository's top level is the fixed layout (pyproject.toml, tpukit/, rules/, tests/,
fixtures/, README.md) and the project's own files beside it: nothing a run left there (a
fixture's checkpoint, written to the working directory by a test without `cwd=`) is tracked."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import ROOT

LAYOUT = {"pyproject.toml", "tpukit", "rules", "tests", "fixtures", "README.md"}
BESIDE = {".ci", ".gitignore", ".pre-commit-hooks.yaml", "Makefile", "benchmarks", "docs"}


def test_tracked_top_level_is_the_layout():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split("\n")
    top = {path.split("/", 1)[0] for path in tracked if path}
    assert LAYOUT <= top
    assert top - LAYOUT - BESIDE == set()
