"""Files in, results out: discovery, a worker pool, atomic writes, and per-file errors.

A file that cannot be migrated (syntax error, not UTF-8, binary, unreadable, read-only) gets
one error line and stays untouched; the other files are still done.
"""

from __future__ import annotations

import difflib
import fnmatch
import io
import os
import stat
import tokenize
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Iterator

import libcst as cst

from tpukit.atomic import atomic_write
from tpukit.config import real_path
from tpukit.findings import FileError, Finding
from tpukit.migrate.engine import MigrateOptions, MigrationBug, compiles, migrate_source
from tpukit.migrate.ownership import Owner
from tpukit.rules import load_rules

SKIP_DIRS = {".venv", "venv", "__pycache__", "node_modules", "site-packages", ".tox", ".git"}
# PyTorch's own packages, found inside a folder being walked (a vendored or unpacked torch):
# tpukit ports code that uses torch, not torch. Rewriting torch itself breaks `import torch`
# (torch/fx/experimental/const_fold.py, imported by torch/__init__, would import torch_xla,
# which imports torch) and turns its CUDA kernels' own checks (Inductor, torch.testing) into
# XLA ones. A folder named on the command line is still taken as it is.
FRAMEWORK_PACKAGES = {"torch", "torch_xla", "torch_tpu", "functorch", "torchgen"}


def framework_package(folder: Path) -> bool:
    """Is `folder` one of PyTorch's own packages (a package folder with one of their names)?"""
    return folder.name in FRAMEWORK_PACKAGES and (folder / "__init__.py").is_file()


class Mode(str, Enum):
    WRITE = "write"  # rewrite files in place
    OUT = "out"  # write migrated copies under another folder
    DIFF = "diff"  # print a unified diff, write nothing
    CHECK = "check"  # report only, write nothing


@dataclass
class Job:
    path: Path
    display: str
    mode: Mode
    codes: tuple[str, ...]
    target: str
    unsafe_fixes: bool
    out_path: Path | None = None
    eager_mode: str | None = None
    strict: bool = False  # also report suppression comments that silence nothing
    owner: Owner = Owner.PROGRAM  # whose code the file is (ownership.py)
    received: object = None  # what the program's other modules say (analysis/program.py)
    module_name: str = ""


@dataclass
class FileResult:
    display: str
    findings: list[Finding] = field(default_factory=list)
    changed: bool = False
    error: FileError | None = None
    diff: str | None = None
    suppressed: list[dict] = field(default_factory=list)  # silenced by `# tpukit: ignore`


# -- discovery -------------------------------------------------------------------------
def _excluded(path: Path, patterns: list[str], root: Path) -> bool:
    if not patterns:
        return False
    try:
        rel = real_path(path).relative_to(real_path(root)).as_posix()
    except ValueError:
        rel = path.as_posix()
    parts = rel.split("/")
    for pattern in patterns:
        pattern = pattern.rstrip("/")
        if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(rel, pattern + "/*"):
            return True
        if "/" not in pattern and any(fnmatch.fnmatch(p, pattern) for p in parts):
            return True
    return False


def discover(paths: list[Path], exclude: list[str], root: Path, suffix: str = ".py",
             skipped: list[Path] | None = None) -> list[Path]:
    """Python files (or `suffix` ones) under `paths`, sorted; named files are taken as they are
    (like ruff), except that shell scripts go to the shell scan (shell.py) and only there.
    PyTorch's own packages met in a walk are left out, and added to `skipped`."""
    found: list[Path] = []
    for path in paths:
        if not path.is_dir():
            if (path.suffix == ".sh") == (suffix == ".sh"):
                found.append(path)
            continue
        for folder, dirs, files in os.walk(path):
            here = Path(folder)
            framework = [d for d in dirs if framework_package(here / d)]
            if skipped is not None:
                skipped.extend(here / d for d in sorted(framework))
            dirs[:] = sorted(
                d
                for d in dirs
                if not d.startswith(".")
                and d not in SKIP_DIRS
                and d not in framework
                and not _excluded(here / d, exclude, root)
            )
            for name in sorted(files):
                candidate = here / name
                if name.endswith(suffix) and not _excluded(candidate, exclude, root):
                    found.append(candidate)
    unique = dict.fromkeys(found)
    return list(unique)


# -- one file --------------------------------------------------------------------------
def _line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    return line, offset - (data.rfind(b"\n", 0, offset) + 1) + 1


@dataclass
class Source:
    text: str
    bom: str = ""  # "\ufeff" when the file starts with one (written back before the text)
    encoding: str = "utf-8"  # a PEP 263 coding declaration's, else UTF-8


def read_source(path: Path, display: str) -> Source | FileError:
    """The file's text, as Python reads it, or the reason the file cannot be migrated."""
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        return FileError(display, "is a directory, not a Python file")
    except FileNotFoundError:
        return FileError(display, "file not found (a dangling link?)")
    except OSError as exc:
        return FileError(display, f"cannot read: {exc.strerror or exc}")
    if b"\0" in data:
        line, col = _line_col(data, data.index(b"\0"))
        return FileError(display, "binary file (NUL byte), not Python source", line, col)
    try:  # PEP 263: `# -*- coding: latin-1 -*-` on line 1 or 2; a BOM means UTF-8
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        if "invalid or missing encoding" not in str(exc):  # an unknown or contradicted one
            return FileError(display, f"coding declaration: {exc}")
        encoding = "utf-8"  # undeclared bytes that are not UTF-8: said at their byte below
    bom = ""
    if encoding == "utf-8-sig":
        data, bom, encoding = data[3:], "\ufeff", "utf-8"
    try:
        return Source(data.decode(encoding), bom, encoding)
    except UnicodeDecodeError as exc:
        line, col = _line_col(data, exc.start)
        name = "UTF-8" if encoding == "utf-8" else f"{encoding} as it declares"
        return FileError(display, f"not {name} (byte 0x{data[exc.start]:02x})", line, col)


def _syntax_error(display: str, source: str, exc: cst.ParserSyntaxError) -> FileError:
    """Python's own message and position when it agrees the file is invalid (libcst's
    position can trail the real error); libcst's otherwise."""
    py_exc = compiles(source, display)
    if py_exc is not None:
        return FileError(display, f"syntax error: {py_exc.msg}", py_exc.lineno or 1, py_exc.offset or 1)
    message = " ".join(exc.message.split())
    return FileError(display, f"syntax error: {message}", exc.raw_line, exc.raw_column + 1)


def _read_only(path: Path) -> bool:
    mode = path.stat().st_mode
    return not (mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) or not os.access(path, os.W_OK)


def process(job: Job) -> FileResult:
    result = FileResult(job.display)
    read = read_source(job.path, job.display)
    if isinstance(read, FileError):
        result.error = read
        return result
    source, bom = read.text, read.bom
    rules = load_rules()
    options = MigrateOptions(
        rules=[rules[c] for c in job.codes],
        target=job.target,
        unsafe_fixes=job.unsafe_fixes,
        eager_mode=job.eager_mode,
        render_source=job.mode is not Mode.CHECK,
        strict=job.strict,
        owner=job.owner,
        received=job.received,
        module_name=job.module_name,
    )
    try:
        migration = migrate_source(source, job.display, options)
    except cst.ParserSyntaxError as exc:
        result.error = _syntax_error(job.display, source, exc)
        return result
    except MigrationBug as exc:
        result.error = FileError(job.display, f"internal error in tpukit: {exc}", exc.line or 1)
        return result
    except RecursionError:
        result.error = FileError(job.display, "too deeply nested for the parser")
        return result
    result.findings = migration.findings
    result.suppressed = migration.suppressed
    try:
        if job.mode is Mode.WRITE and migration.changed:
            if _read_only(job.path):
                result.error = FileError(job.display, "read-only file: not rewritten")
                return result
            atomic_write(job.path, bom + migration.new_source, like=job.path.stat(),
                         encoding=read.encoding)
        elif job.mode is Mode.OUT and job.out_path is not None:
            job.out_path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(job.out_path, bom + migration.new_source, job.path.stat().st_mode,
                         encoding=read.encoding)
        elif job.mode is Mode.DIFF and migration.changed:
            result.diff = "".join(
                _ended(line) for line in difflib.unified_diff(
                    migration.source.splitlines(keepends=True),
                    migration.new_source.splitlines(keepends=True),
                    fromfile=f"a/{job.display}",
                    tofile=f"b/{job.display}",
                )
            )
    except UnicodeEncodeError as exc:
        result.error = FileError(job.display, f"cannot write: the rewrite holds characters "
                                 f"{read.encoding} cannot encode ({exc.reason})")
        return result
    except OSError as exc:
        result.error = FileError(job.display, f"cannot write: {exc.strerror or exc}")
        return result
    result.changed = migration.changed
    return result


def _ended(line: str) -> str:
    """A diff line of a file without a final newline ends as `diff -u` ends it."""
    return line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"


def _safe_process(job: Job) -> FileResult:
    try:
        return process(job)
    except Exception as exc:  # noqa: BLE001 - a tpukit bug on one file must not stop the rest
        return FileResult(
            job.display,
            error=FileError(job.display, f"internal error in tpukit: {type(exc).__name__}: {exc}"),
        )


def run_jobs(
    jobs: list[Job], workers: int
) -> Iterator[FileResult]:
    """Results in job order. Files are independent, so they go to a process pool."""
    if workers <= 1 or len(jobs) < 4:
        for job in jobs:
            yield _safe_process(job)
        return
    chunk = max(1, min(16, len(jobs) // (workers * 8)))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(_safe_process, jobs, chunksize=chunk)
