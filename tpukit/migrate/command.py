"""`tpukit migrate`: files -> findings, changes and an exit code (ruff's: 0, 1, 2)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rich.progress import Progress

from tpukit.errors import UsageError
from tpukit.atomic import remove_stale_temp_files
from tpukit.config import Config, real_path
from tpukit.config import display_path
from tpukit.findings import FileError
from tpukit.migrate.files import (
    FileResult,
    Job,
    Mode,
    _excluded,
    discover,
    run_jobs,
)
from tpukit.migrate.local_imports import local_modules
from tpukit.migrate.ownership import Owner, Ownership
from tpukit.migrate.transforms.base import check_tables
from tpukit.render import Format, Report, render
from tpukit.rules import select_rules

PROGRESS_MIN_FILES = 20




@dataclass
class MigrateRequest:
    paths: list[Path]
    config: Config
    mode: Mode = Mode.WRITE
    out_dir: Path | None = None
    fmt: Format = Format.TEXT
    jobs: int = 0  # 0: one per core
    quiet: bool = False
    exit_zero: bool = False
    show_fixes: bool = False
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    # A named script's local modules (local_imports.py) are migrated with it.
    follow_imports: bool = True
    strict: bool = False  # also report suppression comments that silence nothing (TPU009)
    followed: list[Path] = field(default_factory=list)  # filled by build_jobs
    # Folders of someone else's code (--library), on top of the config's `library`.
    library: list[Path] = field(default_factory=list)
    library_mode: bool = False  # --library-mode (or the config's `library-mode`)
    # Files found but not migrated, someone else's code (ownership.py): (path, why).
    foreign: list[tuple[Path, str]] = field(default_factory=list)  # filled by build_jobs
    framework: list[Path] = field(default_factory=list)  # PyTorch's own packages, left out


def _mirror(path: Path, base: Path, out_dir: Path) -> Path:
    return out_dir / real_path(path).relative_to(base)


def _base_of(paths: list[Path]) -> Path:
    folders = [real_path(p) if p.is_dir() else real_path(p).parent for p in paths]
    return Path(os.path.commonpath([str(f) for f in folders]))


def _selection(request: MigrateRequest) -> tuple[list[str], list[str]]:
    """(select, ignore) prefixes. The command line wins: its --select replaces the config's
    select and ignore (as ruff)."""
    if request.select:
        return request.select, request.ignore
    return request.config.select, request.ignore or request.config.ignore


def ownership_of(request: MigrateRequest) -> Ownership:
    """What the user said about whose code is what: the command line's and the config's."""
    cfg = request.config
    folders = [cfg.root / f for f in cfg.library] + list(request.library)
    return Ownership(library_folders=tuple(real_path(f) for f in folders),
                     library_mode=request.library_mode or cfg.library_mode)


def _imported(request: MigrateRequest, exclude: list[str]) -> list[Path]:
    """The local modules the named scripts import, beside them or inside a folder named with
    them: the user's program, ported with it."""
    folders = [p for p in request.paths if p.is_dir()]
    found: dict[Path, Path] = {}
    for path in request.paths:
        if path.is_dir() or path.suffix != ".py":
            continue
        for module in local_modules(path, folders):
            if not _excluded(module, exclude, request.config.root):
                found.setdefault(real_path(module), module)
    return list(found.values())


def _followed(imported: list[Path], files: list[Path]) -> list[Path]:
    """The imported modules not among `files` already: a port of `train.py` that left the
    `model.py` it imports on CUDA would still fail."""
    known = {real_path(f) for f in files}
    return [m for m in imported if real_path(m) not in known]


def build_jobs(request: MigrateRequest) -> list[Job]:
    missing = [str(p) for p in request.paths if not p.exists() and not p.is_symlink()]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    cfg = request.config
    exclude = list(cfg.exclude)
    if request.out_dir is not None:
        out = real_path(request.out_dir)
        exclude.append(out.as_posix())
    files = discover(request.paths, exclude, cfg.root, skipped=request.framework)
    imported = _imported(request, exclude)
    if request.follow_imports:
        request.followed = _followed(imported, files)
        files += request.followed
    if request.out_dir is not None:
        files = [f for f in files if out not in real_path(f).parents]
    rules = select_rules(*_selection(request))
    check_tables(rules)  # a broken rule file is one error before any file, not one per file
    codes = tuple(r.code for r in rules)
    base = _base_of(request.paths)
    ownership = ownership_of(request)
    owners = {}
    for f in files:
        owner, why = ownership.of(f)
        if owner is Owner.FOREIGN:
            request.foreign.append((f, why))
        else:
            owners[f] = owner
    received, modules = _program_facts(request, list(owners))
    return [
        Job(
            path=f,
            display=display_path(f),
            mode=request.mode,
            codes=codes,
            target=cfg.target,
            eager_mode=cfg.eager_mode if cfg.target == "torchtpu" else None,
            unsafe_fixes=cfg.unsafe_fixes,
            strict=request.strict,
            owner=owner,
            received=received.get(f),
            module_name=modules.get(f, ""),
            out_path=_mirror(f, base, request.out_dir) if request.out_dir else None,
        )
        for f, owner in owners.items()
    ]


# Above this many files the cross-module pre-pass (a second parse of each) is skipped: each
# file is then ported on what it says itself.
PROGRAM_FACTS_MAX_FILES = 400


def _program_facts(request: MigrateRequest, files: list[Path]):
    """What the program's modules say about one another (analysis/program.py), for files
    that are modules of one program: the named scripts' folders and the named folders are
    where their imports are looked up."""
    if not 2 <= len(files) <= PROGRAM_FACTS_MAX_FILES:
        return {}, {}
    from tpukit.migrate.analysis.program import module_name, program_facts

    roots = list(dict.fromkeys(
        real_path(p) if p.is_dir() else real_path(p).parent for p in request.paths))
    packages = [r.parent for r in roots if (r / "__init__.py").is_file()]
    roots += [p for p in packages if p not in roots]
    modules = {f: m for f in files if (m := module_name(f, roots))}
    return program_facts(list(modules), roots), modules


def _collect(jobs: list[Job], workers: int, show_progress: bool) -> list[FileResult]:
    results = []
    if not show_progress:
        return list(run_jobs(jobs, workers))
    with Progress(transient=True, console=None) as progress:
        task = progress.add_task("migrating", total=len(jobs))
        for result in run_jobs(jobs, workers):
            results.append(result)
            progress.advance(task)
    return results


def summarize(request: MigrateRequest, results: list[FileResult],
              extra: list | None = None) -> tuple[dict, str]:
    """`extra`: findings outside the Python files (launch lines in shell scripts)."""
    findings = [f for r in results for f in r.findings] + list(extra or [])
    changed = sum(r.changed for r in results)
    # A file that could not be written (read-only, say) has no fixes applied.
    fixes = sum(f.applied for r in results if r.error is None for f in r.findings) + sum(
        f.applied for f in extra or [])
    manual = sum(f.needs_person for f in findings)
    errors = sum(r.error is not None for r in results)
    summary = {
        "files": len(results),
        "files_changed": changed,
        "fixes": fixes,
        "needs_person": manual,
        "errors": errors,
        "mode": request.mode.value,
    }
    suppressed = [s for r in results for s in r.suppressed]
    if suppressed:  # findings `# tpukit: ignore` comments silenced, with the comment
        summary["suppressed"] = suppressed
    if request.framework:
        summary["framework_packages_skipped"] = [display_path(p) for p in request.framework]
    if request.foreign:
        summary["library_files_left"] = [
            {"path": display_path(p), "why": why} for p, why in request.foreign]
    if not results:
        return summary, "No Python files found." + _foreign_note(request) + _framework_note(request)
    verb = {
        Mode.WRITE: "Changed",
        Mode.OUT: "Migrated copies written;",
        Mode.DIFF: "Would change",
        Mode.CHECK: "Would change",
    }[request.mode]
    applied = "fixes applied" if request.mode in (Mode.WRITE, Mode.OUT) else "fixes"
    line = (
        f"{verb} {changed} of {len(results)} files ({fixes} {applied}); "
        f"{manual} finding{'s' if manual != 1 else ''} need{'s' if manual == 1 else ''} a person"
    )
    if errors:
        line += f"; {errors} file{'s' if errors != 1 else ''} could not be migrated"
    if suppressed:
        line += f"; {len(suppressed)} suppressed by comments"
    line += "."
    if request.followed:
        names = [display_path(p) for p in request.followed]
        summary["local_modules"] = names
        line += (f" With the local module{'s' if len(names) != 1 else ''} the named "
                 f"script{'s import' if len(request.paths) != 1 else ' imports'}: {', '.join(names)} "
                 "(--no-follow-imports: only the files named).")
    return summary, line + _foreign_note(request) + _framework_note(request)


def _foreign_note(request: MigrateRequest) -> str:
    if not request.foreign:
        return ""
    count = len(request.foreign)
    first, why = request.foreign[0]
    return (f" Left {count} file{'s' if count != 1 else ''} of someone else's code as "
            f"{'they are' if count != 1 else 'it is'} ({display_path(first)}: {why}"
            f"{', ...' if count > 1 else ''}); --library-mode ports a library's own code.")


def _framework_note(request: MigrateRequest) -> str:
    if not request.framework:
        return ""
    names = [display_path(p) for p in request.framework]
    return (f" Left out PyTorch's own package{'s' if len(names) != 1 else ''} {', '.join(names)}:"
            " tpukit ports code that uses torch, not torch itself (name the folder to migrate it"
            " anyway).")


def shell_findings(request: MigrateRequest) -> tuple[list, int]:
    """TPU414 over the *.sh files named or under the folders given, if selected."""
    from tpukit.migrate.shell import CODE, scan_shell

    select, ignore = _selection(request)
    if (select and not any(CODE.startswith(p) for p in select)) or any(
            CODE.startswith(p) for p in ignore):
        return [], 0
    cfg = request.config
    scripts = discover(request.paths, list(cfg.exclude), cfg.root, suffix=".sh")
    return ([f for s in scripts for f in scan_shell(s, display_path(s), cfg.target)],
            len(scripts))


def run_migrate(request: MigrateRequest) -> int:
    jobs = build_jobs(request)
    if request.mode in (Mode.WRITE, Mode.OUT):
        # What a run killed between writing a temporary file and renaming it left behind.
        remove_stale_temp_files(
            (j.out_path if request.mode is Mode.OUT else j.path).parent for j in jobs)
    workers = request.jobs or os.cpu_count() or 1
    show_progress = (
        request.fmt is Format.TEXT and sys.stderr.isatty() and len(jobs) >= PROGRESS_MIN_FILES
    )
    results = _collect(jobs, workers, show_progress)
    if request.mode is Mode.DIFF:
        for result in results:
            if result.diff:
                sys.stdout.write(result.diff)
    shell, scripts = shell_findings(request)
    summary, line = summarize(request, results, shell)
    findings = [f for r in results for f in r.findings] + shell
    if scripts:
        summary["shell_scripts"] = scripts
    errors: list[FileError] = [r.error for r in results if r.error is not None]
    report = Report(
        command="migrate",
        findings=[] if request.quiet else findings,
        errors=errors,
        summary=summary,
        summary_line=line,
        show_applied=request.show_fixes or request.mode in (Mode.CHECK, Mode.DIFF),
    )
    if request.fmt is not Format.TEXT:
        report.findings = findings
    # With --diff, stdout is the patch alone (pipe it to `patch -p1` or `git apply`).
    out = sys.stderr if request.mode is Mode.DIFF and request.fmt is Format.TEXT else sys.stdout
    render(report, request.fmt, out, sys.stderr)
    if errors:
        return 2
    if request.exit_zero:
        return 0
    would_change = request.mode in (Mode.CHECK, Mode.DIFF) and summary["files_changed"] > 0
    return 1 if would_change or summary["needs_person"] > 0 else 0
