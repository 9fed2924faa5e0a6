"""Spelling changes nothing, on public scripts: each file `tpukit migrate` ports for a script of
the real-script corpus (benchmarks/corpus/real_scripts.toml: the script and the files its
`migrate` entry names) is migrated as it is, after renaming every name it binds (to neutral
names, and to CUDA/GPU/loader-sounding ones), and after adding CUDA-speaking comments and
docstrings (tests/metamorphic.py); the migrations must be the same up to the renaming.

    PYTHONPATH=.:tests .venv/bin/python benchmarks/spelling_corpus.py [--mirrors DIR] [--only NAME]

Prints one row per script: files checked, and per variant the files whose migration differed
(0 is the property holding), then the totals. No code of the scripts is kept: each is read
from its mirror at the pinned commit (real_scripts.extract).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import metamorphic as mm  # noqa: E402
from real_scripts import MANIFEST, extract  # noqa: E402

from tpukit.migrate.engine import MigrateOptions, migrate_source  # noqa: E402
from tpukit.rules import select_rules  # noqa: E402

OPTIONS = MigrateOptions(rules=select_rules([], []))
STYLES = ("neutral", "cuda", "comments")


def _codes(migration) -> list[tuple[str, bool]]:
    return sorted((f.code, f.applied) for f in migration.findings)


def differs(source: str, style: str) -> str | None:
    """What differs for one variant of `source` (None: the same migration)."""
    base = migrate_source(source, "program.py", OPTIONS)
    if style == "comments":
        variant = migrate_source(mm.commented(source), "program.py", OPTIONS)
        if mm.strip(variant.new_source) != base.new_source:
            return "code"
        if [(f.code, f.applied, mm.strip_text(f.message)) for f in variant.findings] != [
                (f.code, f.applied, f.message) for f in base.findings]:
            return "findings"
        return None
    renamed, mapping = mm.renamed(source, style)
    variant = migrate_source(renamed, "program.py", OPTIONS)
    if mm.comparable(variant.new_source) != mm.comparable(mm.apply_renaming(base.new_source, mapping)):
        return "code"
    return "findings" if _codes(variant) != _codes(base) else None


def files_of(entry: dict, tree: Path) -> list[Path]:
    named = [tree / p for p in entry.get("migrate", [entry["path"]])]
    files = []
    for path in named:
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return [f for f in dict.fromkeys(files) if f.is_file()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--only", action="append", default=[])
    args = parser.parse_args()
    entries = tomllib.loads(MANIFEST.read_text())["script"]
    totals = {"scripts": 0, "files": 0, **{s: 0 for s in STYLES}}
    print(f"| script | files | {' | '.join(f'{s} differs' for s in STYLES)} |")
    print("|---|---|" + "---|" * len(STYLES))
    for entry in entries:
        if args.only and entry["name"] not in args.only:
            continue
        with tempfile.TemporaryDirectory(prefix="tpukit-spelling-") as tmp:
            tree = Path(tmp) / "tree"
            try:
                extract(args.mirrors, entry, tree)
            except (OSError, FileNotFoundError) as exc:
                print(f"| {entry['name']} | - | {exc} |")
                continue
            counts = {s: [] for s in STYLES}
            files = files_of(entry, tree)
            for path in files:
                source = path.read_text(encoding="utf-8", errors="replace")
                for style in STYLES:
                    what = differs(source, style)
                    if what is not None:
                        counts[style].append(f"{path.relative_to(tree)} ({what})")
        totals["scripts"] += 1
        totals["files"] += len(files)
        cells = []
        for style in STYLES:
            totals[style] += len(counts[style])
            cells.append(str(len(counts[style])) + (
                f": {', '.join(counts[style])}" if counts[style] else ""))
        print(f"| {entry['name']} | {len(files)} | {' | '.join(cells)} |", flush=True)
    print(f"| total ({totals['scripts']} scripts) | {totals['files']} | "
          f"{' | '.join(str(totals[s]) for s in STYLES)} |")
    return 1 if any(totals[s] for s in STYLES) else 0


if __name__ == "__main__":
    sys.exit(main())
