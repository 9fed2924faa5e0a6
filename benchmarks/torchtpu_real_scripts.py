"""Public CUDA training scripts, migrated with --target torchtpu, checked against the real
torch-tpu wheel: every `torch.tpu.*` / `torch.accelerator.*` attribute the port uses resolved,
every call whose arguments are literals made, bare context managers caught (the same worker
as tests/test_torchtpu_wheel.py, tests/torchtpu_calls.py).

The scripts are listed in benchmarks/corpus/torchtpu.toml (repo, commit, path) and read from
bare mirrors at the pinned commit; none of their code is kept here. Run it with the venv that
`make test-torchtpu` builds:

    .venv-torchtpu/bin/python benchmarks/torchtpu_real_scripts.py [--mirrors /work/.mirror]

A mirror of owner/name is MIRRORS/owner+name/repo (a git directory). Prints one row per
script: whether the port changed it, the device-API uses tpukit introduced, the calls made,
and the calls that raised TorchTPU's internal-API error, hit a missing attribute or were a
context manager called as a statement (all must be 0). Exit 1 if any is not.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from torchtpu_outputs import NO_TPU, run_worker, torchtpu_options, uses_of  # noqa: E402

from tpukit.migrate.engine import migrate_source  # noqa: E402


def source_of(mirrors: Path, repo: str, commit: str, path: str) -> str:
    git_dir = mirrors / repo.replace("/", "+") / "repo"
    return subprocess.run(["git", "-C", str(git_dir), "show", f"{commit}:{path}"],
                          capture_output=True, text=True, check=True).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--manifest", type=Path, default=ROOT / "benchmarks" / "corpus" / "torchtpu.toml")
    args = parser.parse_args()
    scripts = tomllib.loads(args.manifest.read_text())["script"]
    options = torchtpu_options()
    header = f"{'script':72} {'changed':>7} {'uses':>5} {'made':>5} {'no TPU':>6} {'bad':>4}"
    print(header + "\n" + "-" * len(header))
    bad_total = 0
    for entry in scripts:
        before = source_of(args.mirrors, entry["repo"], entry["commit"], entry["path"])
        migration = migrate_source(before, entry["path"], options)
        uses = uses_of(migration.new_source).minus(uses_of(before))
        lines = run_worker(uses)
        made = [x for x in lines if "call" in x and x.get("value") != "not called"]
        no_tpu = [x for x in lines if NO_TPU.search(x.get("message", ""))]
        bad = [x for x in lines if "error" in x and not NO_TPU.search(x.get("message", ""))]
        bad_total += len(bad)
        name = f"{entry['repo']}:{entry['path']}"
        print(f"{name:72} {'yes' if migration.changed else 'no':>7} "
              f"{len(uses.chains) + len(uses.calls):>5} {len(made):>5} {len(no_tpu):>6} {len(bad):>4}")
        for line in bad:
            what = line.get("call") or line.get("chain") or line.get("assignment")
            print(f"    {what}: {line['error']}: {line['message']}")
    print(f"\n{len(scripts)} scripts; {bad_total} call(s) or attribute(s) that fail on torch-tpu "
          "0.2.0 for a reason other than the missing TPU")
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main())
