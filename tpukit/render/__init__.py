"""Renderers: one list of findings, four formats (text, json, sarif, github)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TextIO

from tpukit.findings import FileError, Finding


class Format(str, Enum):
    TEXT = "text"
    JSON = "json"
    SARIF = "sarif"
    GITHUB = "github"


@dataclass
class Report:
    """What a command hands to a renderer."""

    command: str
    findings: list[Finding]
    errors: list[FileError] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    summary_line: str = ""
    # Text output only: findings whose fix was applied are listed too.
    show_applied: bool = True
    # Text output only: the source line under each finding (the run report).
    excerpts: bool = False


def render(report: Report, fmt: Format, out: TextIO, err: TextIO) -> None:
    from tpukit.render import github, json_format, sarif, text

    renderer = {
        Format.TEXT: text.render,
        Format.JSON: json_format.render,
        Format.SARIF: sarif.render,
        Format.GITHUB: github.render,
    }[fmt]
    renderer(report, out, err)
