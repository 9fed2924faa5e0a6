"""Renderers: one list of findings, four formats (text, json, sarif, github); a run's summary
also as a table (run_summary) and HTML (html). No renderer imports a command (tpukit.run.command,
tpukit.migrate.command, ...): the commands import the renderers."""

from __future__ import annotations

from typing import TextIO

from tpukit.render.report import Format, Report, summary_dict

__all__ = ["Format", "Report", "render", "summary_dict"]


def render(report: Report, fmt: Format, out: TextIO, err: TextIO) -> None:
    from tpukit.render import github, json_format, sarif, text

    renderer = {
        Format.TEXT: text.render,
        Format.JSON: json_format.render,
        Format.SARIF: sarif.render,
        Format.GITHUB: github.render,
    }[fmt]
    renderer(report, out, err)
