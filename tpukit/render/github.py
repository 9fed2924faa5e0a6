"""GitHub Actions workflow commands: `::warning file=..,line=..,col=..::message`."""

from __future__ import annotations

from typing import TextIO

from tpukit.findings import Severity

COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(kind: str, path: str, line: int, col: int, title: str, message: str, end=None) -> str:
    props = [f"file={escape_property(path)}", f"line={line}", f"col={col}"] if path else []
    if path and end is not None and end[0] is not None:
        props.append(f"endLine={end[0]}")
        if end[1] is not None:
            props.append(f"endColumn={end[1]}")
    props.append(f"title={escape_property(title)}")
    return f"::{kind} {','.join(props)}::{escape_data(message)}"


def render(report, out: TextIO, err: TextIO) -> None:
    for f in report.findings:
        if f.applied and not report.show_applied:
            continue
        loc = f.location
        out.write(
            annotation(
                COMMAND[f.severity],
                loc.path,
                loc.line,
                loc.col,
                f"{f.code} ({f.name})",
                f.message,
                (loc.end_line, loc.end_col),
            )
            + "\n"
        )
    for e in report.errors:
        out.write(annotation("error", e.path, e.line, e.col, "tpukit", e.message) + "\n")
    if report.summary_line:
        err.write(report.summary_line + "\n")
