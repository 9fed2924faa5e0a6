"""rules/ ships inside the wheel and is found there, as it is from a source checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

pytest.importorskip("hatchling", reason="building the wheel needs hatchling (dev extra)")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    return next(out.glob("tpukit-*.whl"))


def test_wheel_contains_every_rule_file(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n.removeprefix("tpukit/_rules/") for n in names
                     if n.startswith("tpukit/_rules/") and n.endswith(".toml"))
    rules = ROOT / "rules"
    assert shipped == sorted(p.relative_to(rules).as_posix() for p in rules.rglob("*.toml"))
    assert "engines/call-map.toml" in shipped
    assert "tpukit/cli.py" in names


def test_installed_wheel_finds_its_rules(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import tpukit.rules as r;"
        "print(r.rules_dir()); print(len(r.load_rules()));"
        "print(len(r.engine_messages('call-map')['xla']))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(target)], cwd=tmp_path,
                          capture_output=True, text=True, check=True)
    where, count, shared = proc.stdout.split()
    assert Path(where) == target / "tpukit" / "_rules"
    assert int(shared) >= 5  # rules/engines/ ships too
    assert int(count) == len(list((ROOT / "rules").glob("*.toml")))
