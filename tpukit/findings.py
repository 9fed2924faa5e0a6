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


@dataclass(frozen=True)
class Explanation:
    """Why a finding happened and what to change, as fields (every `tpukit run` finding has
    one): `cause`, the mechanism that made it; `fix`, the change to make (empty where there is
    nothing to change); `where`, the other lines involved besides the finding's own (the
    caller of a forward, the loader's collate_fn, the line two graphs first differ at). The
    evidence, the numbers measured, is the finding's `extra`."""

    cause: str = ""
    fix: str = ""
    where: tuple[Location, ...] = ()

    def to_dict(self) -> dict:
        return {"cause": self.cause, "fix": self.fix,
                "where": [{"path": w.path, "line": w.line} for w in self.where]}

    @classmethod
    def from_dict(cls, data: dict) -> "Explanation":
        return cls(data.get("cause", ""), data.get("fix", ""),
                   tuple(Location(w["path"], w["line"]) for w in data.get("where", ())))


def said(head: str, explanation: Explanation) -> str:
    """The one message convention: what happened (with its numbers), then its cause after a
    colon, then the change to make after "Fix:". Every message with an explanation is made
    here, so a reader (a person or `grep`) finds the three parts in the same places."""
    text = f"{head}: {explanation.cause}" if explanation.cause else head
    return f"{text}. Fix: {explanation.fix}" if explanation.fix else text


def _joined(first: str, second: str) -> str:
    return f"{first}; {second}" if first and second else first or second


@dataclass(frozen=True)
class Message:
    """A message in its three parts, as a migrate rule's file writes it (a `[...messages.KEY]`
    table of `what`, `cause`, `fix`): what the code at the line is or does, why that matters on
    the target, and the change (made, or to make). `str()` says it by `said`. A part of a
    message (a note a rule adds in one case) is a Message too: `a + b` appends `b.what` to
    `a.what` and joins the causes and the fixes with "; "."""

    what: str = ""
    cause: str = ""
    fix: str = ""

    def __add__(self, other: "Message") -> "Message":
        if not isinstance(other, Message):
            return NotImplemented
        return Message(self.what + other.what, _joined(self.cause, other.cause),
                       _joined(self.fix, other.fix))

    @property
    def explanation(self) -> Explanation:
        return Explanation(self.cause, self.fix)

    def __str__(self) -> str:
        return said(self.what, self.explanation)


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
    # cause, fix and other lines as fields; the message says them by `said`
    explanation: Explanation | None = None

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
            **({"explanation": self.explanation.to_dict()} if self.explanation else {}),
        }

    @classmethod
    def from_rule(cls, rule, location: Location, message: "str | Message | None" = None, *,
                  severity: Severity | None = None, target: str = "xla", **fields) -> "Finding":
        """The finding of `rule` (a tpukit.rules.Rule) at `location`: its code, name and severity
        (unless `severity`), its fix kind on `target` (unless `fix=`), its message on `target`
        (unless `message`; a Message gives its explanation too); other Finding fields
        (`applied`, `extra`) as keywords."""
        fields.setdefault("fix", rule.fix_for(target))
        if isinstance(message, Message):
            fields.setdefault("explanation", message.explanation)
            message = str(message)
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
                   applied=data.get("applied", False), extra=data.get("extra", {}),
                   explanation=(Explanation.from_dict(data["explanation"])
                                if data.get("explanation") else None))


@dataclass
class FileError:
    """The tool could not do its job on one file (syntax error, not UTF-8, read-only, ...)."""

    path: str
    message: str
    line: int = 1
    col: int = 1

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: error: {self.message}"
