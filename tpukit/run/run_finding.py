"""A finding of the run's analysis (TPU701-706): a Finding from its rule, with the --fail-on
kind it counts as."""

from __future__ import annotations

from dataclasses import dataclass

from tpukit.findings import Finding, FixKind, Location, Severity
from tpukit.rules import load_rules

FAIL_ON = ("recompile", "fallback", "sync")


@dataclass
class RunFinding(Finding):
    """A finding of the run's analysis, with the --fail-on kind it counts as (one of FAIL_ON;
    None: it never fails the run, e.g. a long warm-up's recompile, a read outside the hot
    loop, advice)."""

    fails_on: str | None = None


def finding(code: str, message: str, where: tuple, severity: Severity | None = None,
            fails_on: str | None = None, **extra) -> RunFinding:
    """`where`: (path, line) or (path, line, col)."""
    return RunFinding.from_rule(load_rules()[code], Location(*where), message,
                                severity=severity, fix=FixKind.NONE, extra=extra,
                                fails_on=fails_on)
