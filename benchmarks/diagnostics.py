"""What a user reads to find the cause: `tpukit run` vs torch_xla's own PT_XLA_DEBUG_LEVEL=2
output, side by side on the fixtures/run/ scripts, in one invocation.

For each fixture: the number of findings (tpukit) or analysis blocks (torch_xla: one per
compilation and per execution it explains), the characters of each output, and whether the
first one names the line that the fix changes (as its location, or as `line N` / `FILE:N` in
its text). The fix lines are listed below, per fixture, by their text.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/diagnostics.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "fixtures" / "run"
BIN = Path(sys.executable).parent
# fixture -> (its arguments, tpukit run options, the lines the fix changes, by their text)
CASES = {
    "shape_change.py": (["--steps", "10"], [],
                        ["size = 6 if step == 6 else 8", "length = 12 if step < 8"]),
    "varlen.py": ([], [], ["def pad_to_longest(samples):", "return (pad_sequence(tokens"]),
    "fallback_sync.py": ([], [], ["positive = torch.nonzero(labels)", "total += loss.item()"]),
    "slice_offset.py": (["--steps", "6"], [], ["chunk = corpus[i:i + bptt]"]),
    "branch.py": ([], [], ["loss = loss + 0.01 * model.weight.abs().sum()"]),
    # the barrier goes after the update, or at the end of the loop's body (the issue's "add
    # `torch_xla.sync()` at the end of the step (line M)")
    "no_barrier.py": ([], [], ["w -= 0.01 * w.grad", 'print(f"{iteration}: {loss.item():.4f}")']),
    "embedding_bag.py": ([], [], ["return self.head(self.bag(ids, offsets))"]),
    # two graphs from one line, by design: the finding should name the toggle that makes them
    "ddp_no_sync.py": ([], [], ["model.require_backward_grad_sync = micro == accum - 1"]),
}


def lines_of(path: Path, texts: list[str]) -> set[int]:
    numbered = list(enumerate(path.read_text().splitlines(), 1))
    return {n for text in texts for n, line in numbered if text in line}


def names(text: str, path: Path, lines: set[int], line: int | None = None) -> bool:
    if line in lines:
        return True
    said = {int(n) for n in re.findall(rf"(?:{re.escape(path.name)}:|line )(\d+)", text)}
    return bool(said & lines)


def tpukit(path: Path, args: list[str], options: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        report_path = Path(out) / "run.json"
        proc = subprocess.run([str(BIN / "tpukit"), "run", "--json", str(report_path), *options,
                               str(path), *args], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "NO_COLOR": "1"})
        report = json.loads(report_path.read_text())
    # the run diagnoses (TPU701-703); TPU704 is the CUDA-idioms warning said before the run
    findings = [f for f in report["findings"] if f["code"] in ("TPU701", "TPU702", "TPU703")]
    return {"count": len(findings), "chars": len(proc.stderr), "first": findings[0] if findings else None}


def torch_xla_debug(path: Path, args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        log = Path(out) / "debug.txt"
        subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PT_XLA_DEBUG_LEVEL": "2",
                                         "PT_XLA_DEBUG_FILE": str(log)})
        text = log.read_text() if log.exists() else ""
    blocks = [b for b in re.split(r"^(?:Compilation|Execution) Analysis: =+\n", text, flags=re.M)
              if b.strip()]
    # torch_xla's blocks open and close with a rule: every other piece is a block's body
    bodies = blocks[::2] if blocks else []
    return {"count": len(bodies), "chars": len(text), "first": bodies[0] if bodies else ""}


def main() -> int:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    header = (f"{'fixture':18} {'tpukit findings':>15} {'chars':>7} {'1st names fix':>13}   "
              f"{'PT_XLA_DEBUG blocks':>19} {'chars':>8} {'1st names fix':>13}")
    print(header + "\n" + "-" * len(header))
    for name, (args, options, fix_texts) in CASES.items():
        path = RUN / name
        fix_lines = lines_of(path, fix_texts)
        ours, theirs = tpukit(path, args, options), torch_xla_debug(path, args)
        first = ours["first"]
        ours_names = bool(first) and names(first["message"], path, fix_lines, first["line"])
        theirs_names = names(theirs["first"], path, fix_lines)
        print(f"{name:18} {ours['count']:>15} {ours['chars']:>7} {'yes' if ours_names else 'no':>13}   "
              f"{theirs['count']:>19} {theirs['chars']:>8} {'yes' if theirs_names else 'no':>13}")
    print("\nchars: tpukit's whole report on stderr; torch_xla's whole analysis file. A fix line "
          "is named when it is the finding's location or appears as FILE:N / `line N` in it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
