from __future__ import annotations

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
