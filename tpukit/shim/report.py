"""The runtime layer's call sites as findings (TPU707 redirected, TPU708 refused) and as
lines for a plain `python -m tpukit.shim` run."""

from __future__ import annotations

from pathlib import Path

from tpukit.config import display_path
from tpukit.findings import Explanation, said
from tpukit.shim.sites import Redirect


def shown(path: str | None) -> str:
    return "?" if path is None else display_path(Path(path))


def fix(record: Redirect, ported: str | None = None) -> str | None:
    """What to change for this call site (the finding's `fix`), None where nothing needs to:
    code tpukit does not rewrite, which the layer covers on every run."""
    if record.refused:
        return "ask `torch.cuda.is_available()` first (False on this host) or remove the call"
    if not record.in_program:
        return None
    if ported or record.literal:
        return f"run `tpukit migrate {shown(record.path)}`: it ports this line"
    return "pass the XLA device (e.g. `--device xla`) to say what the program runs on"


def parts(record: Redirect, ported: str | None = None) -> tuple[str, str, str]:
    """(what happened, its cause, the fix) of one call site, for a finding's head and
    explanation. `ported`: the migrate rule that would change the call's line, where the run
    checked the program (TPU704's check): then the program's call is one `tpukit migrate`
    ports."""
    site = f"{shown(record.path)}:{record.line}"
    text = " ".join(record.code.split())
    calls = f" ({record.count} calls)" if record.count > 1 else ""
    what = f"`{text}` ({record.api})" if text else f"`{record.api}`"
    change = fix(record, ported) or ""
    if record.refused:
        where = "" if record.in_program or not record.program_path else (
            f" (reached from {shown(record.program_path)}:{record.program_line})")
        return (f"{what} at {site}{where} has no TPU meaning{calls}",
                f"{record.action}; the layer raised instead of CUDA's driver error", change)
    if not record.in_program:
        where = (f"reached from {shown(record.program_path)}:{record.program_line}"
                 if record.program_path else "reached from no line of the program")
        return f"{what}, in code tpukit does not rewrite, {where}{calls}", record.action, change
    covered = f"{record.action} (the layer covered for the port here"
    if ported:
        return (f"{what} in the program{calls}",
                f"{covered}; `tpukit migrate` ports this line ({ported}))", change)
    if record.literal:
        return f"{what} in the program names CUDA{calls}", f"{covered})", change
    return (f"{what} in the program got a CUDA device from a value (a command-line option, a "
            f"config file){calls}", record.action, change)


def message(record: Redirect, ported: str | None = None) -> str:
    """The call site said in one line (`tpukit run`'s stderr, the finding's message)."""
    head, cause, change = parts(record, ported)
    return said(head, Explanation(cause, change))


def findings(records: list[Redirect], ported: dict | None = None) -> list:
    """`ported`: {(resolved path, line): rule code} of the program lines the migrate rules
    would still change."""
    from tpukit.run.run_finding import finding

    out = []
    for record in records:
        code = "TPU707"  # redirected
        if record.refused:
            code = "TPU708"
        rule = (ported or {}).get((_resolved(record.path), record.line))
        head, cause, change = parts(record, rule)
        out.append(finding(code, head, (shown(record.path), record.line, record.col),
                           cause=cause, fix=change, api=record.api, action=record.action,
                           count=record.count, in_program=record.in_program,
                           literal=record.literal, ported_by=rule,
                           program_path=(shown(record.program_path) if record.program_path
                                         else None),
                           program_line=record.program_line))
    return out


def _resolved(path: str) -> str:
    try:
        return str(Path(path).resolve())
    except OSError:
        return path


def describe(records: list[Redirect]) -> list[str]:
    """One line per call site, for stderr."""
    return [f"{'refused' if r.refused else 'redirected'} ({r.count}x): {message(r)}"
            for r in records]

