"""Environment checks: small named functions, each returning a CheckResult with findings.

Nothing here imports torch: versions come from package metadata, and whatever must import
torch_xla (import errors, the device, the smoke test) runs in `probe.py`, in a subprocess
with a timeout, so a hung runtime can never hang CI. Every input (environment variables,
/dev, where packages are looked up, the interpreter) comes from DoctorContext, which is how
the tests put a fake TPU, libtpu or torch_tpu in front of the checks.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Mapping

from tpukit.findings import Finding, FixKind, Location, Severity
from tpukit.rules import load_rules

XLA_RELEASE = "2.9.0"
SUPPORTED_PYTHON = ((3, 10), (3, 13))
DEPRECATED_ENV = {
    "XLA_USE_BF16": "silently casts every float32 tensor to bfloat16; use "
    '`torch.autocast("xla", dtype=torch.bfloat16)` or explicit dtypes',
    "XLA_DOWNCAST_BF16": "silently downcasts float32 and float64; use autocast or explicit dtypes",
    "XLA_USE_FP16": "no longer supported; TPUs compute in bfloat16 (use autocast)",
    "XRT_TPU_CONFIG": "belongs to the removed XRT runtime; PJRT replaced it (PJRT_DEVICE=TPU)",
    "GPU_NUM_DEVICES": "configures torch_xla's GPU runtime, not a TPU",
}
DEBUG_ENV = (
    "PT_XLA_DEBUG", "PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "XLA_IR_DEBUG", "XLA_HLO_DEBUG",
    "XLA_SAVE_TENSORS_FILE", "XLA_METRICS_FILE", "XLA_DUMP_HLO_GRAPH",
)
MULTIHOST_ENV = ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE")
# The TORCH_TPU_* variables torch-tpu 0.2.0 reads (the strings of its Python files and shared
# libraries: `strings -n 8 *.so | grep -oE "TORCH_TPU_[A-Z0-9_]+"`), less TORCH_TPU_INTERNAL_*,
# which are its developers' knobs. What each does, where the wheel says.
TORCHTPU_ENV = {
    "TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS": "makes torch.tpu's internal device API (is_available, "
    "device_count, synchronize, ...) warn instead of raise",
    "TORCH_TPU_TOPOLOGY": "the slice topology (set by torch.tpu.distributed.set_tpu_launch_env)",
    "TORCH_TPU_SLICEBUILDER_ADDRESSES": "the hosts' addresses (set by set_tpu_launch_env)",
    "TORCH_TPU_XPROF_SESSION_ID": "the profile session of a launch (set by set_tpu_launch_env)",
    "TORCH_TPU_DEVICES_PER_HOST": "ranks per host on a multi-host slice (default 8)",
    "TORCH_TPU_BASE_PORT": "the first port of the hosts' addresses",
    "TORCH_TPU_LOCAL_DEVICE_COORDS": "this host's chip coordinates",
    "TORCH_TPU_DEFER_AND_FUSE": "the fused eager mode",
    "TORCH_TPU_LAUNCH_BLOCKING": "waits for each op (the debug eager mode): slow",
    "TORCH_TPU_ENABLE_DEBUG_CHECKS": "extra checks at run time: slow",
    "TORCH_TPU_PROFILER_OUTPUT_DIR": "where TPU profiles are written",
    "TORCH_TPU_TIER2_COMPILATION_CACHE": "the compilation cache",
    "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": "the persistent compilation cache's folder",
    "TORCH_TPU_SPMD_HANDSHAKE_STAGE": "SPMD start-up",
    "TORCH_TPU_IS_OPTIMIZED_BUILD": "the build's own flag",
}
# Slow-down switches: left on outside a debugging session, every step pays for them.
TORCHTPU_DEBUG_ENV = ("TORCH_TPU_LAUNCH_BLOCKING", "TORCH_TPU_ENABLE_DEBUG_CHECKS")
ACCELERATOR_TYPE = re.compile(r"^v\d+[a-z]*(pod)?-\d+$")


@dataclass
class ProbeResult:
    data: dict = field(default_factory=dict)
    error: str | None = None  # the probe itself failed: timeout, crash


@dataclass
class DoctorContext:
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    dev_root: Path = Path("/dev")
    search_path: list[str] | None = None  # where packages are looked up (None: sys.path)
    python: str = sys.executable  # the interpreter the probe runs with
    probe_timeout: float = 180.0
    smoke: bool = True
    require_tpu: bool = False
    version_info: tuple[int, int, int] = tuple(sys.version_info[:3])  # type: ignore[assignment]

    def dist_version(self, *names: str) -> str | None:
        for name in names:
            wanted = _normal(name)
            for dist in importlib.metadata.distributions(path=self.search_path or sys.path):
                if _normal(dist.metadata.get("Name", "")) == wanted:
                    return dist.version
        return None

    def dist_of_module(self, module: str) -> tuple[str, str] | None:
        for dist in importlib.metadata.distributions(path=self.search_path or sys.path):
            top = (dist.read_text("top_level.txt") or "").split()
            files = [str(f).split("/")[0] for f in (dist.files or [])]
            if module in top or module in files:
                return dist.metadata.get("Name", "?"), dist.version
        return None

    @cached_property
    def probe(self) -> ProbeResult:
        command = [self.python, "-m", "tpukit.doctor.probe"] + ([] if self.smoke else ["--no-smoke"])
        env = dict(self.env)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        here = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
        try:
            proc = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=self.probe_timeout
            )
        except subprocess.TimeoutExpired:
            return ProbeResult(error=f"did not finish in {self.probe_timeout:.0f} s (a hung runtime?)")
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return ProbeResult(error=f"exited with {proc.returncode}: {tail}")
        return ProbeResult(json.loads(lines[-1]))


@dataclass
class CheckResult:
    name: str
    detail: str
    findings: list[Finding] = field(default_factory=list)
    skipped: bool = False
    facts: dict = field(default_factory=dict)  # what a later step reads (the TorchTPU version)

    @property
    def status(self) -> str:
        severities = {f.severity for f in self.findings}
        if Severity.ERROR in severities:
            return "fail"
        if Severity.WARNING in severities:
            return "warn"
        return "skip" if self.skipped else "ok"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _base(version: str) -> str:
    return version.split("+")[0]


def finding(code: str, message: str, severity: Severity | None = None) -> Finding:
    # the environment, not a file; a check's fix is the person's (the rule's fix kind is for code)
    return Finding.from_rule(load_rules()[code], Location(""), message, severity=severity,
                             fix=FixKind.NONE)


# -- the checks ---------------------------------------------------------------------------
def check_python(ctx: DoctorContext) -> CheckResult:
    version = ".".join(map(str, ctx.version_info))
    low, high = SUPPORTED_PYTHON
    result = CheckResult("python", f"Python {version}")
    if tuple(ctx.version_info[:2]) < low:
        result.findings.append(finding("TPU001", f"Python {version} is too old for torch 2.9; use Python 3.10-3.13"))
    elif tuple(ctx.version_info[:2]) > high:
        result.findings.append(
            finding("TPU001", f"Python {version}: torch_xla {XLA_RELEASE} publishes no wheel for it; use Python 3.10-3.13", Severity.WARNING)
        )
    return result


def check_packages(ctx: DoctorContext) -> CheckResult:
    torch = ctx.dist_version("torch")
    xla = ctx.dist_version("torch-xla", "torch_xla")
    vision = ctx.dist_version("torchvision")
    detail = f"torch {torch or '-'}, torch_xla {xla or '-'}, torchvision {vision or '-'}"
    result = CheckResult("torch + torch_xla", detail)
    fix = f"pip install torch=={XLA_RELEASE} torch-xla=={XLA_RELEASE}"
    if torch is None:
        result.findings.append(finding("TPU002", f"torch is not installed: {fix}"))
    if xla is None:
        result.findings.append(finding("TPU002", f"torch_xla is not installed: {fix}"))
    if torch and xla and _base(torch) != _base(xla):
        result.findings.append(
            finding("TPU002", f"torch {torch} with torch_xla {xla}: torch_xla {_base(xla)} is built "
                    f"against exactly torch {_base(xla)} (C++ ABI); pip install torch=={_base(xla)}")
        )
    if torch and vision:
        major, minor = (int(x) for x in _base(torch).split(".")[:2])
        expected = f"0.{minor + 15}" if major == 2 else None
        if expected and not _base(vision).startswith(expected + "."):
            result.findings.append(
                finding("TPU002", f"torchvision {vision} does not match torch {torch} (expected "
                        f"{expected}.x): its C++ ops fail to load; pip install torchvision=={expected}.0")
            )
    if torch and xla and not result.findings:
        error = ctx.probe.data.get("import_error") if not ctx.probe.error else None
        if error:
            result.findings.append(finding("TPU002", _explain_import_error(error, torch, xla)))
    return result


def _explain_import_error(error: str, torch: str, xla: str) -> str:
    if "undefined symbol" in error:
        return (
            f"importing torch_xla failed with an undefined symbol ({error[:120]}): a C++ ABI "
            f"mismatch; torch_xla {xla} must run with the torch build it was made for "
            f"(installed: torch {torch}). Reinstall both: pip install --force-reinstall "
            f"torch=={_base(xla)} torch-xla=={_base(xla)}"
        )
    return f"importing torch/torch_xla failed: {error[:300]}"


def check_device(ctx: DoctorContext) -> CheckResult:
    requested = ctx.env.get("PJRT_DEVICE")
    libtpu = ctx.dist_version("libtpu", "libtpu-nightly")
    chips = sorted(
        p.name for pattern in ("accel*", "vfio/[0-9]*") for p in ctx.dev_root.glob(pattern)
    )
    resolved = ctx.probe.data.get("pjrt_device") if not ctx.probe.error else None
    tpu_info = _tpu_info(ctx) if chips else None
    parts = [f"PJRT_DEVICE={requested or 'unset'} -> {resolved or '?'}"]
    parts.append(f"TPU chips: {', '.join(chips)}" if chips else "no TPU chips (/dev/accel*, /dev/vfio)")
    parts.append(f"libtpu {libtpu}" if libtpu else "no libtpu")
    if tpu_info:
        parts.append(tpu_info)
    result = CheckResult("device", "; ".join(parts))
    if chips and not libtpu:
        result.findings.append(finding("TPU003", "TPU chips are present but libtpu is not installed: "
                                       "pip install torch_xla[tpu]"))
    if requested and requested.upper() == "TPU" and not chips:
        result.findings.append(finding("TPU003", "PJRT_DEVICE=TPU but this machine has no TPU chips "
                                       "(/dev/accel*, /dev/vfio): use a TPU VM, or PJRT_DEVICE=CPU"))
    elif chips and resolved and resolved.upper() != "TPU":
        result.findings.append(finding("TPU003", f"a TPU is present but torch_xla runs on {resolved}: "
                                       "set PJRT_DEVICE=TPU", Severity.WARNING))
    elif not chips:
        if ctx.require_tpu:
            result.findings.append(finding("TPU003", "no TPU on this machine and --require-tpu was given"))
        else:
            result.findings.append(finding("TPU003", "no TPU here: torch_xla runs on XLA:CPU (a pass; "
                                           "--require-tpu makes this a failure)", Severity.INFO))
    return result


def _tpu_info(ctx: DoctorContext) -> str | None:
    exe = shutil.which("tpu-info", path=ctx.env.get("PATH"))
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe], capture_output=True, text=True, timeout=30)
    except (subprocess.TimeoutExpired, OSError):
        return "tpu-info did not answer"
    lines = [" ".join(line.split()) for line in proc.stdout.splitlines() if line.strip()]
    return "tpu-info: " + " | ".join(lines[:6]) if lines else None


def check_smoke_test(ctx: DoctorContext) -> CheckResult:
    if not ctx.smoke:
        return CheckResult("smoke test", "skipped (--no-smoke)", skipped=True)
    probe = ctx.probe
    data = probe.data
    if probe.error or "import_error" in data:
        reason = probe.error or data["import_error"]
        return CheckResult("smoke test", "did not run", [finding("TPU004", f"the device smoke test {reason}")])
    if "smoke_error" in data:
        return CheckResult("smoke test", "failed", [finding("TPU004", f"a 256x256 matmul on {data.get('device')} failed: {data['smoke_error'][:300]}")])
    detail = (
        f"256x256 matmul on {data.get('device')} ({', '.join(data.get('hardware', []))}): "
        f"{data.get('compiles', 0)} compile(s) {data.get('compile_s', 0):.2f} s, first run "
        f"{data.get('first_run_s', 0):.2f} s, cached run {1000 * data.get('cached_run_s', 0):.1f} ms"
    )
    result = CheckResult("smoke test", detail)
    if data.get("max_abs_error", 0.0) > 1e-2:
        result.findings.append(finding("TPU004", f"the matmul result differs from the CPU's by {data['max_abs_error']:.3g}"))
    return result


def check_env_vars(ctx: DoctorContext) -> CheckResult:
    result = CheckResult("environment variables", "")
    for name, why in DEPRECATED_ENV.items():
        if name in ctx.env:
            result.findings.append(finding("TPU005", f"{name}={ctx.env[name]}: {why}; unset it"))
    for name in DEBUG_ENV:
        if ctx.env.get(name, "0") not in ("", "0"):
            result.findings.append(finding("TPU005", f"{name}={ctx.env[name]} is a debugging aid that slows every step: unset it outside a debugging session"))
    result.detail = f"{len(result.findings)} deprecated or debug variable(s) set" if result.findings else "none deprecated or left on"
    return result


def check_compile_cache(ctx: DoctorContext) -> CheckResult:
    """The persistent compilation cache's folder, as `tpukit run` picks it: the user's
    XLA_PERSISTENT_CACHE_PATH, else TPUKIT_COMPILE_CACHE, else ~/.cache/tpukit/..."""
    from tpukit.run import compile_cache

    path, source = compile_cache.named_folder(ctx.env)
    if path is None:
        setting = ctx.env[compile_cache.SETTING_VARIABLE]
        return CheckResult("compile cache", f"off ({compile_cache.SETTING_VARIABLE}={setting})",
                           skipped=True)
    problem = _not_writable(Path(path))
    if source == "user":
        result = CheckResult("compile cache", f"XLA_PERSISTENT_CACHE_PATH={path}")
        fix = "point it at a writable folder"
        said = f"XLA_PERSISTENT_CACHE_PATH={path}"
    else:
        result = CheckResult("compile cache", f"tpukit run keeps compiled graphs in {path}")
        fix = f"set {compile_cache.SETTING_VARIABLE} to a writable folder (0 turns it off)"
        said = f"tpukit run's compile cache {path}"
    if problem:
        result.findings.append(finding("TPU006", f"{said} {problem}: {fix}"))
    return result


def _not_writable(path: Path) -> str | None:
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            return "has no existing parent folder"
        existing = existing.parent
    if not existing.is_dir():
        return f"is under {existing}, which is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"cannot be written ({exc.strerror or exc})"
    return None


def check_multihost(ctx: DoctorContext) -> CheckResult:
    present = {name: ctx.env[name] for name in MULTIHOST_ENV if ctx.env.get(name)}
    if not present:
        return CheckResult("multi-host", "single host (no TPU_WORKER_* variables)")
    result = CheckResult("multi-host", ", ".join(f"{k}={v}" for k, v in present.items()))
    missing = [name for name in MULTIHOST_ENV if name not in present]
    if missing:
        result.findings.append(finding("TPU007", f"{', '.join(present)} set but {', '.join(missing)} not: set all three or none"))
    hosts = [h for h in present.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    worker = present.get("TPU_WORKER_ID")
    if worker is not None:
        if not worker.isdigit():
            result.findings.append(finding("TPU007", f"TPU_WORKER_ID={worker} is not a number"))
        elif hosts and int(worker) >= len(hosts):
            result.findings.append(finding("TPU007", f"TPU_WORKER_ID={worker} but TPU_WORKER_HOSTNAMES lists {len(hosts)} host(s) (ids 0-{len(hosts) - 1})"))
    kind = present.get("TPU_ACCELERATOR_TYPE")
    if kind and not ACCELERATOR_TYPE.match(kind):
        result.findings.append(finding("TPU007", f"TPU_ACCELERATOR_TYPE={kind} does not look like a TPU slice (v4-8, v5litepod-16, v6e-8)", Severity.WARNING))
    return result


def check_torchtpu(ctx: DoctorContext) -> CheckResult:
    spec = importlib.machinery.PathFinder.find_spec("torch_tpu", ctx.search_path or sys.path)
    if spec is None:
        return CheckResult("torch_tpu", "not installed", skipped=True)
    folder = Path(spec.origin).parent if spec.origin else Path(list(spec.submodule_search_locations)[0])
    owner = ctx.dist_of_module("torch_tpu")
    google = (folder / "_internal" / "public_api.py").is_file() and (owner is None or _normal(owner[0]) == "torch-tpu")
    if not google:
        name = f"{owner[0]} {owner[1]}" if owner else "an unknown package"
        return CheckResult("torch_tpu", f"{name} at {folder}", [finding(
            "TPU008", f"the `torch_tpu` module at {folder} comes from {name}, not Google's TorchTPU "
            "(PyPI torch-tpu, which registers torch.tpu); uninstall it if you meant TorchTPU")])
    version = owner[1] if owner else "?"
    libtpu = ctx.dist_version("libtpu", "libtpu-nightly")
    result = CheckResult("torch_tpu", f"Google's TorchTPU {version} (registers the 'tpu' device "
                                      f"and torch.tpu), libtpu {libtpu or 'none'}",
                         facts={"torchtpu": version})
    torch = ctx.dist_version("torch")
    if torch and not ((2, 11) <= tuple(int(x) for x in _base(torch).split(".")[:2]) <= (2, 15)):
        result.findings.append(finding("TPU008", f"TorchTPU {version} needs torch 2.11-2.15, but torch {torch} is installed (torch_xla {XLA_RELEASE} needs torch {XLA_RELEASE}): keep them in separate virtual environments"))
    if libtpu is None or _version_tuple(libtpu) < (0, 0, 50):
        result.findings.append(finding("TPU008", f"TorchTPU needs libtpu >= 0.0.50 (installed: {libtpu or 'none'})"))
    return result


def check_torchtpu_env(ctx: DoctorContext) -> CheckResult:
    """The TORCH_TPU_* variables set: each named with what it does; a legacy-API switch, a
    debugging switch, an internal knob or a name torch-tpu 0.2.0 never reads is a finding."""
    present = {k: v for k, v in ctx.env.items() if k.startswith("TORCH_TPU_")}
    if not present:
        return CheckResult("TORCH_TPU_* variables", "none set", skipped=True)
    result = CheckResult("TORCH_TPU_* variables", "; ".join(
        f"{k}={v} ({TORCHTPU_ENV.get(k, 'internal' if k.startswith('TORCH_TPU_INTERNAL_') else 'unknown')})"
        for k, v in sorted(present.items())))
    for name, value in sorted(present.items()):
        if name == "TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS" and value not in ("", "0"):
            result.findings.append(finding("TPU008", f"{name}={value} lets code call torch.tpu's internal device API (torch.tpu.synchronize() and friends), which raises without it: `tpukit migrate --target torchtpu` rewrites those calls to torch.accelerator (TPU119); then unset it"))
        elif name in TORCHTPU_DEBUG_ENV and value not in ("", "0"):
            result.findings.append(finding("TPU008", f"{name}={value} {TORCHTPU_ENV[name]}: unset it outside a debugging session"))
        elif name.startswith("TORCH_TPU_INTERNAL_"):
            result.findings.append(finding("TPU008", f"{name}={value} is one of TorchTPU's internal knobs: its effect can change in any release; unset it unless TorchTPU's developers asked for it"))
        elif name not in TORCHTPU_ENV:
            result.findings.append(finding("TPU008", f"{name}={value}: torch-tpu 0.2.0 reads no such variable (a typo?)"))
    return result


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", _base(version))[:3])


CHECKS: list[Callable[[DoctorContext], CheckResult]] = [
    check_python,
    check_packages,
    check_device,
    check_smoke_test,
    check_env_vars,
    check_compile_cache,
    check_multihost,
    check_torchtpu,
    check_torchtpu_env,
]
