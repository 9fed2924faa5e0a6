"""`tpukit migrate` over real library code, as a new user runs it on a repository.

What it measures
----------------
For each package of a pinned list (the wheel or sdist from PyPI, ``pip download --no-deps``
into ``--cache-dir``; torch itself is copied from the installed torch, never imported), its
``*.py`` files are copied to a scratch folder and migrated in write mode, as a library's own
authors port it (``python -m tpukit migrate --library-mode --format json -j J DIR``). Per
package it prints:

* files, lines: the Python files migrated (``--max-files N`` takes a seeded sample of N);
* seconds: wall time of the first migrate run;
* crashes: files that got an ``internal error`` (a tpukit bug), and other errors (files
  tpukit refused: syntax it cannot parse, not in their encoding);
* changed: files the first run rewrote;
* non-idempotent: files a second run over the migrated copy changes again;
* non-compiling: rewritten files that do not compile although the original does;
* the rewrite count per rule (applied findings, by code), summed in the last table.

``--sample N --seed S`` writes the unified diffs of N changed files, drawn at random over all
packages, to ``--out DIR`` (one ``.diff`` per file, and ``index.txt``), for a person to review.
``--recheck DIR`` migrates the files of an earlier sample again with today's code, each in a
copy of its package (``tpukit migrate --diff`` on the file's folder, a folder walk as in the
full run) and writes their diffs to ``DIR/recheck/``: what a fix did to the sample reviewed.

How to run
----------
From the repository root, with the project's virtualenv::

    .venv/bin/python benchmarks/library_corpus.py --max-files 300 -j 2 --sample 30 --seed 17

The downloads (~60 MB) are cached; the scratch copies are removed unless ``--keep``.
Exit status: 0 when every package was measured, whatever the counts; 2 when a download,
an extraction or a tpukit run failed (exit status other than 0, 1 and 2, or no JSON).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib.util
import json
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# Pinned: the versions the issue-17 corpus was measured with.
PACKAGES: tuple[str, ...] = (
    "transformers==4.57.1",
    "diffusers==0.35.2",
    "accelerate==1.11.0",
    "lightning==2.5.5",
    "timm==1.0.20",
    "deepspeed==0.18.1",
    "ultralytics==8.3.220",
    "mmengine==0.10.7",
    "peft==0.17.1",
    "fairscale==0.4.13",
    "bitsandbytes==0.48.1",
    "torchvision==0.24.0",
)
TORCH = "torch"  # copied from the installed package (the venv's torch 2.9.0)
RUN_TIMEOUT_S = 3600.0
REPO_ROOT = Path(__file__).resolve().parent.parent


class BenchmarkError(Exception):
    """A failure that makes the measurement meaningless (exit status 2)."""


@dataclass
class PackageResult:
    name: str
    files: int = 0
    lines: int = 0
    seconds: float = 0.0
    crashes: list[str] = field(default_factory=list)
    other_errors: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    non_idempotent: list[str] = field(default_factory=list)
    non_compiling: list[str] = field(default_factory=list)
    left_out: int = 0  # files in PyTorch's own packages, which migrate leaves out of a walk
    rewrites: Counter = field(default_factory=Counter)


# -- sources ---------------------------------------------------------------------------
def download(spec: str, cache: Path) -> Path:
    """The wheel or sdist of `spec` in the cache, fetched by pip on first use."""
    name, _, version = spec.partition("==")
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)

    def cached() -> list[Path]:
        stem = name.replace("-", "_").lower()
        return [p for p in wheels.iterdir()
                if p.name.lower().replace("-", "_").startswith(f"{stem}_{version}")
                or p.name.lower().startswith(f"{name.lower()}-{version}")]

    found = cached()
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                               "-d", str(wheels), spec], capture_output=True, text=True)
        found = cached()
        if proc.returncode != 0 or not found:
            raise BenchmarkError(f"pip download {spec} failed: {proc.stderr.strip()[-400:]}")
    return sorted(found)[0]


def python_members(archive: Path) -> dict[str, bytes]:
    """The `*.py` files of a wheel or sdist, by their path in the archive."""
    members: dict[str, bytes] = {}
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if info.filename.endswith(".py") and not info.is_dir():
                    members[info.filename] = zf.read(info)
    elif archive.name.endswith(".tar.gz"):
        with tarfile.open(archive) as tf:
            for info in tf.getmembers():
                if info.isfile() and info.name.endswith(".py"):
                    handle = tf.extractfile(info)
                    if handle is not None:
                        members[info.name] = handle.read()
    else:
        raise BenchmarkError(f"unknown archive type: {archive.name}")
    return members


def torch_members() -> dict[str, bytes]:
    spec = importlib.util.find_spec(TORCH)
    if spec is None or not spec.submodule_search_locations:
        raise BenchmarkError("torch is not installed in this environment")
    root = Path(list(spec.submodule_search_locations)[0])
    return {f"torch/{p.relative_to(root).as_posix()}": p.read_bytes()
            for p in sorted(root.rglob("*.py"))}


def _skipped(path: str) -> bool:
    """Paths tpukit itself skips in a folder walk (hidden folders, __pycache__, ...)."""
    parts = PurePosixPath(path).parts[:-1]
    return any(p.startswith(".") or p in ("__pycache__", "site-packages", "node_modules")
               for p in parts)


def choose(members: dict[str, bytes], max_files: int | None, rng: random.Random) -> dict[str, bytes]:
    """A seeded sample of `max_files` files, with the `__init__.py` files of their packages
    (what makes a module a package's module for tpukit), which count as files too."""
    names = sorted(n for n in members if not _skipped(n))
    if max_files is not None and len(names) > max_files:
        chosen = set(rng.sample(names, max_files))
        for name in list(chosen):
            for parent in PurePosixPath(name).parents:
                init = (parent / "__init__.py").as_posix()
                if init in members:
                    chosen.add(init)
        names = sorted(chosen)
    return {n: members[n] for n in names}


# -- one package -------------------------------------------------------------------------
def migrate(folder: Path, jobs: int) -> tuple[dict, float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "tpukit", "migrate", "--library-mode", "--format", "json",
         "--exit-zero", "-j", str(jobs), str(folder)],
        capture_output=True, text=True, cwd=folder, timeout=RUN_TIMEOUT_S,
        env={**_env(), "NO_COLOR": "1"})
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1, 2):
        raise BenchmarkError(f"tpukit migrate exited {proc.returncode}: {proc.stderr[-2000:]}")
    try:
        return json.loads(proc.stdout), seconds
    except json.JSONDecodeError as exc:
        raise BenchmarkError(f"tpukit printed no JSON ({exc}): {proc.stderr[-2000:]}") from exc


def _env() -> dict:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _compiles(data: bytes, name: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(data, name, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            return False
    return True


def measure(name: str, members: dict[str, bytes], scratch: Path, jobs: int) -> PackageResult:
    result = PackageResult(name, files=len(members),
                           lines=sum(data.count(b"\n") for data in members.values()))
    folder = scratch / name
    for rel, data in members.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    report, result.seconds = migrate(folder, jobs)
    for error in report.get("errors", []):
        where = f"{error['path']}:{error['line']}: {error['message']}"
        (result.crashes if "internal error" in error["message"] else result.other_errors).append(where)
    result.rewrites.update(f["code"] for f in report.get("findings", []) if f["applied"])
    skipped = [p.rstrip("/") + "/" for p in report.get("summary", {}).get(
        "framework_packages_skipped", [])]
    result.left_out = sum(any(rel.startswith(p) for p in skipped) for rel in members)
    first = {}
    for rel, data in members.items():
        path = folder / rel
        new = path.read_bytes()
        first[rel] = _digest(path)
        if new != data:
            result.changed.append(rel)
            if _compiles(data, rel) and not _compiles(new, rel):
                result.non_compiling.append(rel)
    migrate(folder, jobs)  # a second run over migrated code must change nothing
    result.non_idempotent = [rel for rel in members if _digest(folder / rel) != first[rel]]
    return result


# -- report ------------------------------------------------------------------------------
def table(results: list[PackageResult]) -> str:
    header = ("package", "files", "lines", "seconds", "crashes", "other errors", "changed",
              "non-idempotent", "non-compiling", "left out (PyTorch's own)")
    rows = [(r.name, r.files, r.lines, f"{r.seconds:.1f}", len(r.crashes), len(r.other_errors),
             len(r.changed), len(r.non_idempotent), len(r.non_compiling), r.left_out)
            for r in results]
    rows.append(("total", *(sum(row[i] for row in rows) if i != 3 else
                            f"{sum(r.seconds for r in results):.1f}" for i in range(1, 10))))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def rule_table(results: list[PackageResult]) -> str:
    codes = sorted({c for r in results for c in r.rewrites})
    lines = ["| package | " + " | ".join(codes) + " |", "|---|" + "---|" * len(codes)]
    for r in results:
        lines.append(f"| {r.name} | " + " | ".join(str(r.rewrites.get(c, 0)) for c in codes) + " |")
    total = Counter()
    for r in results:
        total.update(r.rewrites)
    lines.append("| total | " + " | ".join(str(total[c]) for c in codes) + " |")
    return "\n".join(lines)


def write_sample(results: list[PackageResult], originals: dict[str, dict[str, bytes]],
                 scratch: Path, out: Path, count: int, rng: random.Random) -> list[str]:
    changed = [(r.name, rel) for r in results for rel in r.changed]
    picked = sorted(rng.sample(changed, min(count, len(changed))))
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for i, (name, rel) in enumerate(picked, 1):
        old = originals[name][rel].decode("utf-8", "replace").splitlines(keepends=True)
        new = (scratch / name / rel).read_bytes().decode("utf-8", "replace").splitlines(keepends=True)
        diff = "".join(difflib.unified_diff(old, new, f"a/{name}/{rel}", f"b/{name}/{rel}"))
        target = out / f"{i:03d}-{name}-{rel.replace('/', '_')}.diff"
        target.write_text(diff)
        index.append(f"{target.name}\t{name}/{rel}")
    (out / "index.txt").write_text("\n".join(index) + "\n")
    return index


def recheck(sample: Path, cache: Path) -> list[str]:
    """The diffs today's code makes to the files of `sample` (its index.txt), in DIR/recheck."""
    entries = [line.split("\t") for line in (sample / "index.txt").read_text().splitlines() if line]
    specs = {s.partition("==")[0]: s for s in PACKAGES}
    out = sample / "recheck"
    out.mkdir(exist_ok=True)
    loaded: dict[str, dict[str, bytes]] = {}
    written = []
    for diff_name, where in entries:
        name, _, rel = where.partition("/")
        if name not in loaded:
            loaded[name] = torch_members() if name == TORCH else python_members(
                download(specs[name], cache))
        members = loaded[name]
        with tempfile.TemporaryDirectory(prefix="tpukit-recheck-") as tmp:
            root = Path(tmp) / name
            for member, data in members.items():
                if not _skipped(member):
                    (root / member).parent.mkdir(parents=True, exist_ok=True)
                    (root / member).write_bytes(data)
            target = root / rel
            proc = subprocess.run(
                [sys.executable, "-m", "tpukit", "migrate", "--library-mode", "--diff",
                 "--exit-zero", str(target.parent)], capture_output=True, text=True, cwd=root,
                timeout=RUN_TIMEOUT_S, env={**_env(), "NO_COLOR": "1"})
            section = _file_section(proc.stdout, rel)
        (out / diff_name).write_text(section)
        written.append(f"{diff_name}\t{'changed' if section else 'unchanged'}")
    (out / "index.txt").write_text("\n".join(written) + "\n")
    return written


def _file_section(diff: str, rel: str) -> str:
    """The part of a multi-file unified diff (findings printed after it) that is about `rel`."""
    sections, current = {}, None
    for line in diff.splitlines(keepends=True):
        if line.startswith("--- "):
            current = line[4:].split("\t")[0].strip()
            sections[current] = []
        if current is not None and line[:1] in ("-", "+", "@", " ", "\\"):
            sections[current].append(line)
    return next(("".join(lines) for path, lines in sections.items()
                 if path.endswith("/" + rel)), "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "tpukit-library-corpus")
    parser.add_argument("--packages", nargs="*", help="names from the pinned list (default: all, and torch)")
    parser.add_argument("--max-files", type=int, default=None, help="a seeded sample of N files per package")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--sample", type=int, default=0, help="write the diffs of N random changed files")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--out", type=Path, default=Path("library-corpus-sample"))
    parser.add_argument("--keep", action="store_true", help="keep the migrated copies")
    parser.add_argument("--recheck", type=Path, metavar="DIR",
                        help="migrate the files of the sample in DIR again (DIR/recheck/)")
    args = parser.parse_args(argv)
    if args.recheck:
        try:
            for line in recheck(args.recheck, args.cache_dir):
                print(line)
        except (BenchmarkError, subprocess.TimeoutExpired) as exc:
            print(f"library_corpus: {exc}", file=sys.stderr)
            return 2
        return 0
    wanted = set(args.packages or [])
    specs = [s for s in PACKAGES if not wanted or s.partition("==")[0] in wanted]
    include_torch = not wanted or TORCH in wanted
    scratch = Path(tempfile.mkdtemp(prefix="tpukit-corpus-"))
    results: list[PackageResult] = []
    originals: dict[str, dict[str, bytes]] = {}
    try:
        sources = [(s.partition("==")[0], lambda s=s: python_members(download(s, args.cache_dir)))
                   for s in specs]
        if include_torch:
            sources.append((TORCH, torch_members))
        for name, load in sources:
            rng = random.Random(f"{args.seed}:{name}")
            members = choose(load(), args.max_files, rng)
            originals[name] = members
            print(f"{name}: {len(members)} files ...", file=sys.stderr, flush=True)
            results.append(measure(name, members, scratch, args.jobs))
        print(table(results))
        print()
        print(rule_table(results))
        for r in results:
            for what, items in (("crash", r.crashes), ("error", r.other_errors),
                                ("non-idempotent", r.non_idempotent),
                                ("non-compiling", r.non_compiling)):
                for item in items:
                    print(f"{what}: {r.name}: {item}")
        if args.sample:
            index = write_sample(results, originals, scratch, args.out, args.sample,
                                 random.Random(args.seed))
            print(f"\n{len(index)} sampled diffs written to {args.out}/ (index.txt)")
    except (BenchmarkError, subprocess.TimeoutExpired) as exc:
        print(f"library_corpus: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            print(f"migrated copies kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
