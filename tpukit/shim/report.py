"""The runtime layer's call sites as findings (TPU707 redirected, TPU708 refused) and as
lines for a plain `python -m tpukit.shim` run."""

from __future__ import annotations

from pathlib import Path

from tpukit.config import display_path
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


def message(record: Redirect, ported: str | None = None) -> str:
    """`ported`: the migrate rule that would change the call's line, where the run checked
    the program (TPU704's check): then the program's call is one `tpukit migrate` ports."""
    site = f"{shown(record.path)}:{record.line}"
    text = " ".join(record.code.split())
    calls = f" ({record.count} calls)" if record.count > 1 else ""
    said = f"`{text}` ({record.api})" if text else f"`{record.api}`"
    change = fix(record, ported)
    if record.refused:
        where = "" if record.in_program or not record.program_path else (
            f" (reached from {shown(record.program_path)}:{record.program_line})")
        return (f"{said} at {site}{where} has no TPU meaning: {record.action}; "
                f"the layer raised instead of CUDA's driver error: {change}")
    if not record.in_program:
        where = (f"reached from {shown(record.program_path)}:{record.program_line}"
                 if record.program_path else "reached from no line of the program")
        return f"{said}, in code tpukit does not rewrite, {where}: {record.action}{calls}"
    if ported:
        return (f"{said} in the program: {record.action}; `tpukit migrate "
                f"{shown(record.path)}` ports this line ({ported}): run it (the layer covered "
                f"for the port here){calls}")
    if record.literal:
        return (f"{said} in the program names CUDA: {record.action}; "
                f"`tpukit migrate {shown(record.path)}` ports this line: run it (the layer "
                f"covered for the port here){calls}")
    return (f"{said} in the program got a CUDA device from a value (a "
            f"command-line option, a config file): {record.action}; {change}{calls}")


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
        out.append(finding(code, message(record, rule), (shown(record.path), record.line, record.col),
                       api=record.api, action=record.action, count=record.count,
                       in_program=record.in_program, literal=record.literal,
                       ported_by=rule,
                       program_path=shown(record.program_path) if record.program_path else None,
                       program_line=record.program_line, fix=fix(record, rule)))
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

