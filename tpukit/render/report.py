"""What a command hands to a renderer: the report and its format (a leaf module: every renderer
imports it, it imports none of them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

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
    # The JSON `summary` object, or what makes it (`to_dict()`: a run's RunSummary).
    summary: Any = field(default_factory=dict)
    summary_line: str = ""
    # Text output only: findings whose fix was applied are listed too.
    show_applied: bool = True
    # Text output only: the source line under each finding (the run report).
    excerpts: bool = False


def summary_dict(summary: Any) -> dict:
    """A report's summary as the JSON object."""
    return summary.to_dict() if hasattr(summary, "to_dict") else summary
