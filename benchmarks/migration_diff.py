"""What a change to the migrator does to the public-script corpus, without running a script:
every manifest entry (benchmarks/corpus/real_scripts.toml, torchtpu.toml) is extracted from
its mirror and migrated twice, once with a base commit's tpukit (a `git worktree` of it) and
once with this checkout's, both targets; the ports are compared file by file. A port that is
the same byte for byte runs as it ran (the corpus table stands for it); the entries that
differ are listed with their unified diffs (base -> this checkout) under `--out`.

    .venv/bin/python benchmarks/migration_diff.py --base HEAD~1 [--only NAME] [--out DIR]

Exit status: 0 when every entry was migrated by both, whatever differs; 2 otherwise.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import real_scripts  # noqa: E402


def _migrate(code_root: Path, tree: Path, targets: list[str], target: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    done = subprocess.run([sys.executable, "-m", "tpukit", "migrate", "--exit-zero",
                           "--target", target, *targets], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"tpukit migrate exited {done.returncode}: "
                           f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return done.stdout


def _files(tree: Path) -> dict[str, str]:
    return {str(p.relative_to(tree)): p.read_text(errors="replace")
            for p in sorted(tree.rglob("*.py"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="the commit to compare with")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--only", action="append", default=[], metavar="NAME")
    parser.add_argument("--targets", default="xla,torchtpu")
    parser.add_argument("--out", type=Path, help="write each differing port's diff here")
    args = parser.parse_args()
    entries = real_scripts.load_manifest()
    entries += real_scripts.load_manifest(ROOT / "benchmarks" / "corpus" / "torchtpu.toml")
    seen = set()
    failures = same = 0
    differ: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base),
                        args.base], check=True)
        try:
            for entry in entries:
                entry.setdefault("name", (entry["repo"] + "-" + entry["path"]).replace("/", "-"))
                key = (entry["repo"], entry["commit"], entry["path"],
                       tuple(entry.get("migrate", [entry["path"]])))
                if key in seen or (args.only and entry["name"] not in args.only):
                    continue
                seen.add(key)
                for target in args.targets.split(","):
                    trees = {}
                    try:
                        for side, code in (("base", base), ("new", ROOT)):
                            tree = Path(scratch) / f"{entry['name']}-{target}-{side}"
                            real_scripts.extract(args.mirrors, entry, tree)
                            _migrate(code, tree, entry.get("migrate", [entry["path"]]), target)
                            trees[side] = _files(tree)
                    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
                        failures += 1
                        print(f"{entry['name']} [{target}]: not compared: {exc}")
                        continue
                    diffs = []
                    for name in sorted(set(trees["base"]) | set(trees["new"])):
                        old, new = trees["base"].get(name, ""), trees["new"].get(name, "")
                        if old != new:
                            diffs += difflib.unified_diff(
                                old.splitlines(True), new.splitlines(True),
                                f"base/{name}", f"new/{name}")
                    if not diffs:
                        same += 1
                        continue
                    differ.append(f"{entry['name']} [{target}]")
                    print(f"{entry['name']} [{target}]: the port differs")
                    if args.out:
                        args.out.mkdir(parents=True, exist_ok=True)
                        (args.out / f"{entry['name']}-{target}.diff").write_text("".join(diffs))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)])
            shutil.rmtree(base, ignore_errors=True)
    print(f"{same} ports the same, {len(differ)} differ, {failures} not compared "
          f"(base {args.base})")
    return 2 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
