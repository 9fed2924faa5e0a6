"""The one result type every command produces: a Finding at a location."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class FixKind(str, Enum):
    SAFE = "safe"  # applied by default
    UNSAFE = "unsafe"  # changes behaviour: applied only with --unsafe-fixes
    NONE = "none"  # a person has to act


@dataclass(frozen=True, order=True)
class Location:
    path: str
    line: int = 1
    col: int = 1  # 1-based, like ruff's text output
    end_line: int | None = None
    end_col: int | None = None


@dataclass
class Finding:
    code: str
    severity: Severity
    message: str
    location: Location
    name: str = ""
    fix: FixKind = FixKind.NONE
    # True when the produced source contains the fix (written, or shown by --diff/--check).
    applied: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def needs_person(self) -> bool:
        """Still needs a human after tpukit is done (info findings never do)."""
        return not self.applied and self.severity is not Severity.INFO

    @property
    def help(self) -> str:
        return f"tpukit rules {self.code}"

    def sort_key(self) -> tuple:
        return (self.location.path, self.location.line, self.location.col, self.code)

    def to_dict(self) -> dict:
        loc = self.location
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.value,
            "message": self.message,
            "path": loc.path,
            "line": loc.line,
            "col": loc.col,
            "end_line": loc.end_line,
            "end_col": loc.end_col,
            "fix": self.fix.value,
            "applied": self.applied,
            "help": self.help,
            **({"extra": self.extra} if self.extra else {}),
        }

    @classmethod
    def from_rule(cls, rule, location: Location, message: str | None = None, *,
                  severity: Severity | None = None, target: str = "xla", **fields) -> "Finding":
        """The finding of `rule` (a tpukit.rules.Rule) at `location`: its code, name and severity
        (unless `severity`), its fix kind on `target` (unless `fix=`), its message on `target`
        (unless `message`); other Finding fields (`applied`, `extra`) as keywords."""
        fields.setdefault("fix", rule.fix_for(target))
        return cls(rule.code, severity or rule.severity,
                   rule.message_for(target) if message is None else message, location,
                   name=rule.name, **fields)

    @classmethod
    def from_dict(cls, data: dict) -> "Finding":
        """The inverse of to_dict (a saved JSON report's finding)."""
        location = Location(data["path"], data["line"], data["col"], data.get("end_line"),
                            data.get("end_col"))
        return cls(data["code"], Severity(data["severity"]), data["message"], location,
                   name=data.get("name", ""), fix=FixKind(data.get("fix", "none")),
                   applied=data.get("applied", False), extra=data.get("extra", {}))


@dataclass
class FileError:
    """The tool could not do its job on one file (syntax error, not UTF-8, read-only, ...)."""

    path: str
    message: str
    line: int = 1
    col: int = 1

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: error: {self.message}"
