"""Shell scripts next to the code: torchrun and `python -m torch.distributed.run|launch`
command lines start one process per GPU. They are reported (TPU414), never rewritten: a
launch line encodes cluster choices (hosts, ports, process counts) a person must make."""

from __future__ import annotations

import re
from pathlib import Path

from tpukit.findings import Finding, FixKind, Location
from tpukit.rules import load_rules

CODE = "TPU414"
_LAUNCH = re.compile(r"(?<![\w-])(torchrun|python[\d.]*\s+-m\s+torch\.distributed\.(?:run|launch))\b")
_NPROC = re.compile(r"--nproc[_-]per[_-]node[= ](\S+)")


def _advice(tool: str, per_node: str, target: str) -> str:
    if target == "torchtpu":
        # The recipe torch-tpu 0.2.0 ships: its distributed module, run as a script, calls
        # set_tpu_launch_env() and prints the variables as shell assignments (WORLD_SIZE is the
        # chips on this host, counted on the PCI bus, and NODE_RANK is always printed).
        return (f"`{tool}` starts one process per GPU{per_node}: TorchTPU keeps {tool}, one "
                "process per chip, once its launch environment (the TORCH_TPU_* variables) is "
                "exported: `eval \"$(python -m torch_tpu._internal.distributed.distributed)\"` "
                "sets TORCH_TPU_TOPOLOGY, WORLD_SIZE (the chips on this host) and NODE_RANK, then "
                f"`{tool} --nproc_per_node=$WORLD_SIZE --node_rank=$NODE_RANK ...`; from Python, "
                "`torch.tpu.distributed.set_tpu_launch_env()` in the parent does the same")
    return (f"`{tool}` starts one process per GPU{per_node}: on a TPU VM run the "
            "script with plain `python` after `tpukit migrate` (torch_xla.launch starts one "
            "process per TPU chip), or keep torchrun with `PJRT_DEVICE=TPU` and "
            "`--nproc_per_node` set to the chips per host")


def scan_shell(path: Path, display: str, target: str = "xla") -> list[Finding]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    rule = load_rules()[CODE]
    findings = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        match = _LAUNCH.search(line)
        if match is None:
            continue
        nproc = _NPROC.search(line)
        per_node = f" (`--nproc_per_node={nproc.group(1)}` counts GPUs)" if nproc else ""
        message = _advice(match.group(1), per_node, target)
        findings.append(Finding.from_rule(rule, Location(display, number, match.start(1) + 1), message,
                                          fix=FixKind.NONE))
    return findings
