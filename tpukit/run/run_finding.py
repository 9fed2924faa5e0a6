"""A finding of the run's analysis (TPU701-706): a Finding from its rule, with the --fail-on
kind it counts as."""

from __future__ import annotations

from dataclasses import dataclass

from tpukit.findings import Explanation, Finding, FixKind, Location, Severity, said
from tpukit.rules import load_rules

FAIL_ON = ("recompile", "fallback", "sync")


@dataclass
class RunFinding(Finding):
    """A finding of the run's analysis, with the --fail-on kind it counts as (one of FAIL_ON;
    None: it never fails the run, e.g. a long warm-up's recompile, a read outside the hot
    loop, advice)."""

    fails_on: str | None = None


def finding(code: str, head: str, where: tuple, severity: Severity | None = None,
            fails_on: str | None = None, *, cause: str = "", fix: str = "",
            also: tuple = (), **extra) -> RunFinding:
    """`head`: what happened, with the numbers measured; `cause`: why; `fix`: what to change;
    `where`: (path, line) or (path, line, col); `also`: the other (path, line)s involved;
    `extra`: the evidence (counts, times, shapes) as data. The message is `said` from them."""
    explanation = Explanation(cause, fix or "", tuple(Location(p, n) for p, n in also))
    return RunFinding.from_rule(load_rules()[code], Location(*where), said(head, explanation),
                                severity=severity, fix=FixKind.NONE, extra=extra,
                                fails_on=fails_on, explanation=explanation)
