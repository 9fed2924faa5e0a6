"""Migrated fixtures run unmodified on XLA:CPU (PJRT_DEVICE=CPU) and compile XLA graphs.

Fixtures whose port needs a person (CUDA-only libraries, CUDA events) say why in their
fixture.toml; the others must run as tpukit wrote them.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tomllib

import pytest

from conftest import FIXTURES

pytest.importorskip("torch_xla", reason="needs the xla extra: pip install -e '.[xla]'")

RUNNER = """
import runpy, sys
path, args = sys.argv[1], sys.argv[2:]
sys.argv = [path, *args]
runpy.run_path(path, run_name="__main__")
import torch_xla.debug.metrics as met
compiles = met.metric_data("CompileTime")
print("XLA_COMPILES", compiles[0] if compiles else 0)
"""


def fixture_config(name: str) -> dict:
    return tomllib.loads((FIXTURES / name / "fixture.toml").read_text())


NAMES = sorted(p.parent.name for p in FIXTURES.glob("*/cuda.py"))
# Fixtures with a hand-written reference port are run (and compared) by test_ports.py.
# Distributed fixtures run through their launcher in test_distributed.py.
RUNNABLE = [
    n for n in NAMES
    if fixture_config(n)["runs_on_xla"] and not (FIXTURES / n / "reference_xla.py").exists()
    and not fixture_config(n).get("distributed")
]


def test_every_fixture_says_whether_it_runs_and_why_not():
    for name in NAMES:
        config = fixture_config(name)
        assert config["runs_on_xla"] or len(config.get("why", "")) > 20, name
    assert len(RUNNABLE) >= 4


@pytest.mark.xla
@pytest.mark.parametrize("name", RUNNABLE)
def test_migrated_fixture_runs_on_xla_cpu(name, tmp_path):
    config = fixture_config(name)
    env = {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(FIXTURES / name / "xla.py"), *config.get("args", [])],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loss = re.search(r"^final loss: (\S+)$", proc.stdout, re.M)
    assert loss and math.isfinite(float(loss.group(1))), proc.stdout[-2000:]
    compiles = int(re.search(r"^XLA_COMPILES (\d+)$", proc.stdout, re.M).group(1))
    assert compiles > 0, "the script ran, but nothing ran on the XLA device"
