"""An optimizer built before its model moved to XLA trains nothing: `tpukit migrate` builds it
after the move (TPU106), `tpukit run` says so at the step (TPU709), and `tpukit verify` calls
such a port diverged with the reason, never a match."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "fixtures" / "verify" / "stale_optimizer.py"
CPU = {"PJRT_DEVICE": "CPU", "OMP_NUM_THREADS": "1"}


def _port(tmp_path: Path, run_cli, *options: str) -> Path:
    port = tmp_path / "port.py"
    shutil.copy(SCRIPT, port)
    run_cli("migrate", "-q", *options, str(port), check_rc=None)
    return port


def _run(run_cli, port: Path) -> list[dict]:
    proc = run_cli("run", "--format", "json", port, env=CPU)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    return [f for f in report["findings"] if f["code"] == "TPU709"]


def test_migrate_builds_the_optimizer_after_the_move(tmp_path, run_cli):
    text = _port(tmp_path, run_cli).read_text()
    assert text.index("model.to(") < text.index("optimizer = torch.optim.SGD(")


@pytest.mark.xla
def test_run_names_an_optimizer_that_steps_nothing_at_its_step(tmp_path, run_cli):
    stale = _port(tmp_path, run_cli, "--ignore", "TPU106")
    (finding,) = _run(run_cli, stale)
    assert finding["line"] == stale.read_text().splitlines().index("    optimizer.step()") + 1
    assert finding["extra"]["devices"] == ["cpu"] and finding["extra"]["parameters"] == 4
    assert "stale CPU copies" in finding["explanation"]["cause"]


@pytest.mark.xla
def test_run_says_nothing_of_a_port_that_trains(tmp_path, run_cli):
    assert _run(run_cli, _port(tmp_path, run_cli)) == []


@pytest.mark.xla
@pytest.mark.parametrize("stale", [True, False], ids=["stale-port", "migrated-port"])
def test_verify_calls_an_untrained_port_diverged_with_the_reason(tmp_path, run_cli, stale):
    port = _port(tmp_path, run_cli, *(["--ignore", "TPU106"] if stale else []))
    out = tmp_path / "verify.json"
    run_cli("verify", "--json", out, SCRIPT, "--port", port, "--steps", "3",
            check_rc=1 if stale else 0, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    summary = json.loads(out.read_text())["summary"]
    if not stale:
        assert summary["verdict"] == "match"
        return
    assert (summary["verdict"], summary["first_divergent_step"]) == ("diverged", 0)
    assert summary["where"]["kind"] == "optimizer"
    assert summary["where"]["text"].startswith("the optimizer's parameters are not the model's")
