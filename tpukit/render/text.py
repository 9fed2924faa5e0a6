"""`path:line:col: CODE [*] message`, like ruff; colour only on a terminal."""

from __future__ import annotations

import linecache
from typing import TextIO

from rich.console import Console
from rich.text import Text

from tpukit.findings import Severity

STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def console(stream: TextIO) -> Console:
    # highlight off and soft wrap on: a finding is one line that editors and grep can parse.
    return Console(file=stream, highlight=False, soft_wrap=True, emoji=False)


def render(report, out: TextIO, err: TextIO) -> None:
    con = console(out)
    for finding in report.findings:
        if finding.applied and not report.show_applied:
            continue
        loc = finding.location
        line = Text()
        where = f"{loc.path}:{loc.line}:{loc.col}:" if loc.path else "environment:"
        line.append(where, style="bold")
        line.append(" ")
        line.append(finding.code, style=STYLE[finding.severity])
        line.append(" [*] " if finding.applied else " ")
        line.append(finding.message)
        con.print(line)
        if report.excerpts and loc.path:
            source = linecache.getline(loc.path, loc.line).rstrip()
            if source:
                con.print(Text(f"{loc.line:>6} | {source}", style="dim"))
    errors = console(err)
    for error in report.errors:
        errors.print(Text(str(error), style="red"))
    if report.summary_line:
        con.print(Text(report.summary_line, style="bold"))
