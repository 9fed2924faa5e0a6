"""Inline suppressions, like ruff's `noqa`: a comment that silences findings.

    x = loss.item()  # tpukit: ignore[TPU501]          this line, these codes
    x = loss.item()  # tpukit: ignore                  this line, every code
    # tpukit: ignore-file[TPU302, TPU5]                the whole file (a code or a code prefix)

A finding is suppressed when a comment on one of its lines (first to last) or a file-wide
comment names its code (or a prefix of it, or nothing). migrate neither reports nor applies a
suppressed fix; doctor and run leave the finding out of their verdict. Suppressed findings are
listed in JSON output (`suppressed`); a comment that silenced nothing is reported with
`--strict` (TPU009).
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field

from tpukit.findings import Finding, Location

_COMMENT = re.compile(r"#\s*tpukit:\s*(?P<kind>ignore-file|ignore)\b(?:\[(?P<codes>[^\]]*)\])?",
                      re.IGNORECASE)
_CODE = re.compile(r"^TPU\d{0,3}$")
UNUSED_CODE = "TPU009"


@dataclass(frozen=True)
class Suppression:
    line: int            # where the comment is
    col: int
    codes: tuple[str, ...]   # codes or code prefixes; empty: every code
    whole_file: bool
    text: str            # the comment as written

    def names(self, code: str) -> bool:
        return not self.codes or any(code.startswith(c) for c in self.codes)

    def describe(self) -> str:
        return f"line {self.line}: {self.text}"


@dataclass
class Suppressions:
    """The suppression comments of one file, and which of them silenced something."""

    items: list[Suppression] = field(default_factory=list)
    bad: list[tuple[int, int, str]] = field(default_factory=list)   # (line, col, what is wrong)
    used: set[Suppression] = field(default_factory=set)

    @classmethod
    def from_source(cls, source: str) -> "Suppressions":
        found = cls()
        if "tpukit" not in source:
            return found
        for line, col, text in _comments(source):
            match = _COMMENT.search(text)
            if match is None:
                continue
            raw = match["codes"]
            codes = tuple(c.strip().upper() for c in raw.split(",") if c.strip()) if raw else ()
            wrong = [c for c in codes if not _CODE.match(c)]
            if wrong:
                found.bad.append((line, col + match.start() + 1, f"not a tpukit code: {', '.join(wrong)}"))
                codes = tuple(c for c in codes if _CODE.match(c))
                if not codes:
                    continue
            found.items.append(Suppression(line, col + match.start() + 1, codes,
                                           match["kind"].lower() == "ignore-file", match.group(0)))
        return found

    def __bool__(self) -> bool:
        return bool(self.items)

    def covering(self, code: str, line: int, end_line: int | None = None) -> Suppression | None:
        """The comment that silences `code` on lines line..end_line, and marks it used."""
        last = max(line, end_line or line)
        for s in self.items:
            if s.names(code) and (s.whole_file or line <= s.line <= last):
                self.used.add(s)
                return s
        return None

    def unused(self) -> list[Suppression]:
        return [s for s in self.items if s not in self.used]


def _comments(source: str) -> list[tuple[int, int, str]]:
    """(line, col, text) of each comment; a file tokenize rejects is read line by line (a `#`
    inside a string may then be taken for a comment: a suppression there is harmless)."""
    try:
        return [(tok.start[0], tok.start[1], tok.string)
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        out = []
        for number, text in enumerate(source.splitlines(), 1):
            at = text.find("#")
            if at >= 0:
                out.append((number, at, text[at:]))
        return out


def _split(findings: list[Finding], of_path) -> tuple[list[Finding], list[dict]]:
    """(kept, suppressed) in the findings' order; `of_path(path)`: that file's Suppressions."""
    kept, suppressed = [], []
    for f in findings:
        sup = of_path(f.location.path)
        s = sup.covering(f.code, f.location.line, f.location.end_line) if sup else None
        if s is None:
            kept.append(f)
        else:
            suppressed.append({**f.to_dict(), "suppressed_by": s.describe()})
    return kept, suppressed


def split(findings: list[Finding], suppressions: Suppressions) -> tuple[list[Finding], list[dict]]:
    """(kept, suppressed) by one file's comments: a suppressed finding as its JSON dict plus
    `suppressed_by`."""
    if not suppressions:
        return findings, []
    return _split(findings, lambda _path: suppressions)


def split_files(findings: list[Finding]) -> tuple[list[Finding], list[dict]]:
    """`split` over findings of many files, each file's comments read once (a finding whose
    file cannot be read as Python source is kept)."""
    by_path: dict[str, Suppressions] = {}
    for path in {f.location.path for f in findings}:
        if not path.endswith(".py"):
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                by_path[path] = Suppressions.from_source(handle.read())
        except (OSError, UnicodeDecodeError):
            continue
    return _split(findings, by_path.get)


def unused_findings(path: str, suppressions: Suppressions) -> list[Finding]:
    """TPU009 for each comment that silenced nothing, and each that names no tpukit code."""
    from tpukit.rules import load_rules

    rule = load_rules()[UNUSED_CODE]
    out = []
    for s in suppressions.unused():
        what = f"[{', '.join(s.codes)}]" if s.codes else ""
        scope = "in this file" if s.whole_file else "on this line"
        out.append(Finding.from_rule(rule, Location(path, s.line, s.col),
                                     f"`{s.text}` silences nothing: no finding{' of ' + what if what else ''} "
                                     f"{scope}; remove it"))
    for line, col, wrong in suppressions.bad:
        out.append(Finding.from_rule(rule, Location(path, line, col),
                                     f"a `# tpukit: ignore[...]` comment with {wrong}: codes look like TPU501"))
    return out
