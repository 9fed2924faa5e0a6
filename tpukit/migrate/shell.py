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
        per_node = rule.say(target, "per_node", count=nproc.group(1)) if nproc else ""
        message = rule.say(target, "launch", tool=match.group(1), per_node=per_node)
        findings.append(Finding.from_rule(rule, Location(display, number, match.start(1) + 1), message,
                                          fix=FixKind.NONE))
    return findings
