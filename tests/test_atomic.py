"""Writes are atomic: a run killed at any moment leaves every file old or new, never partial."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, tpukit_executable
from tpukit.migrate import files as files_module
from tpukit.migrate.files import atomic_write

SOURCE = (FIXTURES / "resnet_alias" / "cuda.py").read_text()
MIGRATED = (FIXTURES / "resnet_alias" / "xla.py").read_text()


def _count_new(paths: list[Path]) -> int:
    return sum(1 for p in paths if p.read_text() != SOURCE)


@pytest.mark.parametrize("kill_after", [1, 60])
def test_killed_run_leaves_each_file_old_or_new(tmp_path, kill_after):
    tree = tmp_path / "tree"
    paths = []
    for i in range(300):
        folder = tree / f"pkg{i % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        paths.append(folder / f"m{i:03d}.py")
        paths[-1].write_text(SOURCE)
    proc = subprocess.Popen(
        [tpukit_executable(), "migrate", "-j", "2", str(tree)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while _count_new(paths) < kill_after and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole run, workers included, mid-write
    proc.wait()
    states = {"old": 0, "new": 0}
    for path in paths:
        text = path.read_text()
        assert text in (SOURCE, MIGRATED), f"{path} is neither the original nor the migration"
        states["old" if text == SOURCE else "new"] += 1
    # The kill landed mid-run: some files were done, some not.
    assert states["new"] >= kill_after and states["old"] > 0, states


def test_failed_replace_keeps_the_original_and_cleans_up(tmp_path, monkeypatch):
    target = tmp_path / "t.py"
    target.write_text("old\n")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files_module.os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.py"]
