"""Recompile attribution (TPU701): each graph compiled after a loop's warm-up, named at the
user line that materialised it with its cause: the batch or forward input whose shape changed
(against the last other graph from that line), the data-dependent fallbacks that fed it, a
long warm-up, a loop with no barrier, or (--explain-graphs) the first HLO instruction that
differs (graphs.py)."""

from __future__ import annotations

import ast
from collections import Counter

from dataclasses import dataclass, field
from pathlib import Path

from tpukit.findings import Severity
from tpukit.run.frames import is_user_file
from tpukit.run.loops import SETTLED, Loops
from tpukit.run.shapes import describe, diff, shape_text
from tpukit.run.steps import Step
from tpukit.run.run_finding import RunFinding, finding

DDP = "DistributedDataParallel"


@dataclass
class Recompiles:
    findings: list[RunFinding]
    long_warmup_steps: set[int] = field(default_factory=set)  # compiled in a loop's long warm-up
    # Graphs compiled after warm-up that are a line's first (code that first ran then: an
    # evaluation, a logging step, a checkpoint) and that the line never replaced later: not
    # recompiles; their findings are at info severity and --fail-on recompile ignores them.
    first_graphs: int = 0


def _graph_line(event) -> tuple[str, int] | None:
    for _, filename, line in event.frames:
        if is_user_file(filename):
            return filename, line
    return None


def _short(graph_hash: str) -> str:
    return graph_hash[:8] if graph_hash else "?"


def recompile_findings(steps: list[Step], loops: Loops, script: str,
                       fallback_lines: dict | None = None,
                       models: set[str] | None = None,
                       graphs: dict | None = None) -> Recompiles:
    """`models`: the class names of the outermost modules the steps called; `graphs`: the HLO
    of each graph by hash (--explain-graphs), to say what differs when no shape did."""
    by_index = {s.index: s for s in steps}
    history: list[tuple[tuple[str, int] | None, str, int]] = []  # (line, hash, step) in order
    found = Recompiles([])
    findings = found.findings
    for step in steps:
        compiled = [g for g in step.graphs if g.kind == "compile"]
        per_compile = step.compile_s / max(step.compiles, len(compiled), 1)
        # (severity, --fail-on kind, what caused it) -> [(event, where, extra)]
        causes: dict[tuple, list] = {}
        for event in step.graphs:
            line = _graph_line(event)
            if event.kind == "compile" and loops.steady(step):
                # the last other graph an earlier step ran from this line (one step can run
                # two graphs from a line, e.g. a read that cuts the step's graph early)
                previous, previous_hash = next(
                    ((s, h) for l, h, s in reversed(history)
                     if l == line and h != event.graph_hash and s != step.index), (None, None))
                severity, fails_on, cause, extra = _recompile(
                    step, event, by_index.get(previous), per_compile, fallback_lines or {},
                    loops, DDP in (models or ()))
                where = line or step.boundary_at or (script, 1)
                if graphs and previous is not None and not extra["changes"] and severity is None \
                        and not extra.get("data_dependent"):
                    cause, where = _graph_difference(cause, extra, where, graphs,
                                                     previous_hash, event.graph_hash)
                if fails_on is None:
                    found.long_warmup_steps.add(step.index)
                elif previous is None and not _replaced_later(line, event.graph_hash, step.index, steps):
                    found.first_graphs += 1
                    severity, fails_on = Severity.INFO, None
                    cause = ("it is the first graph from this line, which first ran after warm-up "
                             "and compiled nothing new after: code that runs now and then (an "
                             "evaluation, a logging step, a checkpoint), not a recompile")
                    extra.pop("fix", None)
                causes.setdefault((severity, fails_on, cause, extra.get("fix")), []).append(
                    (event, where, extra))
            history.append((line, event.graph_hash, step.index))
        # One cause, one finding: a ragged last batch recompiles every graph of its step.
        findings += [_cause_finding(step, severity, fails_on, cause, graphs, len(compiled))
                     for (severity, fails_on, cause, _), graphs in causes.items()]
        findings += _unbarriered(step, graphs or {}, script, steps)
        if not step.graphs and step.compiles and loops.steady(step):  # no debug log to read
            findings.append(finding(
                "TPU701", f"step {step.index}: XLA compiled {step.compiles} new graph(s) "
                f"({step.compile_s:.2f} s) after warm-up", step.boundary_at or (script, 1),
                fails_on="recompile", step=step.index, compile_s=step.compile_s))
    told = {(f.location.path, f.location.line) for f in findings
            if f.extra.get("kind") in ("no-barrier", "read-cut")}
    findings += [f for f in _variants(steps, loops, script, graphs or {}, DDP in (models or ()))
                 if (f.location.path, f.location.line) not in told]
    found.findings = _across_steps(findings)
    return found


def _variants(steps: list[Step], loops: Loops, script: str, graphs: dict,
              ddp: bool) -> list[RunFinding]:
    """A line that runs the same two or more graphs in every step after warm-up, each
    compiled once (cached since): variants of one step, not recompiles, said once as info with
    what tells them apart. DistributedDataParallel's gradient sync switched off on
    micro-steps (gradient accumulation) is the common case: the last micro-step's backward
    runs the all-reduce, the others do not."""
    steady = [s for s in steps if loops.steady(s) and s.complete and s.kind == "train"]
    runs: dict[tuple[str, int], dict[int, list[str]]] = {}  # line -> step -> the graphs it ran
    compiled: dict[tuple[str, int], int] = {}  # line -> the last step that compiled from it
    for step in steady:
        for event in step.graphs:
            line = _graph_line(event)
            if line is None:
                continue
            runs.setdefault(line, {}).setdefault(step.index, []).append(event.graph_hash)
            if event.kind == "compile":
                compiled[line] = step.index
    findings = []
    toggle = _sync_toggle(script) if ddp and runs else None
    for where, by_step in runs.items():
        # the steps after the line's last compile (a recompile's own finding says that one)
        after = [s.index for s in steady if s.index > compiled.get(where, 0)]
        seen = {tuple(dict.fromkeys(by_step.get(index, ()))) for index in after}
        if len(after) < 2 or len(seen) != 1:
            continue  # too few steps, or not the same graphs every step
        (hashes,) = seen
        if len(hashes) < 2:
            continue
        differ, extra = "", {}
        first, second = hashes[0], hashes[1]
        if first in graphs and second in graphs:
            from tpukit.run.graphs import diff_graphs

            difference = diff_graphs(graphs[first], graphs[second], is_user_file)
            if difference is not None and difference.path and is_user_file(difference.path):
                differ = f"; they differ first at {_at(difference)}: {difference.what}"
                extra["graph_diff"] = _diff_fields(difference)
        if toggle is not None and _same_file(where[0], script) and toggle[0] < where[1]:
            # the switch comes before the line, in the script: the micro-steps it governs
            line, code = toggle
            why = (f"DistributedDataParallel's gradient all-reduce is switched at line {line} "
                   f"(`{code}`): the micro-steps' backward skips it and the last one runs it, "
                   "a graph each. Expected with gradient accumulation; nothing to fix")
            extra["sync_toggle"] = {"path": script, "line": line}
            also = ((script, line),)
        elif differ:
            why = ("expected when a step runs this line more than once with different work "
                   "(micro-steps, a step-dependent branch): each variant costs one compile and "
                   "its memory, not a compile per step")
            also = ()
        else:
            continue  # nothing to tell the user that the step's time does not already
        head = (f"this line runs {len(hashes)} different graphs in every step after warm-up "
                f"(hashes {', '.join(_short(h) for h in hashes)}), each compiled once and "
                f"reused{differ}")
        findings.append(finding("TPU701", head, where, Severity.INFO, None, cause=why, also=also,
                                kind="variants", graphs=list(hashes), **extra))
    return findings


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def _sync_toggle(script: str) -> tuple[int, str] | None:
    """The first statement of the script that switches DDP's gradient sync, with its code:
    `model.require_backward_grad_sync = ...` (nanoGPT) or `with model.no_sync():`."""
    try:
        text = Path(script).read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == "require_backward_grad_sync"
                for t in node.targets):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "no_sync" and not node.args:
            found.append(node.lineno)
    if not found:
        return None
    line = min(found)
    return line, " ".join(lines[line - 1].split())


def _later_graphs(line, index: int, steps: list[Step]):
    """The graph events from `line` of the steps after step `index`, in order."""
    return (g for s in steps if s.index > index for g in s.graphs if _graph_line(g) == line)


def _replaced_later(line, graph_hash: str, index: int, steps: list[Step]) -> bool:
    """Whether a later step compiled another graph from `line` (so its first was not its last)."""
    return line is not None and any(g.kind == "compile" and g.graph_hash != graph_hash
                                    for g in _later_graphs(line, index, steps))


def _signature(f: RunFinding) -> tuple | None:
    """What makes two steps' recompiles one cause: the same line, verdict and inputs changed on
    the same dims (a batch whose length varies recompiles step after step)."""
    changes = f.extra.get("changes") or []
    if f.code != "TPU701" or f.extra.get("kind") or "step" not in f.extra:
        return None
    if changes:
        what = tuple(sorted((c["name"], tuple(c["dims"]), c["old_dtype"] != c["new_dtype"])
                            for c in changes))
    elif f.extra.get("graph_diff"):  # --explain-graphs: the same instruction differs each time
        d = f.extra["graph_diff"]
        what = ("graph", d.get("op"), d.get("kind"), d.get("path"), d.get("line"))
    else:
        return None
    return (f.location.path, f.location.line, f.severity, f.fails_on, what)


def _across_steps(findings: list[RunFinding]) -> list[RunFinding]:
    """One cause, one finding, across steps too: the recompiles of the same line for the same
    inputs' change become one finding naming every step, each step's sizes, the time in all."""
    groups: dict[tuple, list[RunFinding]] = {}
    for f in findings:
        key = _signature(f)
        if key is not None:
            groups.setdefault(key, []).append(f)
    out, merged = [], set()
    for f in findings:
        key = _signature(f)
        if key is None or len(groups[key]) == 1:
            out.append(f)
        elif key not in merged:
            merged.add(key)
            out.append(_merge(groups[key]))
    return out


def _merge(group: list[RunFinding]) -> RunFinding:
    group = sorted(group, key=lambda f: f.extra["step"])
    first = group[0]
    total = round(sum(f.extra.get("compile_s", 0.0) for f in group), 6)
    graphs = sum(len(f.extra.get("graphs", ())) or 1 for f in group)
    steps = [f.extra["step"] for f in group]
    head = (f"{len(group)} steps ({', '.join(map(str, steps[:8]))}{', ...' if len(steps) > 8 else ''}) "
            f"recompiled at this line for one cause, {graphs} new graph(s), {total:.2f} s in all")
    fix = first.explanation.fix if first.explanation else ""
    also = first.explanation.where if first.explanation else ()
    more = f"; and {len(group) - 4} more" if len(group) > 4 else ""
    extra = {**first.extra, "steps": steps, "compile_s": total,
             "occurrences": [{"step": f.extra["step"], "previous_step": f.extra.get("previous_step"),
                              "graph_hash": f.extra.get("graph_hash"),
                              "compile_s": f.extra.get("compile_s"),
                              "changes": f.extra.get("changes", []),
                              **({"graph_diff": f.extra["graph_diff"]} if "graph_diff" in f.extra else {})}
                             for f in group]}
    where = (first.location.path, first.location.line)
    if not first.extra.get("changes"):
        d = first.extra["graph_diff"]
        shown = "; ".join(f"step {f.extra['step']}: {f.extra['graph_diff']['what']}" for f in group[:4])
        cause = (f"each time the graphs differed first at {Path(d['path']).name}:{d['line']}: "
                 f"{shown}{more}")
        return finding("TPU701", head, where, first.severity, first.fails_on, cause=cause,
                       fix=fix, also=[(w.path, w.line) for w in also], **extra)

    def sizes(f: RunFinding) -> str:
        c = f.extra["changes"][0]
        return f"step {f.extra['step']}: {shape_text(c['old'])} -> {shape_text(c['new'])}"

    shown = "; ".join(sizes(f) for f in group[:4]) + more
    dims = sorted({d for f in group for c in f.extra["changes"] for d in c["dims"]})
    seen = sorted({c["new"][d] for f in group for c in f.extra["changes"][:1] for d in c["dims"]}
                  | {c["old"][d] for f in group for c in f.extra["changes"][:1] for d in c["dims"]})
    span = f" ({len(seen)} sizes of dim {', '.join(map(str, dims))}: {seen[0]}..{seen[-1]})" if seen else ""
    names = ", ".join(c["name"] + (f" (line {c['line']})" if c.get("line") else "")
                      for c in first.extra["changes"])
    return finding("TPU701", head, where, first.severity, first.fails_on,
                   cause=f"each time {names} changed{span}: {shown}", fix=fix,
                   also=[(w.path, w.line) for w in also], **extra)


GROWING = 3  # distinct graphs from one line within one step: a loop that nothing ends


def _repeats(line, hashes: list[str], index: int, steps: list[Step]) -> bool:
    """Whether later steps ran this line's graphs again and compiled none new there: a fixed
    set of graphs (several host reads on one line each cut the step's graph: torchvision's
    make_grid, an f-string of four meters), not a loop whose graph grows."""
    ran = False
    for g in _later_graphs(line, index, steps):
        if g.kind == "compile":
            return False
        ran = ran or g.graph_hash in hashes
    return ran


def _unbarriered(step: Step, graphs: dict, script: str, steps: list[Step]) -> list[RunFinding]:
    """A line that compiled GROWING+ different graphs within one step: a loop with no barrier,
    whose every iteration carries the ops still pending from the one before (a hand-written
    update never materialised), so each graph is new and, with the HLO at hand, bigger. Not
    when later steps run the same graphs from the line again without compiling: a fixed set."""
    by_line: dict[tuple[str, int], list] = {}
    for event in step.graphs:
        line = _graph_line(event)
        if event.kind == "compile" and line is not None:
            by_line.setdefault(line, []).append(event)
    findings = []
    for where, events in by_line.items():
        hashes = list(dict.fromkeys(e.graph_hash for e in events))
        if len(hashes) < GROWING or _repeats(where, hashes, step.index, steps):
            continue
        sizes = [len(graphs[h]) for h in hashes if h in graphs]
        growing = len(sizes) == len(hashes) and sizes == sorted(sizes) and sizes[-1] > sizes[0]
        reads = [r.method for r in step.reads if (r.path, r.line) == where]
        if (not growing and step.complete and step.boundary not in ("", "end")
                and len(reads) >= len(hashes) - 1):
            findings.append(_read_cut(step, where, hashes, reads, sizes, bool(graphs)))
            continue
        grew = ""
        end = "at the end of each iteration of the loop around this line"
        if growing:
            grew = (f", and the graph grew from {sizes[0]} to {sizes[-1]} HLO instructions over "
                    f"{len(sizes)} graphs")
            last = max((op.line for op in graphs[hashes[-1]] if op.path == where[0]), default=0)
            if last:
                end = f"after line {last}, the last of the loop's ops, in each iteration"
        elif not graphs:
            grew = " (`--explain-graphs` shows whether each graph grows)"
        if end.startswith("at the end") and (loop := _loop_around(*where)) is not None:
            # the graphs carry no lines (the first step runs under the fallback tracer, which
            # IR debug cannot see past): the loop's own end, from the script's source
            end = (f"at the end of each iteration: after line {loop[1]}, the last line of the "
                   f"loop at line {loop[0]}")
        head = (f"step {step.index}: XLA compiled {len(hashes)} different graphs from this line "
                f"within one step ({step.compile_s:.2f} s of compiling in the step){grew}")
        findings.append(finding("TPU701", head, where, fails_on="recompile",
                                cause="nothing ends the loop's iterations, so each one's graph "
                                "carries the ops still pending from the one before (an update "
                                "that is never materialised)",
                                fix=f"add `torch_xla.sync()` {end}", step=step.index,
                                compile_s=round(step.compile_s, 6), graphs=hashes,
                                kind="no-barrier", sizes=sizes))
    return findings


def _loop_around(path: str, line: int) -> tuple[int, int] | None:
    """(its first line, its body's last line) of the innermost `for`/`while` of the file at
    `path` whose body holds `line`; None where there is none or the file does not parse."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and node.body \
                and node.body[0].lineno <= line <= (node.body[-1].end_lineno or 0):
            if found is None or node.lineno > found[0]:
                found = (node.lineno, node.body[-1].end_lineno)
    return found


def _read_cut(step: Step, where, hashes: list[str], reads: list[str], sizes: list[int],
              explained: bool) -> RunFinding:
    """Several graphs from one line of a step that a barrier ends, as many as the host reads
    at that line: each read runs the graph pending at that point (an f-string of four meters,
    make_grid's float() of a min and a max), not a loop that nothing ends."""
    what = ", ".join(f"`{m}` x{n}" for m, n in Counter(reads).items())
    check = ("" if explained else " (`--explain-graphs` tells: a loop without a barrier makes "
             "each graph bigger than the last)")
    head = (f"step {step.index}: XLA compiled {len(hashes)} different graphs from this line "
            f"within one step ({step.compile_s:.2f} s of compiling in the step), and the line "
            f"read the device {len(reads)} time(s) ({what})")
    return finding("TPU701", head, where, fails_on="sync",
                   cause="each read runs the graph pending at that point, so a line that reads "
                   "several values compiles a graph per read",
                   fix="read them at once (`torch.stack([a, b]).tolist()`) or less often "
                   "(TPU703); if the line is in a loop with no barrier, add `torch_xla.sync()` "
                   f"at the end of each iteration{check}", step=step.index,
                   compile_s=round(step.compile_s, 6), graphs=hashes, kind="read-cut", sizes=sizes)


def _cause_finding(step: Step, severity: Severity | None, fails_on: str | None, cause: str,
                   graphs: list, compiled: int) -> RunFinding:
    """The finding for the graphs of one step that one cause recompiled: at the first one's
    line, naming the others' lines, with the time they cost."""
    (first, where, extra), others = graphs[0], graphs[1:]
    extra = dict(extra)
    fix = extra.pop("fix", "")
    collate = extra.get("collate")
    parts = {"cause": cause, "fix": fix,
            "also": ((collate["path"], collate["line"]),) if collate else ()}
    # torch_xla times compiles per step, not per graph: with several, say the step's total
    if not others:
        took = (f"{extra['compile_s']:.2f} s" if compiled <= 1 else
                f"one of {compiled} graphs compiled in this step, {step.compile_s:.2f} s in all")
        head = (f"step {step.index}: XLA compiled a new graph (hash {_short(first.graph_hash)}, "
                f"{took}) materialising tensors at this line")
        return finding("TPU701", head, where, severity, fails_on, **parts, **extra)
    lines = sorted({w for _, w, _ in others if w != where})
    at = ("this line" + (" and " + ", ".join(f"{Path(p).name}:{n}" for p, n in lines)
                         if lines else ""))
    share = (f"{step.compile_s:.2f} s" if compiled == len(graphs) else
             f"{len(graphs)} of the {compiled} compiled in this step, {step.compile_s:.2f} s in all")
    head = (f"step {step.index}: XLA compiled {len(graphs)} new graphs for one cause ({share}; "
            f"hashes {', '.join(_short(e.graph_hash) for e, _, _ in graphs)}), materialising "
            f"tensors at {at}")
    extra = {**extra, "compile_s": round(sum(x["compile_s"] for _, _, x in graphs), 6),
             "graphs": [{"graph_hash": e.graph_hash, "path": w[0], "line": w[1]}
                        for e, w, _ in graphs]}
    return finding("TPU701", head, where, severity, fails_on, **parts, **extra)


def _recompile(step: Step, event, previous: Step | None, compile_s: float,
               fallback_lines: dict, loops: Loops,
               ddp: bool) -> tuple[Severity | None, str | None, str, dict]:
    """(severity (None: the rule's), the --fail-on kind (None: a long warm-up, which
    --fail-on recompile ignores), the cause said after the finding's head, extra) of one
    recompiled graph."""
    extra = {"step": step.index, "graph_hash": event.graph_hash, "compile_s": round(compile_s, 6),
             "xla_reason": event.cause, "changes": [], "previous_step": None}
    changes = diff(previous.shapes, step.shapes) if previous is not None else []
    dynamic = _data_dependent_lines(step, fallback_lines)
    settled = loops.settled_at(Loops.key(step))
    # Sizes that vary with the data can stop compiling once each size was seen: not warm-up.
    if settled is not None and not changes and not dynamic:
        # The loop's compiles stop for good after its first `settled` steps: a long warm-up,
        # said as such and at info severity (--fail-on recompile ignores it).
        cause = (" DistributedDataParallel does this: its reducer rebuilds the gradient buckets "
                 "after the first iteration (static_graph=True also traces the first "
                 "iterations), so the graph changes in the first few steps." if ddp else "")
        message = (f"every step of this loop up to its step {settled} compiled and none "
                   f"after ({SETTLED}+ steps): a warm-up longer than --warmup {loops.warmup}, not "
                   f"a recurring recompile.{cause} `--warmup {settled}` counts these steps as "
                   "warm-up")
        extra.update(previous_step=previous.index if previous else None, warmup_steps=settled)
        return Severity.INFO, None, message, extra
    if previous is None:
        message = ("it is the first graph from this line. Expected if this code runs "
                   "once (evaluation, a checkpoint); if it repeats, raise --warmup or look at why "
                   "the graph is new")
        return None, "recompile", message, extra
    for change in changes:
        origin = step.origins.get(change["name"])
        change["line"] = origin[1] if origin else None
    extra.update(changes=changes, previous_step=previous.index)
    if not changes:
        message = (f"against step {previous.index}'s graph from this line no batch or "
                   "forward input changed shape or dtype, so the graph itself changed")
        if dynamic:
            extra["data_dependent"] = dynamic  # the cause: no graph diff needed
            message += (f". This step ran ops whose output size depends on the data on the CPU "
                        f"({dynamic}): their results enter the graph with a new size whenever the "
                        "data changes")
            extra["fix"] = "give them fixed shapes (see TPU702)"
        else:
            extra["fix"] = ("look for Python numbers that vary per step (a float in tensor math, "
                            "a step-dependent branch, an `.item()` fed back into tensors) and "
                            "make them tensors; `tpukit run --explain-graphs` names the "
                            "instruction and the line that differ")
        return None, "recompile", message, extra
    what = "; ".join(describe(c) for c in changes)
    message = f"the inputs changed since step {previous.index}: {what}"
    extra["fix"] = _shape_fix(changes)
    if step.collate and not all(c["dims"] == [0] for c in changes):
        name, path, line = step.collate
        extra["fix"] += (f"; the batches are made by the loader's collate_fn `{name}` "
                         f"({Path(path).name}:{line}): pad there")
        extra["collate"] = {"name": name, "path": path, "line": line}
    return None, "recompile", message, extra


def _at(difference) -> str:
    return (f"{Path(difference.path).name}:{difference.line}" if difference.path
            else "an unknown line")


def _diff_fields(difference) -> dict:
    """A graph difference as a finding's `graph_diff`."""
    return {"what": difference.what, "op": difference.op, "kind": difference.kind,
            "path": difference.path, "line": difference.line}


def _graph_difference(cause: str, extra: dict, where, graphs: dict, before: str,
                      after: str) -> tuple[str, tuple[str, int]]:
    """The cause said from the two graphs' HLO: the first instruction that differs, at its
    user line, which becomes the finding's line."""
    from tpukit.run.graphs import diff_graphs, fix_for

    if before not in graphs or after not in graphs:
        return cause, where
    difference = diff_graphs(graphs[before], graphs[after], is_user_file)
    if difference is None:
        return cause, where
    at = _at(difference)
    extra["graph_diff"] = {**_diff_fields(difference),
                           "ops": [len(graphs[before]), len(graphs[after])]}
    sizes = f"{len(graphs[before])} -> {len(graphs[after])} HLO instructions"
    cause = f"{cause}. The graphs differ first at {at}: {difference.what} ({sizes})"
    extra["fix"] = fix_for(difference)  # the diff says what to look at
    if difference.path and is_user_file(difference.path):
        where = (difference.path, difference.line)
    return cause, where


DATA_DEPENDENT_OPS = ("aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique2",
                      "aten::index", "aten::repeat_interleave")


def _data_dependent_lines(step: Step, fallback_lines: dict) -> str:
    parts = []
    for op in sorted(step.fallbacks):
        if op in DATA_DEPENDENT_OPS:
            lines = sorted({line for (_, line) in fallback_lines.get(op, {})})
            parts.append(f"`{op}`" + (f" at line {', '.join(map(str, lines))}" if lines else ""))
    return "; ".join(parts)


def _shape_fix(changes: list[dict]) -> str:
    batch_only = all(c["dims"] == [0] for c in changes)
    if batch_only and all(c["new"][0] < c["old"][0] for c in changes):
        return ("a smaller batch (often the last of an epoch): `DataLoader(..., drop_last=True)` "
                "or pad it to the full batch size")
    if any(c["old_dtype"] != c["new_dtype"] for c in changes):
        return "cast the input to one dtype before the model"
    dims = sorted({d for c in changes for d in c["dims"]})
    where = f"dim {', '.join(map(str, dims))}" if dims else "the changed dimensions"
    return (f"pad {where} to a fixed size or to a few bucket sizes (`tpukit.buckets`), so that "
            "XLA compiles one graph per bucket instead of one per size")
