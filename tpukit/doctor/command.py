"""`tpukit doctor`: environment checks, then the migrate rules in check mode over the code."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tpukit.config import Config
from tpukit.doctor.checks import CHECKS, CheckResult, DoctorContext
from tpukit.findings import Finding, Severity
from tpukit.migrate.files import Mode, run_jobs
from tpukit.render import Format, Report, render

STATUS_STYLE = {"ok": "green", "skip": "dim", "warn": "yellow", "fail": "bold red"}


@dataclass
class DoctorRequest:
    paths: list[Path]
    config: Config
    context: DoctorContext
    fmt: Format = Format.TEXT
    strict: bool = False
    code: bool = True
    jobs: int = 0
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    target: str | None = None  # the code scan's target (None: see scan_target)


def scan_target(request: DoctorRequest, checks: list[CheckResult]) -> str:
    """`--target`, else torchtpu on a host with Google's TorchTPU and no torch_xla (its code
    must call torch.accelerator, not torch.tpu's internal device API: TPU119), else the
    project's [tool.tpukit] target."""
    if request.target is not None:
        return request.target
    torchtpu = any("torchtpu" in c.facts for c in checks)
    if torchtpu and request.context.dist_version("torch-xla") is None:
        return "torchtpu"
    return request.config.target


def scan_code(request: DoctorRequest, target: str) -> tuple[list[Finding], list, int, list[dict]]:
    """The migrate rules in check mode: leftover CUDA idioms and hazards, at path:line:col;
    what `# tpukit: ignore` comments silenced (with --strict, a comment that silences nothing
    is a TPU009 warning, which --strict fails on)."""
    from tpukit.migrate.command import MigrateRequest, build_jobs

    migrate = MigrateRequest(
        paths=request.paths, config=replace(request.config, target=target), mode=Mode.CHECK,
        select=request.select, ignore=request.ignore, strict=request.strict,
    )
    jobs = build_jobs(migrate)
    results = list(run_jobs(jobs, request.jobs or 1))
    findings = [f for r in results for f in r.findings]
    errors = [r.error for r in results if r.error is not None]
    return findings, errors, len(results), [s for r in results for s in r.suppressed]


def _table(checks: list[CheckResult], code_row: tuple[str, str] | None, out) -> None:
    table = Table(title="tpukit doctor", show_lines=False)
    for column in ("group", "check", "status", "detail"):
        table.add_column(column, overflow="fold")
    for check in checks:
        status = check.status
        table.add_row("environment", check.name, f"[{STATUS_STYLE[status]}]{status}[/]", check.detail)
    if code_row:
        status, detail = code_row
        table.add_row("code", "CUDA idioms", f"[{STATUS_STYLE[status]}]{status}[/]", detail)
    Console(file=out, highlight=False).print(table)


def run_doctor(request: DoctorRequest) -> int:
    checks = [check(request.context) for check in CHECKS]
    env_findings = [f for c in checks for f in c.findings]
    target = scan_target(request, checks)
    code_findings, errors, files, suppressed = (scan_code(request, target) if request.code
                                                else ([], [], 0, []))
    code_row = None
    if request.code:
        manual = sum(f.needs_person for f in code_findings)
        worst = {f.severity for f in code_findings if f.needs_person or f.applied}
        status = "fail" if errors or Severity.ERROR in worst else "warn" if code_findings else "ok"
        code_row = (status, f"{files} Python file(s), target {target}: "
                            f"{len(code_findings)} finding(s), "
                            f"{sum(f.applied for f in code_findings)} fixable by `tpukit migrate`, "
                            f"{manual} need a person")
    findings = env_findings + code_findings
    # A file tpukit cannot read or parse is a failed code check, not a doctor failure.
    failed = bool(errors) or any(f.severity is Severity.ERROR for f in findings)
    warned = any(f.severity is Severity.WARNING for f in findings)
    verdict = "FAIL" if failed or (request.strict and warned) else "PASS"
    summary = {
        "verdict": verdict.lower(),
        "checks": [
            {"name": c.name, "status": c.status, "detail": c.detail} for c in checks
        ],
        "code": {"files": files, "findings": len(code_findings), "errors": len(errors),
                 "target": target},
    }
    if suppressed:  # findings `# tpukit: ignore` comments silenced, with the comment
        summary["suppressed"] = suppressed
    line = (f"doctor: {verdict}: {sum(c.status == 'fail' for c in checks)} environment check(s) "
            f"failed, {sum(c.status == 'warn' for c in checks)} warned; "
            f"{len(code_findings)} code finding(s)")
    report = Report("doctor", findings, errors, summary, line, show_applied=True)
    if request.fmt is Format.TEXT:
        _table(checks, code_row, sys.stdout)
    render(report, request.fmt, sys.stdout, sys.stderr)
    return 1 if verdict == "FAIL" else 0
