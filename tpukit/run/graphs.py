"""`tpukit run --explain-graphs`: what differs between a recompiled graph and the last graph
from the same line, named at the user's line.

torch_xla writes the HLO of every graph it runs when XLA_SAVE_TENSORS_FILE is set (with
XLA_SAVE_TENSORS_FMT=hlo and XLA_HLO_DEBUG=1 each instruction carries its Python
source_file/source_line). Both are read once, when torch_xla starts, so the dump is on for the
whole run, and torch_xla lowers every step's graph to HLO text for it: a diagnostic mode, not
the default. The IR text format (XLA_SAVE_TENSORS_FMT=text) is not enough: it does not show a
slice's bounds (`xla::select(%0)`), which is the commonest cause of all.

    [ScheduleSyncTensorsGraph]
    ...
    ## BEGIN_GRAPH
    HloModule IrToHlo.17, entry_computation_layout=...
    ENTRY %IrToHlo.17 (p0.6: f32[100,4]) -> (...) {
      %slice.7 = f32[5,4]{1,0} slice(f32[100,4]{1,0} %p0.6), slice={[0:5], [0:4]},
          metadata={op_type="xla__select" ... source_file="/tmp/train.py" source_line=6}
      ...
    }
    Graph Hash: 9ee3df8306339736e8f3119d12356ee
    ## END_GRAPH
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


class GraphDump:
    """The graphs of the dump by hash, the first time each was seen; read as the file grows."""

    def __init__(self, base: Path) -> None:
        self.base = base  # torch_xla writes BASE.0 (one file per device ordinal)
        self.graphs: dict[str, list[Op]] = {}
        self._offsets: dict[Path, int] = {}
        self._pending: list[str] = []

    def files(self) -> list[Path]:
        return sorted(self.base.parent.glob(self.base.name + ".*"))

    def read_new(self) -> None:
        for path in self.files():
            with open(path, "rb") as stream:
                stream.seek(self._offsets.get(path, 0))
                data = stream.read()
            end = data.rfind(b"\n") + 1
            self._offsets[path] = self._offsets.get(path, 0) + end
            for line in data[:end].decode("utf-8", "replace").splitlines():
                self._feed(line)

    def _feed(self, line: str) -> None:
        if line.startswith("## BEGIN_GRAPH"):
            self._pending = []
        elif line.startswith("Graph Hash:"):
            graph_hash = line.partition(":")[2].strip()
            if graph_hash not in self.graphs:  # steady state: the same graph again, skipped
                self.graphs[graph_hash] = parse_graph(self._pending)
            self._pending = []
        else:
            self._pending.append(line)

    def remove(self) -> None:
        """The dump files and their folder (tpukit's own temporary one)."""
        for path in self.files():
            path.unlink(missing_ok=True)
        try:
            self.base.parent.rmdir()
        except OSError:  # not empty: something else wrote there; leave it
            pass


@dataclass
class Difference:
    what: str  # said at the finding
    path: str
    line: int
    op: str
    kind: str  # changed | added | removed
    renumbered: bool = False  # a `parameter` whose number alone changed


def diff_graphs(before: list[Op], after: list[Op], is_user_file) -> Difference | None:
    """The first difference between two graphs at a user's line (else the first at all):
    an instruction whose attributes or shape changed, or one present in one graph only.
    Where one graph carries no Python lines (lowered with IR debug off), instructions are
    matched by opcode alone and a changed one is placed at the line the other graph gives it."""
    lined = _lined(before) and _lined(after)
    key = (lambda o: o.key) if lined else (lambda o: o.op)
    matcher = difflib.SequenceMatcher(None, [key(o) for o in before], [key(o) for o in after],
                                      autojunk=False)
    found: list[Difference] = []
    blocks: list[tuple[list[Op], list[Op]]] = []  # (removed, added) of each differing block
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            for old, new in zip(before[a0:a1], after[b0:b1]):
                if (old.shape, old.detail) != (new.shape, new.detail):
                    found.append(_changed(old, new))
            continue
        removed, added = list(before[a0:a1]), list(after[b0:b1])
        blocks.append((list(removed), list(added)))
        if not lined:  # placed elsewhere in a graph lowered without lines: the same opcode
            for old in list(removed):
                new = next((n for n in added if n.op == old.op), None)
                if new is not None:
                    removed.remove(old)
                    added.remove(new)
                    if (old.shape, old.detail) != (new.shape, new.detail):
                        found.append(_changed(old, new))
        for op in removed:
            found.append(Difference(f"`{op.op}` ({op.shape}) is in the earlier graph only",
                                    op.path, op.line, op.op, "removed"))
        for op in added:
            found.append(Difference(f"`{op.op}` ({op.shape}) is new in this graph",
                                    op.path, op.line, op.op, "added"))
    if not found:
        return None
    # a number compiled in only where nothing else changed in place (a slice offset that
    # changes every step outranks a bounded 0/1/-1 variant); parameters renumbered by the
    # one that went are no change
    moved = any(d.kind == "changed" and not d.renumbered for d in found)
    special = None if moved else _special_scalar(blocks)
    if special is not None:
        return special
    real = [d for d in found if not d.renumbered] or found
    first = next((d for d in real if d.path and is_user_file(d.path)), real[0])
    if first.kind != "changed":  # say the whole block that one line adds or drops
        same = [d for d in found if (d.kind, d.path, d.line) == (first.kind, first.path, first.line)]
        ops = list(dict.fromkeys(d.op for d in same))
        shown = ", ".join(f"`{op}`" for op in ops[:5]) + (", ..." if len(ops) > 5 else "")
        where = "new in this graph" if first.kind == "added" else "in the earlier graph only"
        first.what = f"{len(same)} instruction(s) ({shown}) are {where}"
        first.op = "all-reduce" if "all-reduce" in ops else first.op
    return first


_SPECIAL = (0.0, 1.0, -1.0)  # torch::lazy::IsSpecialScalar: compiled in, not passed as data


def _scalar_literal(op: Op) -> float | None:
    """The value of a scalar `constant(1)` (`f32[]`, `s64[]`), else None."""
    if op.op != "constant" or not op.shape.endswith("[]"):
        return None
    try:
        return float(op.detail.split(",")[0])
    except ValueError:
        return None


def _special_scalar(blocks: list[tuple[list[Op], list[Op]]]) -> Difference | None:
    """A Python number passed as a scalar `parameter` in one graph and compiled in as
    `constant(0)`, `constant(1)` or `constant(-1)` in the other, in the same block of
    differing instructions: torch_xla (torch::lazy's IsSpecialScalar) compiles those three
    values into the graph and passes every other value as device data, so each of them
    compiles a graph of its own. Placed at the line either side carries (a graph lowered
    without IR debug has none)."""
    for removed, added in blocks:
        for params, consts in ((removed, added), (added, removed)):
            const = next((o for o in consts if _scalar_literal(o) in _SPECIAL), None)
            if const is None:
                continue
            param = next((o for o in params if o.op == "parameter" and o.shape.endswith("[]")
                          and (not o.path or not const.path
                               or (o.path, o.line) == (const.path, const.line))), None)
            if param is None:
                continue
            at = const if const.path else param
            return Difference(
                f"a Python number is compiled in as `constant({_scalar_literal(const):g})` in "
                f"one graph and passed as a `parameter` in the other: torch_xla compiles the "
                f"values 0, 1 and -1 into the graph (special scalars) and passes every other "
                f"value as data", at.path, at.line, "special-scalar", "changed")
    return None


def _lined(graph: list[Op]) -> bool:
    """Lowered with IR debug on: 35 of 64 ops carry a line in slice_offset's graph, 1 of 64
    without (an op made while it was on, in an earlier step)."""
    return sum(bool(o.path) for o in graph) * 4 > len(graph)


def _changed(old: Op, new: Op) -> Difference:
    if old.shape != new.shape:
        what = f"`{new.op}` {old.shape} -> {new.shape}"
    else:
        a, b = _differing_part(old.detail, new.detail)
        what = f"`{new.op}` {a} -> {b}"
    at = new if new.path else old  # the graph that carries the line
    renumbered = new.op == old.op == "parameter" and old.shape == new.shape \
        and re.sub(r"^\d+", "", old.detail) == re.sub(r"^\d+", "", new.detail)
    return Difference(what, at.path, at.line, new.op, "changed", renumbered)


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
    "special-scalar": "each of 0, 1 and -1 compiles one graph of its own at this line, once "
                      "(at most three more graphs, not one per step): where the number comes "
                      "from the device (`.item()`), keep it there (`x.copy_(t)` for "
                      "`x.fill_(t.item())`); or run with `XLA_NO_SPECIAL_SCALARS=1`, which "
                      "makes torch_xla pass them as data too",
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
    if difference.op in ("all-reduce", "special-scalar") or (difference.op in FIXES and difference.kind == "changed"):
        return FIXES[difference.op]
    if difference.kind in ("added", "removed"):
        return ("an op runs in some steps only (a step-dependent Python branch): run the same "
                "ops every step and choose with `torch.where`, or keep each variant's graph "
                "stable")
    return "the value that changed comes from Python: make it a tensor on the device"
