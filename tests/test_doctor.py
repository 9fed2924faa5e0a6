"""`tpukit doctor`: every check driven by a controlled environment.

The TPU-present paths are tested with fakes (a /dev/accel0 file, a libtpu or torch_tpu
distribution on a search path, a torch_xla that fails to import): nothing here claims to
have run on a TPU. The real XLA:CPU smoke test runs at the end.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tpukit.doctor.checks import (
    DoctorContext,
    ProbeResult,
    check_compile_cache,
    check_device,
    check_env_vars,
    check_multihost,
    check_packages,
    check_python,
    check_smoke_test,
    check_torchtpu,
    check_torchtpu_env,
)
from tpukit.config import Config
from tpukit.doctor.command import DoctorRequest, run_doctor
from tpukit.render import Format
from tpukit.findings import Severity


def fake_dist(site: Path, name: str, version: str, files: list[str] = ()) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))


@pytest.fixture
def site(tmp_path) -> Path:
    folder = tmp_path / "site"
    folder.mkdir()
    return folder


def context(site: Path, tmp_path: Path, probe: dict | None = None, **kw) -> DoctorContext:
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    ctx = DoctorContext(env=kw.pop("env", {}), dev_root=dev, search_path=[str(site)], **kw)
    if probe is not None:
        ctx.__dict__["probe"] = ProbeResult(probe)  # what the subprocess would have said
    return ctx


def codes(result) -> list[tuple[str, str]]:
    return [(f.code, f.severity.value) for f in result.findings]


# -- python -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "version,expected",
    [((3, 11, 7), []), ((3, 9, 18), [("TPU001", "error")]), ((3, 14, 0), [("TPU001", "warning")])],
)
def test_python_version(version, expected, site, tmp_path):
    assert codes(check_python(context(site, tmp_path, version_info=version))) == expected


# -- packages ------------------------------------------------------------------------------
def test_matching_torch_and_torch_xla_pass(site, tmp_path):
    fake_dist(site, "torch", "2.9.0+cu128")
    fake_dist(site, "torch-xla", "2.9.0")
    fake_dist(site, "torchvision", "0.24.0")
    result = check_packages(context(site, tmp_path, probe={"torch": "2.9.0"}))
    assert result.status == "ok" and "torch_xla 2.9.0" in result.detail


def test_missing_and_mismatched_packages(site, tmp_path):
    assert codes(check_packages(context(site, tmp_path, probe={}))) == [
        ("TPU002", "error"), ("TPU002", "error")]
    fake_dist(site, "torch", "2.8.0")
    fake_dist(site, "torch-xla", "2.9.0")
    fake_dist(site, "torchvision", "0.25.0")
    messages = [f.message for f in check_packages(context(site, tmp_path, probe={})).findings]
    assert "built against exactly torch 2.9.0" in messages[0]
    assert "torchvision 0.25.0 does not match torch 2.8.0 (expected 0.23.x)" in messages[1]


def test_undefined_symbol_import_error_is_explained_as_abi_mismatch(site, tmp_path):
    fake_dist(site, "torch", "2.9.0")
    fake_dist(site, "torch-xla", "2.9.0")
    probe = {"import_error": "ImportError: /x/_XLAC.so: undefined symbol: _ZN5torch8autograd"}
    (finding,) = check_packages(context(site, tmp_path, probe=probe)).findings
    assert "C++ ABI mismatch" in finding.message and "--force-reinstall" in finding.message


def test_real_probe_reports_an_undefined_symbol_from_a_broken_torch_xla(tmp_path):
    # A torch_xla that fails the way an ABI mismatch does, first on the probe's path.
    broken = tmp_path / "broken" / "torch_xla"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        "raise ImportError('_XLAC.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZN3c10')\n")
    ctx = DoctorContext(env={**os.environ, "PYTHONPATH": str(tmp_path / "broken")}, smoke=False,
                        probe_timeout=120)
    pytest.importorskip("torch")
    assert "undefined symbol" in ctx.probe.data["import_error"]


# -- device ---------------------------------------------------------------------------------
def test_no_tpu_is_a_pass_unless_required(site, tmp_path):
    probe = {"pjrt_device": "CPU"}
    result = check_device(context(site, tmp_path, probe=probe))
    assert result.status == "ok" and codes(result) == [("TPU003", "info")]
    assert "PJRT_DEVICE=unset -> CPU" in result.detail
    required = check_device(context(site, tmp_path, probe=probe, require_tpu=True))
    assert codes(required) == [("TPU003", "error")]


def test_fake_tpu_chips_with_libtpu_pass(site, tmp_path):
    ctx = context(site, tmp_path, probe={"pjrt_device": "TPU"}, env={"PJRT_DEVICE": "TPU", "PATH": ""})
    (ctx.dev_root / "accel0").touch()
    (ctx.dev_root / "accel1").touch()
    fake_dist(site, "libtpu", "0.0.52")
    result = check_device(ctx)
    assert result.status == "ok" and result.findings == []
    assert "TPU chips: accel0, accel1" in result.detail and "libtpu 0.0.52" in result.detail


def test_v5e_vfio_chips_without_libtpu_fail(site, tmp_path):
    ctx = context(site, tmp_path, probe={"pjrt_device": "CPU"}, env={"PATH": ""})
    (ctx.dev_root / "vfio").mkdir()
    (ctx.dev_root / "vfio" / "0").touch()
    messages = [(f.severity, f.message) for f in check_device(ctx).findings]
    assert (Severity.ERROR, "TPU chips are present but libtpu is not installed: pip install torch_xla[tpu]") in messages
    assert any(s is Severity.WARNING and "runs on CPU" in m for s, m in messages)


def test_pjrt_tpu_without_chips_fails(site, tmp_path):
    ctx = context(site, tmp_path, probe={"pjrt_device": "TPU"}, env={"PJRT_DEVICE": "TPU"})
    assert codes(check_device(ctx)) == [("TPU003", "error")]


def test_tpu_info_output_is_reported_when_installed(site, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "tpu-info"
    tool.write_text("#!/bin/sh\necho 'TPU Chips: 4 x v5litepod'\necho 'HBM: 16.00 GiB each'\n")
    tool.chmod(0o755)
    ctx = context(site, tmp_path, probe={"pjrt_device": "TPU"}, env={"PATH": str(bin_dir)})
    (ctx.dev_root / "accel0").touch()
    fake_dist(site, "libtpu", "0.0.52")
    assert "tpu-info: TPU Chips: 4 x v5litepod | HBM: 16.00 GiB each" in check_device(ctx).detail


# -- smoke test -----------------------------------------------------------------------------
def test_smoke_test_failures(site, tmp_path):
    hung = context(site, tmp_path)
    hung.__dict__["probe"] = ProbeResult(error="did not finish in 5 s (a hung runtime?)")
    assert "hung runtime" in check_smoke_test(hung).findings[0].message
    broken = context(site, tmp_path, probe={"device": "xla:0", "smoke_error": "RuntimeError: boom"})
    assert codes(check_smoke_test(broken)) == [("TPU004", "error")]
    wrong = context(site, tmp_path, probe={"device": "xla:0", "max_abs_error": 3.0})
    assert codes(check_smoke_test(wrong)) == [("TPU004", "error")]


def test_hung_probe_times_out_instead_of_hanging(tmp_path):
    sleeper = tmp_path / "python"
    sleeper.write_text("#!/bin/sh\nsleep 30\n")
    sleeper.chmod(0o755)
    ctx = DoctorContext(env=dict(os.environ), python=str(sleeper), probe_timeout=1)
    assert ctx.probe.error == "did not finish in 1 s (a hung runtime?)"


# -- environment variables ---------------------------------------------------------------------
def test_deprecated_and_debug_variables(site, tmp_path):
    env = {"XLA_USE_BF16": "1", "XRT_TPU_CONFIG": "localservice;0;localhost:51011",
           "PT_XLA_DEBUG_LEVEL": "2", "PT_XLA_DEBUG": "0"}
    messages = [f.message for f in check_env_vars(context(site, tmp_path, env=env)).findings]
    assert len(messages) == 3
    assert messages[0].startswith("XLA_USE_BF16=1: silently casts")
    assert "XRT runtime" in messages[1] and messages[2].startswith("PT_XLA_DEBUG_LEVEL=2")


def test_compile_cache_path(site, tmp_path):
    ok = context(site, tmp_path, env={"XLA_PERSISTENT_CACHE_PATH": str(tmp_path / "cache" / "xla")})
    assert check_compile_cache(ok).status == "ok"
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    bad = context(site, tmp_path, env={"XLA_PERSISTENT_CACHE_PATH": str(blocker / "cache")})
    assert "which is a file, not a folder" in check_compile_cache(bad).findings[0].message


def test_without_a_cache_variable_the_folder_tpukit_run_uses_is_checked(site, tmp_path):
    default = check_compile_cache(context(site, tmp_path, env={"XDG_CACHE_HOME": str(tmp_path)}))
    assert default.status == "ok"
    assert str(tmp_path / "tpukit" / "xla-compile-cache") in default.detail
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    bad = check_compile_cache(context(site, tmp_path,
                                      env={"TPUKIT_COMPILE_CACHE": str(blocker / "c")}))
    (found,) = bad.findings
    assert found.code == "TPU006" and "TPUKIT_COMPILE_CACHE" in found.message
    assert check_compile_cache(context(site, tmp_path,
                                      env={"TPUKIT_COMPILE_CACHE": "0"})).status == "skip"


@pytest.mark.parametrize(
    "env,expected",
    [
        ({}, []),
        ({"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_ACCELERATOR_TYPE": "v4-16"}, []),
        ({"TPU_WORKER_ID": "2", "TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_ACCELERATOR_TYPE": "v4-16"},
         [("TPU007", "error")]),
        ({"TPU_WORKER_ID": "0"}, [("TPU007", "error")]),
        ({"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "h0", "TPU_ACCELERATOR_TYPE": "big-tpu"},
         [("TPU007", "warning")]),
    ],
)
def test_multihost_variables(env, expected, site, tmp_path):
    assert codes(check_multihost(context(site, tmp_path, env=env))) == expected


# -- torch_tpu --------------------------------------------------------------------------------
def test_google_torchtpu_is_told_from_an_unrelated_package(site, tmp_path):
    assert check_torchtpu(context(site, tmp_path)).status == "skip"
    package = site / "torch_tpu"
    (package / "_internal").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_internal" / "public_api.py").write_text("_PUBLIC_MODULES = {}\n")
    fake_dist(site, "torch-tpu", "0.2.0", ["torch_tpu/__init__.py"])
    fake_dist(site, "torch", "2.9.0")
    result = check_torchtpu(context(site, tmp_path))
    assert result.detail.startswith("Google's TorchTPU 0.2.0")
    messages = " ".join(f.message for f in result.findings)
    assert "needs torch 2.11-2.15" in messages and "libtpu >= 0.0.50" in messages


def test_unrelated_torch_tpu_module(site, tmp_path):
    (site / "torch_tpu").mkdir()
    (site / "torch_tpu" / "__init__.py").write_text("")
    fake_dist(site, "torch-tpu-utils", "1.0", ["torch_tpu/__init__.py"])
    (finding,) = check_torchtpu(context(site, tmp_path)).findings
    assert "torch-tpu-utils 1.0, not Google's TorchTPU" in finding.message


def google_torchtpu(site: Path, torch: str = "2.13.0+cpu", libtpu: str | None = "0.0.52") -> None:
    package = site / "torch_tpu"
    (package / "_internal").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_internal" / "public_api.py").write_text("_PUBLIC_MODULES = {}\n")
    fake_dist(site, "torch-tpu", "0.2.0", ["torch_tpu/__init__.py"])
    fake_dist(site, "torch", torch)
    if libtpu:
        fake_dist(site, "libtpu", libtpu)


def test_a_good_torchtpu_install_passes_and_names_libtpu(site, tmp_path):
    google_torchtpu(site)
    result = check_torchtpu(context(site, tmp_path))
    assert result.status == "ok" and result.detail.endswith("libtpu 0.0.52")
    assert result.facts == {"torchtpu": "0.2.0"}


@pytest.mark.parametrize("env,expected", [
    ({}, []),
    ({"TORCH_TPU_TOPOLOGY": "2,2,1"}, []),
    ({"TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS": "1"}, ["TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1 lets code"]),
    ({"TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS": "0"}, []),
    ({"TORCH_TPU_LAUNCH_BLOCKING": "1"}, ["unset it outside a debugging session"]),
    ({"TORCH_TPU_INTERNAL_XLA_OPTIONS": "x"}, ["one of TorchTPU's internal knobs"]),
    ({"TORCH_TPU_DEFER_AND_FUZE": "1"}, ["reads no such variable (a typo?)"]),
])
def test_torch_tpu_variables_are_named_and_the_risky_ones_flagged(env, expected, site, tmp_path):
    result = check_torchtpu_env(context(site, tmp_path, env=env))
    assert [m for m in expected if not any(m in f.message for f in result.findings)] == []
    assert len(result.findings) == len(expected)
    assert result.status == ("skip" if not env else "warn" if expected else "ok")
    for name in env:
        assert name in result.detail


def _doctor(site, tmp_path, code: str, target: str | None = None) -> DoctorRequest:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "train.py").write_text(code)
    request = DoctorRequest(paths=[project], config=Config(), fmt=Format.JSON, target=target,
                            context=context(site, tmp_path, probe={}, smoke=False))
    return request


def test_on_a_torchtpu_host_the_code_scan_flags_torch_tpu_internal_calls(site, tmp_path, capsys):
    google_torchtpu(site)
    request = _doctor(site, tmp_path, "import torch\nimport torch_tpu\ntorch.tpu.synchronize()\n")
    code = run_doctor(request)
    report = json.loads(capsys.readouterr().out)
    assert report["summary"]["code"]["target"] == "torchtpu" and code == 1
    (internal,) = [f for f in report["findings"] if f["code"] == "TPU119"]
    assert "torch.accelerator.synchronize()" in internal["message"]
    assert internal["line"] == 3


def test_without_torchtpu_the_code_scan_keeps_the_project_target(site, tmp_path, capsys):
    request = _doctor(site, tmp_path, "import torch\nimport torch_tpu\ntorch.tpu.synchronize()\n")
    run_doctor(request)
    report = json.loads(capsys.readouterr().out)
    assert report["summary"]["code"]["target"] == "xla"
    assert not [f for f in report["findings"] if f["code"] == "TPU119"]


# -- the command ------------------------------------------------------------------------------
def test_doctor_on_this_machine_passes_on_xla_cpu(tmp_path, run_cli):
    pytest.importorskip("torch_xla")
    # Hazards only (a host read per step, a cuDNN flag that does nothing): warnings, so PASS.
    (tmp_path / "train.py").write_text(HAZARD_ONLY)
    proc = run_cli("doctor", "--format", "json", ".", cwd=tmp_path, env={"PJRT_DEVICE": "CPU"})
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in report["summary"]["checks"]}
    assert checks["smoke test"]["status"] == "ok" and "matmul on xla:0" in checks["smoke test"]["detail"]
    assert checks["device"]["detail"].startswith("PJRT_DEVICE=CPU -> CPU")
    assert [f["code"] for f in report["findings"] if f["path"]] == ["TPU120", "TPU501"]


HAZARD_ONLY = """import torch
import torch_xla
from torch.utils.data import DataLoader
torch.backends.cudnn.benchmark = True
device = torch_xla.device()
model = Net().to(device)
for x, y in loader():
    loss = model(x.to(device), y.to(device))
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    print(loss.item())
"""
# Fifteen CUDA idioms `tpukit migrate` fixes, each of which crashes on a TPU VM or leaves the
# work on the host: doctor passed this file before (exit 0) because every one was fixable.
FIFTEEN = """import torch
from torch.utils.data import DataLoader
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.cuda.set_device(0)
model = Net().cuda()
crit = torch.nn.CrossEntropyLoss().cuda()
opt = torch.optim.AdamW(model.parameters(), fused=True)
start = torch.cuda.Event(enable_timing=True)
Tensor = torch.cuda.FloatTensor
for x, y in batches():
    x, y = x.cuda(non_blocking=True), y.cuda()
    if x.is_cuda:
        start.record()
    loss = crit(model(x), y)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
state = torch.load("ckpt.pt", map_location="cuda")
with torch.inference_mode():
    model(torch.randn(2, 8).cuda())
print(torch.cuda.get_device_name(0), torch.cuda.device_count())
"""


def test_doctor_fails_on_idioms_that_crash_or_change_the_device(tmp_path, run_cli):
    (tmp_path / "train.py").write_text(FIFTEEN)
    proc = run_cli("doctor", "--no-smoke", "--format", "json", ".", cwd=tmp_path,
                   env={"PJRT_DEVICE": "CPU"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["summary"]["verdict"] == "fail"
    errors = [f for f in report["findings"] if f["path"] and f["severity"] == "error"]
    assert len(errors) >= 15 and {f["code"] for f in errors} >= {
        "TPU101", "TPU102", "TPU103", "TPU110", "TPU111", "TPU112", "TPU115", "TPU121",
        "TPU122", "TPU204", "TPU305"}
    # The hazards alone do not fail CI, unless --strict.
    (tmp_path / "train.py").write_text(HAZARD_ONLY)
    run_cli("doctor", "--no-smoke", ".", cwd=tmp_path, env={"PJRT_DEVICE": "CPU"}, check_rc=0)
    run_cli("doctor", "--no-smoke", "--strict", ".", cwd=tmp_path, env={"PJRT_DEVICE": "CPU"},
            check_rc=1)


def test_doctor_exit_codes(tmp_path, run_cli):
    (tmp_path / "train.py").write_text("import apex\nimport torch\nx = torch.zeros(1).cuda()\n")
    text = run_cli("doctor", "--no-smoke", ".", cwd=tmp_path, env={"PJRT_DEVICE": "CPU"})
    assert text.returncode == 1  # TPU901: a CUDA-only library is an error
    assert "train.py:1:1: TPU901" in text.stdout and "doctor: FAIL" in text.stdout
    (tmp_path / "train.py").write_text("import torch\nx = torch.zeros(1).cuda()\n")
    run_cli("doctor", "--no-smoke", ".", cwd=tmp_path, env={"PJRT_DEVICE": "CPU"}, check_rc=1)
    (tmp_path / "train.py").write_text(HAZARD_ONLY)
    run_cli("doctor", "--no-smoke", ".", cwd=tmp_path, env={"PJRT_DEVICE": "CPU"}, check_rc=0)
    run_cli("doctor", "--no-smoke", "--strict", ".", cwd=tmp_path, env={"PJRT_DEVICE": "CPU"}, check_rc=1)
    run_cli("doctor", "--no-smoke", "--require-tpu", "--no-code", cwd=tmp_path,
            env={"PJRT_DEVICE": "CPU"}, check_rc=1)
    run_cli("doctor", "missing_dir", cwd=tmp_path, check_rc=2)
    (tmp_path / "broken.py").write_text("import torch\ndef f(:\n    torch.cuda.synchronize()\n")
    broken = run_cli("doctor", "--no-smoke", ".", cwd=tmp_path, env={"PJRT_DEVICE": "CPU"}, check_rc=1)
    assert "broken.py:2:7: error: syntax error" in broken.stderr


def test_doctor_github_and_sarif(tmp_path, run_cli):
    (tmp_path / "t.py").write_text("import torch\ns = torch.cuda.Stream()\n")
    env = {"PJRT_DEVICE": "CPU", "XLA_USE_BF16": "1"}
    github = run_cli("doctor", "--no-smoke", "--format", "github", ".", cwd=tmp_path, env=env)
    lines = github.stdout.splitlines()
    assert any(line.startswith("::warning title=TPU005 (deprecated-env)::XLA_USE_BF16=1") for line in lines)
    assert any(line.startswith("::error file=t.py,line=2,col=5") for line in lines)
    sarif = json.loads(run_cli("doctor", "--no-smoke", "--format", "sarif", ".", cwd=tmp_path, env=env).stdout)
    import jsonschema

    from conftest import ROOT

    jsonschema.validate(sarif, json.loads((ROOT / "tests/data/sarif-schema-2.1.0.json").read_text()))


def test_doctor_honours_suppression_comments_and_strict_names_unused_ones(tmp_path, run_cli):
    (tmp_path / "train.py").write_text(
        "import torch\nx = torch.zeros(1).cuda()  # tpukit: ignore[TPU102]\n")
    proc = run_cli("doctor", "--no-smoke", "--format", "json", ".", cwd=tmp_path,
                   env={"PJRT_DEVICE": "CPU"})
    report = json.loads(proc.stdout)
    assert not [f for f in report["findings"] if f["code"] == "TPU102"]
    (silenced,) = report["summary"]["suppressed"]
    assert silenced["code"] == "TPU102" and silenced["suppressed_by"].startswith("line 2: ")
    assert proc.returncode == 0, proc.stdout   # the one error is silenced
    (tmp_path / "train.py").write_text("import torch\nx = 1  # tpukit: ignore[TPU102]\n")
    plain = json.loads(run_cli("doctor", "--no-smoke", "--format", "json", ".", cwd=tmp_path,
                               env={"PJRT_DEVICE": "CPU"}).stdout)
    assert not [f for f in plain["findings"] if f["code"] == "TPU009"]
    strict = run_cli("doctor", "--no-smoke", "--strict", "--format", "json", ".", cwd=tmp_path,
                     env={"PJRT_DEVICE": "CPU"})
    (unused,) = [f for f in json.loads(strict.stdout)["findings"] if f["code"] == "TPU009"]
    assert unused["line"] == 2 and strict.returncode == 1
