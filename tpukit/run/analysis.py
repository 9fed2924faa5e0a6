"""Turns the probe's step records into step statistics and findings: recompiles (TPU701,
recompiles.py), CPU fallbacks (TPU702) and host reads (TPU703)."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tpukit.findings import Finding, Severity
from tpukit.rules import load_rules
from tpukit.run.loops import Loops
from tpukit.run.probe import Probe
from tpukit.run.recompiles import recompile_findings
from tpukit.run.run_finding import FAIL_ON, RunFinding, finding
from tpukit.run.steps import Step
from tpukit.run.summary import StepStats

__all__ = ["FAIL_ON", "Analysis", "Loops", "analyse", "by_cost", "finding", "recompile_findings"]

SCALAR_READ_OP = "aten::_local_scalar_dense"  # `.item()`: reported as a host sync (TPU703)


@dataclass
class Analysis:
    stats: StepStats
    findings: list[RunFinding]
    loops: Loops

    def failures(self, fail_on: list[str]) -> list[str]:
        """The --fail-on kinds that occurred."""
        return [kind for kind in fail_on if any(f.fails_on == kind for f in self.findings)]


def fallback_findings(probe: Probe, steps: list[Step], loops: Loops, script: str,
                      device: str = "") -> list[RunFinding]:
    """TPU702 per op and calling line; `device`: the run's PJRT_DEVICE (an op torch_xla lowers
    on a TPU only is information, not a failure, on another device)."""
    rule = load_rules()["TPU702"]
    fixes, lowered = rule.extra.get("fixes", {}), rule.extra.get("lowered_on_tpu", {})
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
        severity, fails_on = None, "fallback"
        if op in lowered and device != "TPU":
            fix = (f"nothing to change for a TPU: torch_xla 2.9 lowers `{op}` ({lowered[op]}) "
                   f"on a TPU and runs it on the CPU on other devices (here {device or 'not a TPU'})")
            severity, fails_on = Severity.INFO, None
        lines = sorted(probe.fallback_lines.get(op, {}).items(), key=lambda kv: kv[0])
        first = next((s.index for s in steps if op in s.fallbacks), None)
        extra = {"op": op, "count": total, "per_step": round(rate, 4), "first_step": first}
        what = (f"{total} time(s) in all ({rate:.2g} per step after warm-up, first in step "
                f"{first})")
        effect = "each call copies tensors to the host and back and cuts the graph"
        if not lines:
            findings.append(finding(
                "TPU702", f"`{op}` ran on the CPU {what} (the calling line was not seen: it ran "
                "only outside the traced steps)", (script, 1), severity, fails_on,
                cause=effect, fix=fix, **extra))
        for where, calls in lines:
            share = f"; this line is one of {len(lines)} calling it" if len(lines) > 1 else ""
            caller = probe.fallback_callers.get(where)
            via, more, also = "", {}, ()
            if caller is not None:
                path, line, forward = caller
                via = f" (in `{forward}`, called from {Path(path).name}:{line})"
                more = {"called_from": {"path": path, "line": line, "function": forward}}
                also = ((path, line),)
            findings.append(finding("TPU702", f"`{op}` ran on the CPU {what}{share}{via}", where,
                                    severity, fails_on, cause=effect, fix=fix, also=also,
                                    traced_calls=calls, **extra, **more))
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
        fix = fixes.get(method, "read it outside the step")
        head = (f"{shown} copies device data to the host {entry['count']} time(s) "
                f"({rate:.2g} per step after warm-up, {entry['bytes']} bytes in all, "
                f"{entry['wait_s']:.2f} s waiting)")
        findings.append(finding(
            "TPU703", head, where, None if hot else Severity.INFO, "sync" if hot else None,
            cause=f"the host waits for the device{' every step' if hot else ''}", fix=fix,
            method=method,
            count=entry["count"], per_step=round(rate, 4), bytes=entry["bytes"],
            wait_s=round(entry["wait_s"], 6), steps=sorted(entry["steps"])[:50]))
    return findings


def untrained_findings(probe: Probe, script: str) -> list[RunFinding]:
    """TPU709: an optimizer whose first step after a backward updated none of its parameters."""
    rule = load_rules()["TPU709"]
    findings = []
    for found in probe.untrained.found:
        values = {"optimizer": found["optimizer"], "count": found["parameters"],
                  "step": found["step"], "devices": "/".join(found["devices"])}
        # parameters off the device: built before the move; on it: not the loss's model
        message = rule.say("xla", "stale", **values) if found["devices"] != ["xla"] \
            else rule.say("xla", "same_device", **values)
        where = (found["path"], found["line"]) if found["path"] else (script, 1)
        findings.append(finding("TPU709", message.what, where, cause=message.cause,
                                fix=message.fix, **found))
    return findings


def storm_findings(probe: Probe, script: str) -> list[RunFinding]:
    """TPU710: the run stopped because one step compiled too many new graphs."""
    storm = probe.storm
    if storm is None:
        return []
    near = storm["mappings"]
    why = (f"the process holds {near['mappings']:,} memory mappings of the kernel's "
           f"{near['limit']:,}, where XLA:CPU dies" if near else
           f"{storm['limit']} new graphs in one step is --storm-graphs")
    rule = load_rules()["TPU710"]
    values = dict(step=storm["step"], graphs=storm["graphs"], at_line=storm["at_line"],
                  call=storm["call"], why=why)
    # where no barrier or host read compiled them (storm_watch.py), there is no line count
    message = rule.say("xla", "storm", **values) if storm["at_line"] is not None \
        else rule.say("xla", "storm_op", **values)
    where = (storm["path"], storm["line"]) if storm["path"] else (script, 1)
    return [finding("TPU710", message.what, where, cause=message.cause, fix=message.fix,
                    fails_on="recompile", **{k: v for k, v in storm.items()
                                             if k not in ("path", "line")})]


def cost_s(finding: Finding) -> float:
    """The seconds a finding cost the run, where it is known: a recompile's compile time, a
    host read's waiting. (A CPU fallback's own time is not measured: 0.)"""
    return finding.extra.get("compile_s") or finding.extra.get("wait_s") or 0.0


def by_cost(findings: list[Finding]) -> list[Finding]:
    """Dearest first; the ones of unknown cost after, in the order they were made."""
    return sorted(findings, key=lambda f: -cost_s(f))


def analyse(probe: Probe, warmup: int, script: str, device: str = "") -> Analysis:
    steps = probe.steps
    loops = Loops(steps, warmup)
    compiles = [g for s in steps for g in s.graphs if g.kind == "compile"]
    dump = probe.graph_dump or probe.graph_capture
    recompiles = recompile_findings(steps, loops, script, probe.fallback_lines, probe.models,
                                    dump.graphs if dump is not None else None)
    findings = storm_findings(probe, script) + untrained_findings(probe, script) + by_cost(
        recompiles.findings + fallback_findings(probe, steps, loops, script, device)
        + sync_findings(steps, loops))
    fallback_total = sum(n for s in steps for op, n in s.fallbacks.items() if op != SCALAR_READ_OP)
    long_warmup = recompiles.long_warmup_steps
    main = loops.main()
    main_steady = loops.steady_of(main) if main else []
    stats = StepStats(
        steps=sum(s.complete and s.kind == "train" for s in steps),
        eval_batches=sum(s.complete and s.kind == "eval" for s in steps),
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
        recompiles_after_warmup=sum(s.compiles for s in steps if loops.steady(s)) - recompiles.first_graphs,
        recompiles_in_long_warmup=sum(s.compiles for s in steps if s.index in long_warmup),
        first_graphs_after_warmup=recompiles.first_graphs,
        fallbacks=fallback_total,
        host_syncs=sum(len(s.reads) for s in steps),
        host_wait_s=round(sum(r.wait_s for s in steps for r in s.reads), 6),
        host_transfers=sum(s.transfers for s in steps),
        stopped_early=probe.stopped_early,
        step_records=[{**s.to_dict(), "warmup": not loops.steady(s)} for s in steps],
        graph_capture_s=round(probe.graph_capture.seconds, 6) if probe.graph_capture else 0.0,
    )
    return Analysis(stats, findings, loops)


def _median(steps: list[Step]) -> float | None:
    return round(statistics.median(s.wall_s for s in steps), 6) if steps else None


def _where(key: tuple | None) -> dict:
    if key is None:
        return {"path": None, "line": None}
    return {"path": key[0], "line": key[1]} if key[1] else {"path": None, "line": None,
                                                             "boundary": key[0]}
