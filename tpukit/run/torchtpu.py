"""`tpukit run` on the torchtpu target: the script runs on TorchTPU (`import torch_tpu`, device
"tpu") in the eager mode asked for. TorchTPU needs a real TPU and libtpu; without them the run
stops before the script with one line that says so.

The target is `--target torchtpu`, else a script that imports torch_tpu, else
`[tool.tpukit] target` in the script's pyproject.toml, else xla. The step analysis of the xla
target (recompiles, CPU fallbacks, host reads) reads torch_xla's debug output and counters;
TorchTPU is eager and has neither, so this target reports the outcome and wall time only.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from glob import glob
from pathlib import Path

from tpukit.config import DEFAULT_EAGER_MODE, EAGER_MODES, Config, ConfigError, load_config

_IMPORTS_TORCH_TPU = re.compile(r"^\s*(import|from)\s+torch_tpu\b", re.MULTILINE)


def tpu_chips() -> list[str]:
    return glob("/dev/accel*") + glob("/dev/vfio/[0-9]*")


def imports_torch_tpu(script: str | None) -> bool:
    if script is None:
        return False
    try:
        return bool(_IMPORTS_TORCH_TPU.search(Path(script).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError):
        return False


def _config(script: str | None) -> Config:
    try:
        return load_config(Path(script).resolve().parent if script else Path.cwd())
    except ConfigError:
        return Config()  # a broken config is migrate's to report; the run goes on


def resolve_target(requested: str | None, script: str | None) -> str:
    if requested:
        return requested
    if imports_torch_tpu(script):
        return "torchtpu"
    return _config(script).target


def resolve_eager_mode(requested: str | None, script: str | None) -> str:
    """--eager-mode, else `[tool.tpukit] eager-mode`, else fused."""
    return requested or _config(script).eager_mode or DEFAULT_EAGER_MODE


def unavailable(chips: list[str] | None = None) -> str | None:
    """Why TorchTPU cannot run here, or None when it can."""
    installed = importlib.util.find_spec("torch_tpu") is not None
    chips = tpu_chips() if chips is None else chips
    if installed and chips:
        return None
    missing = []
    if not installed:
        missing.append("torch_tpu is not installed (pip install torch-tpu; it needs "
                       "torch>=2.11 and libtpu)")
    if not chips:
        missing.append("this machine has no TPU chip (/dev/accel*, /dev/vfio)")
    return ("the torchtpu target needs a TPU: " + " and ".join(missing)
            + ". Run it on a TPU VM, or migrate with --target xla and run it here on XLA:CPU")


def set_eager_mode(mode: str) -> None:
    """Sets the process's eager mode through the property: `torch.tpu.set_eager_mode(m)` is a
    context manager (checked against torch-tpu 0.2.0), and a bare call sets nothing."""
    import torch
    import torch_tpu  # noqa: F401  (registers the "tpu" device and torch.tpu)

    torch.tpu.eager_mode = getattr(torch.tpu.EagerMode, EAGER_MODES[mode])


def run_torchtpu(request, chips: list[str] | None = None) -> tuple[dict, object]:
    """Runs the script on TorchTPU; (summary, outcome). Raises ValueError with the reason when
    TorchTPU cannot run here."""
    from tpukit.run.script import run_target

    reason = unavailable(chips)
    if reason is not None:
        raise ValueError(reason)
    mode = resolve_eager_mode(request.eager_mode, request.script)
    set_eager_mode(mode)
    start = time.perf_counter()
    outcome = run_target(request.script, request.module, request.args, ())
    wall = time.perf_counter() - start
    sys.stdout.flush()
    summary = {
        "script": request.script or f"-m {request.module}", "args": request.args,
        "target": "torchtpu", "device": "tpu", "eager_mode": mode,
        "eager_mode_member": EAGER_MODES[mode], "outcome": outcome.kind,
        "exit_code": outcome.exit_code, "error": outcome.error, "wall_s": round(wall, 6),
        "step_analysis": "not available on the torchtpu target (torch_xla's debug output and "
                         "counters do not exist on TorchTPU's eager runtime)",
    }
    return summary, outcome
