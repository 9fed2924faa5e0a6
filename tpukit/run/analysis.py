"""Turns the probe's step records into a summary and findings (TPU701-703)."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tpukit.findings import Finding, FixKind, Location, Severity
from tpukit.rules import load_rules
from tpukit.run.frames import is_user_file
from tpukit.run.probe import Probe
from tpukit.run.summary import StepStats
from tpukit.run.shapes import describe, diff
from tpukit.run.steps import Step

SCALAR_READ_OP = "aten::_local_scalar_dense"  # `.item()`: reported as a host sync (TPU703)
FAIL_ON = ("recompile", "fallback", "sync")
SETTLED = 3  # quiet steps after a loop's last compile that show its warm-up is over
DDP = "DistributedDataParallel"


@dataclass
class RunFinding(Finding):
    """A finding of the run's analysis, with the --fail-on kind it counts as (one of FAIL_ON;
    None: it never fails the run, e.g. a long warm-up's recompile, a read outside the hot
    loop, advice)."""

    fails_on: str | None = None


@dataclass
class Recompiles:
    findings: list[RunFinding]
    long_warmup_steps: set[int] = field(default_factory=set)  # compiled in a loop's long warm-up


@dataclass
class Analysis:
    stats: StepStats
    findings: list[RunFinding]
    loops: Loops

    def failures(self, fail_on: list[str]) -> list[str]:
        """The --fail-on kinds that occurred."""
        return [kind for kind in fail_on if any(f.fails_on == kind for f in self.findings)]


class Loops:
    """Steps grouped by the line that ends them: a training loop, an eval loop, ... Warm-up is
    per loop: the first K steps of each loop compile its graphs (an eval loop that first runs at
    step 500 warms up then, and its first compile there is not a recompile)."""

    def __init__(self, steps: list[Step], warmup: int) -> None:
        self.warmup = warmup
        self.ordinal: dict[int, int] = {}
        self.members: dict[tuple, list[Step]] = {}
        for step in steps:
            members = self.members.setdefault(self.key(step), [])
            members.append(step)
            self.ordinal[step.index] = len(members)
        self._settled = {key: self._settled_at(members) for key, members in self.members.items()}

    @staticmethod
    def key(step: Step) -> tuple:
        return step.boundary_at or (step.boundary, 0)

    def steady(self, step: Step) -> bool:
        return step.complete and self.ordinal[step.index] > self.warmup

    def steady_of(self, key: tuple) -> list[Step]:
        return [s for s in self.members.get(key, []) if self.steady(s)]

    def settled_at(self, key: tuple) -> int | None:
        """The loop's own warm-up, when it outlasts --warmup: every step up to the S-th compiled,
        none after, and at least SETTLED complete steps ran after; else None. (DDP's reducer
        changes the graph in a loop's first 3-4 steps, then never again.)"""
        return self._settled.get(key)

    def _settled_at(self, members: list[Step]) -> int | None:
        compiled = [bool(s.compiles) for s in members]
        if True not in compiled:
            return None
        last = len(compiled) - compiled[::-1].index(True)  # ordinal of the last compiling step
        quiet = sum(1 for s in members[last:] if s.complete)
        if last > self.warmup and all(compiled[:last]) and quiet >= SETTLED:
            return last
        return None

    def main(self) -> tuple | None:
        """The loop with the most steps (the training loop, almost always)."""
        complete = {k: v for k, v in self.members.items() if any(s.complete for s in v)}
        return max(complete, key=lambda k: len(complete[k])) if complete else None


def finding(code: str, message: str, where: tuple[str, int], severity: Severity | None = None,
            fails_on: str | None = None, **extra) -> RunFinding:
    return RunFinding.from_rule(load_rules()[code], Location(where[0], where[1]), message,
                                severity=severity, fix=FixKind.NONE, extra=extra,
                                fails_on=fails_on)


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
                if graphs and previous is not None and not extra["changes"] and severity is None:
                    cause, where = _graph_difference(cause, extra, where, graphs,
                                                     previous_hash, event.graph_hash)
                if fails_on is None:
                    found.long_warmup_steps.add(step.index)
                causes.setdefault((severity, fails_on, cause), []).append((event, where, extra))
            history.append((line, event.graph_hash, step.index))
        # One cause, one finding: a ragged last batch recompiles every graph of its step.
        findings += [_cause_finding(step, severity, fails_on, cause, graphs, len(compiled))
                     for (severity, fails_on, cause), graphs in causes.items()]
        findings += _unbarriered(step, graphs or {}, script)
        if not step.graphs and step.compiles and loops.steady(step):  # no debug log to read
            findings.append(finding(
                "TPU701", f"step {step.index}: XLA compiled {step.compiles} new graph(s) "
                f"({step.compile_s:.2f} s) after warm-up", step.boundary_at or (script, 1),
                fails_on="recompile", step=step.index, compile_s=step.compile_s))
    return found


GROWING = 3  # distinct graphs from one line within one step: a loop that nothing ends


def _unbarriered(step: Step, graphs: dict, script: str) -> list[Finding]:
    """A line that compiled GROWING+ different graphs within one step: a loop with no barrier,
    whose every iteration carries the ops still pending from the one before (a hand-written
    update never materialised), so each graph is new and, with the HLO at hand, bigger."""
    by_line: dict[tuple[str, int], list] = {}
    for event in step.graphs:
        line = _graph_line(event)
        if event.kind == "compile" and line is not None:
            by_line.setdefault(line, []).append(event)
    findings = []
    for where, events in by_line.items():
        hashes = list(dict.fromkeys(e.graph_hash for e in events))
        if len(hashes) < GROWING:
            continue
        sizes = [len(graphs[h]) for h in hashes if h in graphs]
        grew = ""
        end = "at the end of each iteration of the loop around this line"
        if len(sizes) == len(hashes) and sizes == sorted(sizes) and sizes[-1] > sizes[0]:
            grew = (f", and the graph grew from {sizes[0]} to {sizes[-1]} HLO instructions over "
                    f"{len(sizes)} graphs")
            last = max((op.line for op in graphs[hashes[-1]] if op.path == where[0]), default=0)
            if last:
                end = f"after line {last}, the last of the loop's ops, in each iteration"
        elif not graphs:
            grew = " (`--explain-graphs` shows whether each graph grows)"
        message = (f"step {step.index}: XLA compiled {len(hashes)} different graphs from this line "
                   f"within one step ({step.compile_s:.2f} s of compiling in the step){grew}: "
                   "nothing ends the loop's iterations, so each one's graph carries the ops still "
                   "pending from the one before (an update that is never materialised). Fix: "
                   f"add `torch_xla.sync()` {end}")
        findings.append(finding("TPU701", message, where, fails_on="recompile", step=step.index,
                                compile_s=round(step.compile_s, 6), graphs=hashes,
                                kind="no-barrier", sizes=sizes))
    return findings


def _cause_finding(step: Step, severity: Severity | None, fails_on: str | None, cause: str,
                   graphs: list, compiled: int) -> RunFinding:
    """The finding for the graphs of one step that one cause recompiled: at the first one's
    line, naming the others' lines, with the time they cost."""
    (first, where, extra), others = graphs[0], graphs[1:]
    # torch_xla times compiles per step, not per graph: with several, say the step's total
    if not others:
        took = (f"{extra['compile_s']:.2f} s" if compiled <= 1 else
                f"one of {compiled} graphs compiled in this step, {step.compile_s:.2f} s in all")
        head = (f"step {step.index}: XLA compiled a new graph (hash {_short(first.graph_hash)}, "
                f"{took}) materialising tensors at this line")
        return finding("TPU701", head + cause, where, severity, fails_on, **extra)
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
    return finding("TPU701", head + cause, where, severity, fails_on, **extra)


def _recompile(step: Step, event, previous: Step | None, compile_s: float,
               fallback_lines: dict, loops: Loops,
               ddp: bool) -> tuple[Severity | None, str | None, str, dict]:
    """(severity (None: the rule's), the --fail-on kind (None: a long warm-up, which
    --fail-on recompile ignores), the cause said after the finding's head, extra) of one
    recompiled graph."""
    extra = {"step": step.index, "graph_hash": event.graph_hash, "compile_s": round(compile_s, 6),
             "cause": event.cause, "changes": [], "previous_step": None}
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
        message = (f"; every step of this loop up to its step {settled} compiled and none "
                   f"after ({SETTLED}+ steps): a warm-up longer than --warmup {loops.warmup}, not "
                   f"a recurring recompile.{cause} `--warmup {settled}` counts these steps as "
                   "warm-up")
        extra.update(previous_step=previous.index if previous else None, warmup_steps=settled)
        return Severity.INFO, None, message, extra
    if previous is None:
        message = ("; it is the first graph from this line. Expected if this code runs "
                   "once (evaluation, a checkpoint); if it repeats, raise --warmup or look at why "
                   "the graph is new")
        return None, "recompile", message, extra
    for change in changes:
        origin = step.origins.get(change["name"])
        change["line"] = origin[1] if origin else None
    extra.update(changes=changes, previous_step=previous.index)
    if not changes:
        message = (f"; against step {previous.index}'s graph from this line no batch or "
                   "forward input changed shape or dtype, so the graph itself changed")
        if dynamic:
            message += (f". This step ran ops whose output size depends on the data on the CPU "
                        f"({dynamic}): their results enter the graph with a new size whenever the "
                        "data changes. Fix: give them fixed shapes (see TPU702)")
        else:
            message += (": look for Python numbers that vary per step (a float in tensor math, a "
                        "step-dependent branch, an `.item()` fed back into tensors) and make them "
                        "tensors; `tpukit run --explain-graphs` names the instruction and the "
                        "line that differ")
        return None, "recompile", message, extra
    what = "; ".join(describe(c) for c in changes)
    message = f"; changed since step {previous.index}: {what}. Fix: {_shape_fix(changes)}"
    if step.collate and not all(c["dims"] == [0] for c in changes):
        name, path, line = step.collate
        message += (f"; the batches are made by the loader's collate_fn `{name}` "
                    f"({Path(path).name}:{line}): pad there")
        extra["collate"] = {"name": name, "path": path, "line": line}
    return None, "recompile", message, extra


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
    at = f"{Path(difference.path).name}:{difference.line}" if difference.path else "an unknown line"
    extra["graph_diff"] = {"what": difference.what, "op": difference.op, "kind": difference.kind,
                           "path": difference.path, "line": difference.line,
                           "ops": [len(graphs[before]), len(graphs[after])]}
    head = cause.split(": look for Python numbers", 1)[0]  # the diff says what to look at
    sizes = f"{len(graphs[before])} -> {len(graphs[after])} HLO instructions"
    cause = (f"{head}. The graphs differ first at {at}: {difference.what} ({sizes}). Fix: "
             f"{fix_for(difference)}")
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


def fallback_findings(probe: Probe, steps: list[Step], loops: Loops,
                      script: str) -> list[RunFinding]:
    fixes = load_rules()["TPU702"].extra.get("fixes", {})
    totals: Counter = Counter()
    steady: Counter = Counter()
    for step in steps:
        for op, n in step.fallbacks.items():
            totals[op] += n
            if loops.steady(step):
                steady[op] += n
    steady_steps = max(1, sum(1 for s in steps if loops.steady(s)))
    findings = []
    for op, total in sorted(totals.items()):
        if op == SCALAR_READ_OP:
            continue
        rate = steady[op] / steady_steps
        fix = fixes.get(op, "find a fixed-shape form of this op, or move it out of the training step")
        lines = sorted(probe.fallback_lines.get(op, {}).items(), key=lambda kv: kv[0])
        first = next((s.index for s in steps if op in s.fallbacks), None)
        extra = {"op": op, "count": total, "per_step": round(rate, 4), "first_step": first}
        what = (f"{total} time(s) in all ({rate:.2g} per step after warm-up, first in step "
                f"{first})")
        effect = "each call copies tensors to the host and back and cuts the graph"
        if not lines:
            findings.append(finding(
                "TPU702", f"`{op}` ran on the CPU {what}: {effect}. Fix: {fix} (the calling line "
                "was not seen: it ran only outside the traced steps)", (script, 1),
                fails_on="fallback", **extra))
        for where, calls in lines:
            share = f"; this line is one of {len(lines)} calling it" if len(lines) > 1 else ""
            message = f"`{op}` ran on the CPU {what}{share}: {effect}. Fix: {fix}"
            findings.append(finding("TPU702", message, where, fails_on="fallback",
                                    traced_calls=calls, **extra))
    return findings


def sync_findings(steps: list[Step], loops: Loops) -> list[RunFinding]:
    fixes = load_rules()["TPU703"].extra.get("fixes", {})
    per_line: dict[tuple[str, int], dict] = {}
    for step in steps:
        for read in step.reads:
            entry = per_line.setdefault((read.path, read.line), {
                "count": 0, "bytes": 0, "wait_s": 0.0, "methods": Counter(), "steps": set(),
                "loops": Counter()})
            entry["count"] += 1
            entry["bytes"] += read.nbytes
            entry["wait_s"] += read.wait_s
            entry["methods"][read.method] += 1
            entry["steps"].add(step.index)
            entry["loops"][Loops.key(step)] += 1
    findings = []
    for where, entry in sorted(per_line.items()):
        method = entry["methods"].most_common(1)[0][0]
        # The rate is per step of the loop this line reads in most.
        loop = entry["loops"].most_common(1)[0][0]
        steady = loops.steady_of(loop)
        reading = sum(1 for s in steady if s.index in entry["steps"])
        rate = sum(1 for s in steady for r in s.reads if (r.path, r.line) == where) / len(steady) \
            if steady else 0.0
        hot = bool(steady) and reading >= len(steady) / 2
        shown = f"`.{method}()`" if not method.startswith("__") else f"`{method[2:-2]}(tensor)`"
        message = (f"{shown} copies device data to the host {entry['count']} time(s) "
                   f"({rate:.2g} per step after warm-up, {entry['bytes']} bytes in all, "
                   f"{entry['wait_s']:.2f} s waiting): the host "
                   f"waits for the device{' every step' if hot else ''}. "
                   f"Fix: {fixes.get(method, 'read it outside the step')}")
        findings.append(finding(
            "TPU703", message, where, None if hot else Severity.INFO,
            "sync" if hot else None, method=method,
            count=entry["count"], per_step=round(rate, 4), bytes=entry["bytes"],
            wait_s=round(entry["wait_s"], 6), steps=sorted(entry["steps"])[:50]))
    return findings


def cost_s(finding: Finding) -> float:
    """The seconds a finding cost the run, where it is known: a recompile's compile time, a
    host read's waiting. (A CPU fallback's own time is not measured: 0.)"""
    return finding.extra.get("compile_s") or finding.extra.get("wait_s") or 0.0


def by_cost(findings: list[Finding]) -> list[Finding]:
    """Dearest first; the ones of unknown cost after, in the order they were made."""
    return sorted(findings, key=lambda f: -cost_s(f))


def analyse(probe: Probe, warmup: int, script: str) -> Analysis:
    steps = probe.steps
    loops = Loops(steps, warmup)
    compiles = [g for s in steps for g in s.graphs if g.kind == "compile"]
    dump = probe.graph_dump
    recompiles = recompile_findings(steps, loops, script, probe.fallback_lines, probe.models,
                                    dump.graphs if dump is not None else None)
    findings = by_cost(recompiles.findings + fallback_findings(probe, steps, loops, script)
                       + sync_findings(steps, loops))
    fallback_total = sum(n for s in steps for op, n in s.fallbacks.items() if op != SCALAR_READ_OP)
    long_warmup = recompiles.long_warmup_steps
    main = loops.main()
    main_steady = loops.steady_of(main) if main else []
    stats = StepStats(
        steps=sum(s.complete for s in steps),
        warmup=warmup,
        steady_steps=sum(1 for s in steps if loops.steady(s)),
        step_time_median_s=_median(main_steady),
        main_loop=_where(main),
        loops=[
            {**_where(key), "steps": len(members), "steady_steps": len(loops.steady_of(key)),
             "step_time_median_s": _median(loops.steady_of(key))}
            for key, members in sorted(loops.members.items(), key=lambda kv: -len(kv[1]))
            if any(s.complete for s in members)
        ],
        compiles=sum(s.compiles for s in steps),
        compile_s=round(sum(s.compile_s for s in steps), 6),
        distinct_graphs=len({g.graph_hash for g in compiles}) if compiles
        else sum(s.compiles for s in steps),
        recompiles_after_warmup=sum(s.compiles for s in steps if loops.steady(s)),
        recompiles_in_long_warmup=sum(s.compiles for s in steps if s.index in long_warmup),
        fallbacks=fallback_total,
        host_syncs=sum(len(s.reads) for s in steps),
        host_wait_s=round(sum(r.wait_s for s in steps for r in s.reads), 6),
        host_transfers=sum(s.transfers for s in steps),
        stopped_early=probe.stopped_early,
        step_records=[{**s.to_dict(), "warmup": not loops.steady(s)} for s in steps],
    )
    return Analysis(stats, findings, loops)


def _median(steps: list[Step]) -> float | None:
    return round(statistics.median(s.wall_s for s in steps), 6) if steps else None


def _where(key: tuple | None) -> dict:
    if key is None:
        return {"path": None, "line": None}
    return {"path": key[0], "line": key[1]} if key[1] else {"path": None, "line": None,
                                                             "boundary": key[0]}
