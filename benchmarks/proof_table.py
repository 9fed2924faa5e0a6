"""What the ports cost after warm-up, before and after: one row per runnable public script of
the corpus, from two JSON files of benchmarks/real_scripts.py (the same manifest, two tpukit
trees: `--tpukit DIR` of an earlier commit's worktree for the before, this checkout for the
after). Per row: distinct graphs, graphs compiled after warm-up, CPU fallbacks and
device-to-host transfers per steady training step (medians), the median steady step time, and
the ops that fell back; then issue 48's targets over the rows (0 graphs after warm-up on at
least 95% of them, each exception with the run's own findings; at most 1 host read a step).

    .venv/bin/python benchmarks/real_scripts.py --site DEPS --tpukit BASE --json before.json
    .venv/bin/python benchmarks/real_scripts.py --site DEPS --json after.json
    .venv/bin/python benchmarks/proof_table.py after.json [--before before.json]

A row the before file lacks (or that ran on neither) shows the after only. Step times of two
files are comparable only from the same machine in one sitting; the hand ports' side by side
ratios are benchmarks/ports.py's (the fixtures that have one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tpukit.rules import load_rules

GRAPHS_TARGET = 0.95  # share of rows with no graph compiled after warm-up
READS_TARGET = 1.0  # device-to-host transfers per steady step


def _load(path: Path) -> tuple[str, dict[str, dict]]:
    data = json.loads(path.read_text())
    return data.get("tpukit", "?")[:7], {r["name"]: r for r in data["results"]}


def _ran(row: dict) -> bool:
    return row["migrated"]["status"] in ("ok", "stopped") and row.get("graphs") is not None


def _number(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if not value.is_integer() else str(int(value))
    return str(value)


def _cell(after: dict, before: dict | None, key: str) -> str:
    now = _number(after.get(key))
    if before is None or not _ran(before):
        return now
    was = _number(before.get(key))
    return now if was == now else f"{was} -> {now}"


def _lowered_on_tpu() -> dict[str, str]:
    """The ops torch_xla runs on the CPU on every device but a TPU (TPU702's table)."""
    return load_rules()["TPU702"].extra.get("lowered_on_tpu", {})


def render(after: dict[str, dict], before: dict[str, dict]) -> list[str]:
    lines = ["| script | graphs | after warm-up | fallbacks/step | host reads/step | "
             "step time (s) | ops that fell back |", "|---|---|---|---|---|---|---|"]
    for name, row in after.items():
        if not _ran(row):
            continue
        was = before.get(name)
        lowered = _lowered_on_tpu()
        ops = ", ".join(f"`{op}` x{n}{' (XLA:CPU only: lowered on a TPU)' * (op in lowered)}"
                        for op, n in sorted(
            row.get("fallback_ops", {}).items(), key=lambda kv: -kv[1])) or "-"
        lines.append(f"| {name} | {_cell(row, was, 'graphs')} | "
                     f"{_cell(row, was, 'recompiles_after_warmup')} | "
                     f"{_cell(row, was, 'fallbacks_per_step')} | "
                     f"{_cell(row, was, 'host_reads_per_step')} | "
                     f"{_cell(row, was, 'step_time_s')} | {ops} |")
    return lines


def targets(after: dict[str, dict]) -> list[str]:
    ran = [r for r in after.values() if _ran(r)]
    if not ran:
        return ["no row ran"]
    flat = [r for r in ran if not r.get("recompiles_after_warmup")]
    share = len(flat) / len(ran)
    out = [f"graphs after warm-up: 0 on {len(flat)}/{len(ran)} rows ({share:.0%}; target "
           f">= {GRAPHS_TARGET:.0%}: {'met' if share >= GRAPHS_TARGET else 'NOT met'})"]
    for r in ran:
        if r.get("recompiles_after_warmup"):
            why = next((f for f in r.get("run_findings", []) if f.startswith(
                ("TPU701", "TPU702", "TPU710"))), "no recompile finding in the report")
            out.append(f"  {r['name']}: {r['recompiles_after_warmup']} after warm-up: {why}")
    many = [r for r in ran if (r.get("host_reads_per_step") or 0) > READS_TARGET]
    out.append(f"host reads per steady step <= {READS_TARGET:g}: {len(ran) - len(many)}/"
               f"{len(ran)} rows")
    for r in many:
        why = next((f for f in r.get("run_findings", []) if f.startswith("TPU703")),
                   "no host-read finding in the report")
        out.append(f"  {r['name']}: {_number(r['host_reads_per_step'])} a step: {why}")
    lowered = _lowered_on_tpu()
    falls = [r for r in ran if any(op not in lowered for op in r.get("fallback_ops", {}))]
    out.append(f"CPU fallbacks a TPU would also run: on {len(falls)}/{len(ran)} rows"
               + "".join(f"\n  {r['name']}: " + ", ".join(
                   op for op in r["fallback_ops"] if op not in lowered) for r in falls))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("after", type=Path, help="benchmarks/real_scripts.py --json of the change")
    parser.add_argument("--before", type=Path, help="the same of the commit before it")
    args = parser.parse_args()
    after_commit, after = _load(args.after)
    before_commit, before = _load(args.before) if args.before else ("", {})
    print(f"# ports after warm-up, XLA:CPU: {before_commit + ' -> ' if before else ''}"
          f"{after_commit}")
    print("\n".join(render(after, before)))
    print()
    print("\n".join(targets(after)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
