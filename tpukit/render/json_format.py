"""The JSON report: a stable, documented schema (docs/json.md; a run's `summary`:
docs/run-summary.schema.json, made from tpukit.run.summary).

{"schema_version": 1, "tool": {"name", "version"}, "command": "migrate",
 "summary": {...}, "findings": [Finding.to_dict()], "errors": [{"path", "line", "col", "message"}]}
"""

from __future__ import annotations

import json
from typing import TextIO

from tpukit import __version__
from tpukit.render.report import summary_dict

SCHEMA_VERSION = 1


def as_dict(report) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "tpukit", "version": __version__},
        "command": report.command,
        "summary": summary_dict(report.summary),
        "findings": [f.to_dict() for f in report.findings],
        "errors": [
            {"path": e.path, "line": e.line, "col": e.col, "message": e.message}
            for e in report.errors
        ],
    }


def render(report, out: TextIO, err: TextIO) -> None:
    json.dump(as_dict(report), out, indent=2)
    out.write("\n")
