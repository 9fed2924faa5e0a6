from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def pytest_configure(config):
    """Each pytest-xdist worker's runs rendezvous on a port of their own: torch_xla's
    `xla://` process group listens on MASTER_PORT (12355 when unset), and two DDP runs from two
    workers at once failed with EADDRINUSE."""
    if os.environ.get("PYTEST_XDIST_WORKER") and "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])


_CACHES = itertools.count()


@pytest.fixture(autouse=True)
def _own_compile_cache(monkeypatch, tmp_path_factory):
    """Each test's `tpukit run` keeps its compiled graphs in a folder of the test's own (made
    by the first run that writes one), not in ~/.cache/tpukit: the persistent compilation cache
    is on by default, and one test's graphs would be another's cache entries. The user's
    XLA_PERSISTENT_CACHE_PATH (which wins over it) is not the tests' either."""
    monkeypatch.delenv("XLA_PERSISTENT_CACHE_PATH", raising=False)
    monkeypatch.delenv("XLA_PERSISTENT_CACHE_READ_ONLY", raising=False)
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("TPUKIT_COMPILE_CACHE", str(base / "compile-cache" / str(next(_CACHES))))


def xla_cpu_env(**extra: str) -> dict:
    """The environment of a script run on XLA:CPU by a test: compiled as `tpukit run` and
    `tpukit verify` compile there (tpukit.run.command.xla_cpu_compile_flags: LLVM -O0, about 3x
    faster compiles, the same losses), unless the test's environment says otherwise."""
    from tpukit.run.command import xla_cpu_compile_flags

    env = {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONUNBUFFERED": "1", **extra}
    xla_cpu_compile_flags(env)
    return env


def tpukit_executable() -> str:
    """The real console script of the environment running the tests."""
    script = Path(sys.executable).with_name("tpukit")
    if script.exists():
        return str(script)
    found = shutil.which("tpukit")
    if found is None:
        pytest.fail("the `tpukit` console script is not installed (pip install -e .)")
    return found


@pytest.fixture
def run_cli():
    """Run `tpukit ARGS` as a user would: the console script, in a subprocess."""

    def run(*args: str, cwd: Path | None = None, env: dict | None = None, check_rc=None):
        full_env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", **(env or {})}
        proc = subprocess.run(
            [tpukit_executable(), *map(str, args)],
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check_rc is not None:
            assert proc.returncode == check_rc, (proc.returncode, proc.stdout, proc.stderr)
        return proc

    return run


def assert_said_in_parts(findings) -> None:
    """Every migrate finding is said in parts (what, cause, fix: findings.Message) and carries
    them as its explanation, as every `tpukit run` finding does: a cause or a fix, and the
    message said from them by findings.said."""
    for finding in findings:
        assert finding.explanation is not None, f"{finding.code}: {finding.message}"
        cause, fix = finding.explanation.cause, finding.explanation.fix
        assert cause or fix, f"{finding.code}: {finding.message}"
        assert finding.message.endswith(f". Fix: {fix}" if fix else f": {cause}"), finding.message
