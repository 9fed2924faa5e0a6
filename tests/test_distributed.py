"""Distributed fixtures: each migrated script runs on XLA:CPU at world size 1 through its
launcher (torch_xla.launch, or torchrun for the torchrun fixture), writes its rank-0
checkpoint with CPU tensors, and trains exactly like the single-process CPU reference.

World size 1 only: with CPU_NUM_DEVICES>1 torch_xla 2.9 hangs in its collectives on XLA:CPU.
A launch that touched the XLA runtime first would fail here ("Runtime is already
initialized"), so these runs also prove the launcher code leaves the runtime alone.
"""

from __future__ import annotations

import ast
import math
import os
import re
import socket
import subprocess
import sys
import tomllib

import pytest

from conftest import FIXTURES, xla_cpu_env

pytest.importorskip("torch_xla", reason="needs the xla extra: pip install -e '.[xla]'")

NAMES = sorted(p.parent.name for p in FIXTURES.glob("*/fixture.toml")
               if tomllib.loads(p.read_text()).get("distributed"))
BF16_RELATIVE = 1e-2


def config(name: str) -> dict:
    return tomllib.loads((FIXTURES / name / "fixture.toml").read_text())


def losses_of(stdout: str) -> list[float]:
    return ast.literal_eval(re.search(r"^losses: (.*)$", stdout, re.M).group(1))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache = {}

    def get(name: str) -> tuple[subprocess.CompletedProcess, object]:
        if name not in cache:
            out = tmp_path_factory.mktemp(name)
            cfg = config(name)
            script = str(FIXTURES / name / "xla.py")
            launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1"]
                        if cfg.get("launcher") == "torchrun" else [sys.executable])
            # xla:// rendezvous listens on MASTER_PORT (default 12355): a port of its own, so
            # runs on two test workers do not collide (EADDRINUSE)
            env = xla_cpu_env(MASTER_PORT=str(_free_port()))
            env.pop("CPU_NUM_DEVICES", None)
            proc = subprocess.run([*launcher, script, *cfg["args"], "--out", str(out)], cwd=out,
                                  env=env, capture_output=True, text=True, timeout=600)
            cache[name] = (proc, out)
        return cache[name]

    return get


def test_there_are_the_distributed_fixtures():
    assert NAMES == ["backend_settings", "ddp_host_inputs", "ddp_spawn", "ddp_torchrun",
                     "ddp_trainer_class", "mp_no_ddp", "zero_optimizer"]


@pytest.mark.parametrize("name", NAMES)
def test_migrated_script_trains_like_the_single_process_reference(name, runs, tmp_path):
    proc, _ = runs(name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    script = FIXTURES / name / config(name).get("reference", "reference_single.py")
    reference = subprocess.run(
        [sys.executable, str(script), *config(name)["args"]],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr[-2000:]
    got, want = losses_of(proc.stdout), losses_of(reference.stdout)
    assert len(got) == len(want) > 0
    for step, (a, b) in enumerate(zip(got, want)):
        assert math.isclose(a, b, rel_tol=BF16_RELATIVE), (step, a, b)


@pytest.mark.parametrize("name", NAMES)
def test_rank_zero_checkpoint_holds_cpu_tensors(name, runs):
    import torch

    proc, out = runs(name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = torch.load(out / config(name)["checkpoint"], weights_only=False)
    tensors = []

    def walk(value):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(state)
    assert tensors, "the checkpoint has no tensors"
    assert {t.device.type for t in tensors} == {"cpu"}


def test_spawned_fixtures_launch_with_torch_xla_launch_and_no_runtime_call_before_it():
    for name in NAMES:
        source = (FIXTURES / name / "xla.py").read_text()
        if config(name).get("launcher") == "torchrun":
            assert "torch_xla.launch" not in source
            continue
        main_block = source.split('if __name__ == "__main__":', 1)[1]
        assert "torch_xla.launch(" in main_block and "mp.spawn" not in main_block
        assert not re.search(r"torch_xla\.device|xr\.world_size|torch_xla\.device_count", main_block)
