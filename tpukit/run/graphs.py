"""What differs between a recompiled graph and the last graph from the same line, named at
the user's line.

XLA writes the HLO of every module it *compiles* when XLA_FLAGS has `--xla_dump_to=DIR`
(`module_NNNN.<name>.before_optimizations.txt`): once per new graph, never for a graph run
again from the cache, so the steady state costs nothing. With XLA_HLO_DEBUG=1 and torch_xla's
IR debug on (`torch_xla._XLAC._set_ir_debug`), each instruction carries the Python
source_file/source_line of the op that made it; IR debug captures a Python frame per op, so
tpukit turns it on only while graphs are new (the warm-up, and the steps after a step that
compiled) and off in the steady state (GraphEvents.ir_debug). A dump file is matched to the
debug log's compile event of the same order, and checked against that event's input and output
counts: a dump that does not match (a compile the persistent cache answered) stops the
matching rather than pair a graph with the wrong hash.

    HloModule SyncTensorsGraph.23, entry_computation_layout={(f32[], f32[100,4]{1,0})->(f32[5,4]{1,0})}
    ENTRY %SyncTensorsGraph.23 (p0.1: f32[], p1.2: f32[100,4]) -> (f32[5,4]) {
      %slice.3 = f32[5,4]{1,0} slice(%p1.2), slice={[5:10], [0:4]},
          metadata={op_type="xla__select" ... source_file="/tmp/train.py" source_line=6}
      ...

The IR text format (XLA_SAVE_TENSORS_FMT=text) is not enough: it does not show a slice's
bounds (`xla::select(%0)`), which is the commonest cause of all; and XLA_SAVE_TENSORS_FILE
lowers every graph of every step to text (1.13x the run's wall time on XLA:CPU).
"""

from __future__ import annotations

import difflib
import linecache
import re
from dataclasses import dataclass
from pathlib import Path

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+ = (?P<shape>.+?) (?P<op>[a-z][\w\-]*)\(")
_SOURCE = re.compile(r'source_file="(?P<file>[^"]*)" source_line=(?P<line>\d+)')
_METADATA = re.compile(r",?\s*metadata=\{[^}]*\}")
_NAME = re.compile(r"%[\w.\-]+")


@dataclass(frozen=True)
class Op:
    op: str  # the HLO opcode: slice, constant, all-reduce, ...
    shape: str
    detail: str  # operand shapes and attributes, without instruction names and metadata
    path: str
    line: int

    @property
    def key(self) -> tuple:
        return self.op, self.path, self.line


def parse_instruction(text: str) -> Op | None:
    match = _INSTRUCTION.match(text)
    if match is None:
        return None
    start = match.end()
    depth, end = 1, start
    while end < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    operands, rest = text[start:end - 1], text[end:]
    source = _SOURCE.search(rest)
    detail = _NAME.sub("", operands).strip() + _METADATA.sub("", rest)
    return Op(match["op"], match["shape"], " ".join(detail.split()),
              source["file"] if source else "", int(source["line"]) if source else 0)


def parse_graph(lines: list[str]) -> list[Op]:
    return [op for op in map(parse_instruction, lines) if op is not None]


class IrDebug:
    """torch_xla's IR debug (a Python frame kept per op: the source lines of the dump) on
    while graphs are new, off in the steady state: on through the warm-up and for the step
    after a step that compiled; off while the fallback tracer runs (under it every op's
    innermost frame is the tracer's own)."""

    def __init__(self, warmup: int, always: bool = False) -> None:
        self.warmup = warmup
        self.always = always  # --explain-graphs: on in every step (and no fallback tracer)
        self.on: bool | None = None  # as torch_xla has it, once tpukit set it

    def next_step(self, index: int, compiled: bool, tracing: bool) -> None:
        if not self.always:
            self._set((index <= self.warmup or compiled) and not tracing)

    def _set(self, on: bool) -> None:
        if on == self.on:
            return
        import torch_xla

        torch_xla._XLAC._set_ir_debug(on)
        self.on = on


class CompileDump:
    """The graphs XLA compiled, by graph hash, the first time each was seen; read as the
    dump folder fills, one compile event (debuglog.GraphEvent) per dump file, in order."""

    def __init__(self, folder: Path, warmup: int = 2, always: bool = False) -> None:
        self.ir_debug = IrDebug(warmup, always)
        self.folder = folder
        self.graphs: dict[str, list[Op]] = {}
        self._read: set[str] = set()
        self._events: list = []  # compile events whose dump file has not been read yet
        self.matched = True  # False once a file disagreed with its event: no more pairing

    def flags(self) -> str:
        """What XLA_FLAGS needs for this dump."""
        return f"--xla_dump_to={self.folder} --xla_dump_hlo_as_text"

    def read_new(self, compiles: list | tuple = ()) -> None:
        self._events.extend(compiles)
        if not self.matched or not self._events:
            return
        for path in self._files():
            if not self._events:
                return  # its event is in the part of the log not read yet
            event = self._events.pop(0)
            self._read.add(path.name)
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            counts = _entry_counts(lines[0] if lines else "")
            if event.inputs is not None and counts is not None and counts != (
                    event.inputs, event.outputs):
                self.matched = False
                return
            self.graphs.setdefault(event.graph_hash, parse_graph(lines))

    def _files(self) -> list[Path]:
        found = [p for p in self.folder.glob("module_*.before_optimizations.txt")
                 if p.name not in self._read]
        return sorted(found, key=lambda p: int(_MODULE_NUMBER.match(p.name)[1]))

    def remove(self) -> None:
        """The dump folder (tpukit's own temporary one) and everything XLA wrote there."""
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


_MODULE_NUMBER = re.compile(r"module_(\d+)\.")


def _entry_counts(header: str) -> tuple[int, int] | None:
    """(parameters, results) of `HloModule ..., entry_computation_layout={(A, B)->(C, D)}`."""
    match = re.search(r"entry_computation_layout=\{\((.*)\)->(.*)\}", header)
    if match is None:
        return None
    params, result = match[1], match[2]
    if result.startswith("(") and result.endswith(")"):
        result = result[1:-1]
    return len(_top_level(params)), len(_top_level(result))


def _top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"{": 1, "[": 1, "(": 1, "}": -1, "]": -1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [p for p in parts + [current] if p.strip()]


@dataclass
class Difference:
    what: str  # said at the finding
    path: str
    line: int
    op: str
    kind: str  # changed | added | removed


def diff_graphs(before: list[Op], after: list[Op], is_user_file) -> Difference | None:
    """The first difference between two graphs at a user's line (else the first at all):
    an instruction whose attributes or shape changed, or one present in one graph only.
    A graph compiled while IR debug was off has no source lines: then instructions are
    matched by opcode alone, and the line is the other graph's."""
    sourced = any(o.path for o in before) and any(o.path for o in after)
    key = (lambda o: o.key) if sourced else (lambda o: o.op)
    matcher = difflib.SequenceMatcher(None, [key(o) for o in before], [key(o) for o in after],
                                      autojunk=False)
    found: list[Difference] = []
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            for old, new in zip(before[a0:a1], after[b0:b1]):
                if (old.shape, old.detail) != (new.shape, new.detail):
                    found.append(_changed(old, new))
            continue
        for op in before[a0:a1]:
            found.append(Difference(f"`{op.op}` ({op.shape}) is in the earlier graph only",
                                    op.path, op.line, op.op, "removed"))
        for op in after[b0:b1]:
            found.append(Difference(f"`{op.op}` ({op.shape}) is new in this graph",
                                    op.path, op.line, op.op, "added"))
    if not found:
        return None
    first = next((d for d in found if d.path and is_user_file(d.path)), found[0])
    if first.kind != "changed":  # say the whole block that one line adds or drops
        same = [d for d in found if (d.kind, d.path, d.line) == (first.kind, first.path, first.line)]
        ops = list(dict.fromkeys(d.op for d in same))
        shown = ", ".join(f"`{op}`" for op in ops[:5]) + (", ..." if len(ops) > 5 else "")
        where = "new in this graph" if first.kind == "added" else "in the earlier graph only"
        first.what = f"{len(same)} instruction(s) ({shown}) are {where}"
        first.op = "all-reduce" if "all-reduce" in ops else first.op
    return first


def _changed(old: Op, new: Op) -> Difference:
    if old.shape != new.shape:
        what = f"`{new.op}` {old.shape} -> {new.shape}"
    else:
        a, b = _differing_part(old.detail, new.detail)
        what = f"`{new.op}` {a} -> {b}"
    where = new if new.path else old
    return Difference(what, where.path, where.line, new.op, "changed")


def _differing_part(a: str, b: str) -> tuple[str, str]:
    """The attribute that differs (`slice={[0:5], [0:4]}`), not the whole instruction."""
    parts_a, parts_b = _attributes(a), _attributes(b)
    for x, y in zip(parts_a, parts_b):
        if x != y:
            return x, y
    return a, b


def _attributes(detail: str) -> list[str]:
    """`f32[100,4]{1,0}, slice={[0:5], [0:4]}` -> its comma-separated parts, brackets kept."""
    parts, depth, current = [], 0, ""
    for char in detail:
        depth += {"{": 1, "[": 1, "(": 1, "}": -1, "]": -1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return parts + [current.strip()] if current.strip() else parts


FIXES = {
    # The index is built on the host: `start + torch.arange(n, device=...)` still bakes a
    # start of 0 in (3 compiles for 20 offsets on XLA:CPU; this form and host slices: 2).
    "slice": "a slice at a Python-int offset that changes per step is baked into the graph, "
             "one compile per offset: index with an index built on the host, "
             "`{fix}` (`tpukit migrate` rewrites it, TPU505), or keep the data on the host "
             "and move each slice to the device",
    "dynamic-slice": "the slice's size changes: slice a fixed size and mask the rest",
    "constant": "a Python number that varies per step is baked into the graph as a constant: "
                "make it a tensor on the device (`torch.tensor(value, device=device)`)",
    "all-reduce": "a collective runs in some steps only (DistributedDataParallel under "
                  "`no_sync()` / gradient accumulation): expected once per accumulation cycle; "
                  "if every step differs, keep the sync pattern the same each step",
}


_SLICED = re.compile(r"\b([A-Za-z_]\w*)\[\s*([^\[\]:,]+:[^\[\]:,]+)\]")


def slice_fix(path: str, line: int) -> str:
    """TPU505's fix for the slice at this line (`corpus[i:i + bptt]`), else its general form."""
    match = _SLICED.search(linecache.getline(path, line))
    name, bounds = match.groups() if match else ("x", "i:j")
    return f"{name}.index_select(0, torch.arange({name}.size(0))[{bounds.strip()}].to({name}.device))"


def fix_for(difference: Difference) -> str:
    if difference.op == "slice" and difference.kind == "changed":
        return FIXES["slice"].format(fix=slice_fix(difference.path, difference.line))
    if difference.op == "all-reduce" or (difference.op in FIXES and difference.kind == "changed"):
        return FIXES[difference.op]
    if difference.kind in ("added", "removed"):
        return ("an op runs in some steps only (a step-dependent Python branch): run the same "
                "ops every step and choose with `torch.where`, or keep each variant's graph "
                "stable")
    return "the value that changed comes from Python: make it a tensor on the device"
