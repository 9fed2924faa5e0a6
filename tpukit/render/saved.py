"""`tpukit report FILE`: a JSON report saved by `--json` / `--format json` (of run, migrate or
doctor), read back into the Report the renderers take, so it can be shown again as text,
JSON, SARIF, GitHub annotations or (a run's) HTML. A partial run report, the one a killed run
leaves (`tpukit run --json`), reads like a finished one and says it is partial."""

from __future__ import annotations

import json
from pathlib import Path

from tpukit.findings import FileError, Finding
from tpukit.render import Report
from tpukit.render.json_format import SCHEMA_VERSION


class SavedReportError(Exception):
    """The file is not a tpukit JSON report: one line naming the file."""


def load_report(path: Path) -> Report:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SavedReportError(f"{path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f":{exc.lineno}:{exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise SavedReportError(f"{path}{where}: not a JSON report ({exc.__class__.__name__}: "
                               f"{str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or data.get("tool", {}).get("name") != "tpukit":
        raise SavedReportError(f"{path}: not a tpukit report (no \"tool\": {{\"name\": \"tpukit\"}})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise SavedReportError(f"{path}: schema_version {data.get('schema_version')!r}; this "
                               f"tpukit reads {SCHEMA_VERSION}")
    try:
        findings = [Finding.from_dict(f) for f in data["findings"]]
        errors = [FileError(e["path"], e["message"], e.get("line", 1), e.get("col", 1))
                  for e in data.get("errors", [])]
    except (KeyError, TypeError, ValueError) as exc:
        raise SavedReportError(f"{path}: a finding or error is malformed ({exc!r})") from None
    command = data.get("command", "")
    summary = data.get("summary") or {}
    return Report(command, findings, errors, summary, summary_line(command, summary),
                  show_applied=True, excerpts=command == "run")


def summary_line(command: str, summary: dict) -> str:
    """A run's summary line, made again from its summary; other commands' lines are not saved
    in their JSON, so none is shown."""
    if command == "run" and "steps" in summary:
        from tpukit.render.run_summary import summary_line as run_line

        return run_line(summary)
    return ""
