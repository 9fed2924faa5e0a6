"""The run report's summary, shown: the summary line (live and saved reports alike), the
summary table and the profile's top ops (text output, on stderr). Takes the JSON `summary`
object (RunSummary.to_dict(), or a saved report's), so `tpukit report` shows it again."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from tpukit.run import summary as run_summary_type


def print_profile(profile: dict, stream) -> None:
    console = Console(file=stream, highlight=False)
    if profile.get("error"):
        console.print(f"tpukit: profile: {profile['error']}")
    ops = profile.get("top_ops") or []
    if ops:
        source = ("device ops (xprof framework_op_stats)" if profile.get("ops_source") == "device"
                  else "host events (xprof trace_viewer; XLA:CPU has no device op table)")
        steps = profile.get("steps") or []
        table = Table(title=f"Top ops by self time, steps {steps[0]}-{steps[-1]}: {source}"
                      if steps else f"Top ops by self time: {source}")
        for column in ("op", "occurrences", "self ms", "self %", "total ms"):
            table.add_column(column, justify="left" if column == "op" else "right")
        for op in ops:
            table.add_row(op["name"], str(op["occurrences"]), f"{op['self_us'] / 1000:.2f}",
                          f"{op['self_share']:.1%}", f"{op['total_us'] / 1000:.2f}")
        console.print(table)
    if profile.get("run_dir"):
        console.print(f"trace: {profile['run_dir']}")
        for command in profile.get("open_with", []):
            console.print(f"open it: {command}")


def summary_line(summary: dict) -> str:
    if summary.get("partial"):
        ended = f"died of {summary['signal']}" if summary.get("signal") else "did not finish"
        return (f"run (partial: the run {ended}): {summary['steps']} step(s) recorded, "
                f"{summary['distinct_graphs']} graph(s) compiled in {summary['compile_s']:.2f} s, "
                f"{summary['recompiles_after_warmup']} after warm-up; {summary['fallbacks']} CPU "
                f"fallback(s); {summary['host_syncs']} host read(s)")
    median = summary["step_time_median_s"]
    median_text = f"median step {median * 1000:.1f} ms" if median is not None else "no steady-state steps"
    stopped = " (stopped by --max-steps)" if summary["stopped_early"] else ""
    line = (f"run: {summary['steps']} step(s){stopped}, {median_text}; "
            f"{summary['distinct_graphs']} graph(s) compiled in {summary['compile_s']:.2f} s, "
            f"{summary['recompiles_after_warmup']} after warm-up; {summary['fallbacks']} CPU "
            f"fallback(s); {summary['host_syncs']} host read(s)")
    if summary["failed_on"]:
        line += f"; failing on: {', '.join(summary['failed_on'])}"
    return line


def _median_text(summary: dict) -> str:
    main = summary["main_loop"]
    loop = next((l for l in summary["loops"] if l.get("line") == main.get("line")
                 and l.get("path") == main.get("path")), None)
    where = f" of the loop ending at line {main['line']}" if main.get("line") else ""
    count = loop["steady_steps"] if loop else summary["steady_steps"]
    return f"{summary['step_time_median_s'] * 1000:.1f} ms (median of {count} steps{where})"


def _eval_text(summary: dict) -> str:
    n = summary.get("eval_batches", 0)  # absent from older saved reports
    return f" (+{n} eval batch{'es' if n != 1 else ''})" if n else ""


def _recompiles_text(summary: dict) -> str:
    total, settling = summary["recompiles_after_warmup"], summary["recompiles_in_long_warmup"]
    first = summary.get("first_graphs_after_warmup", 0)  # absent from older saved reports
    also = (f"; +{first} first graph(s) of code that first ran after warm-up"
            if first else "")
    if not settling:
        return f"{total} ({also[2:]})" if first else str(total)
    which = "all" if settling == total else str(settling)
    return f"{total} ({which} in a warm-up longer than --warmup: see TPU701{also})"


def _shares_text(summary: dict) -> str:
    shares = summary.get("time_shares") or {}
    return (f"compiling {shares.get('compile', 0):.0%} ({summary['compile_s']:.2f} s), host "
            f"waiting on reads {shares.get('host_wait', 0):.0%} ({summary.get('host_wait_s', 0):.2f} s);"
            " findings below, dearest first")


def _cache_text(cache: dict) -> str:
    """The persistent compilation cache in a line: where, and what it did."""
    if cache["path"] is None:
        return {"off": "off (--no-compile-cache)", "unwritable": f"none: {cache['problem']}",
                "started": "none (torch_xla started before tpukit run)"}.get(
                    cache["source"], "none")
    whose = {"user": " (XLA_PERSISTENT_CACHE_PATH)", "started": " (set before tpukit run)"}
    said = (f"{cache['path']}{whose.get(cache['source'], '')}: {cache['hits']} loaded"
            f" ({cache['load_s']:.2f} s), {cache['misses']} compiled"
             + ("" if cache["read_only"] else " and written"))
    if cache["failures"]:
        said += f", {cache['failures']} unreadable (compiled again)"
    return said


def print_summary(summary: dict, stream) -> None:
    table = Table(title=f"tpukit run: {summary['script']} on {summary['device']}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    median = summary["step_time_median_s"]
    outcome = (f"{summary['outcome']} (exit {summary['exit_code']})" if not summary.get("partial")
               else f"died of {summary['signal']} (exit {summary['exit_code']}): this report was "
               "written while the script ran" if summary.get("signal")
               else "did not finish: this report was written while the script ran (killed?)")
    rows = [
        ("outcome", outcome),
        ("steps", f"{summary['steps']}{_eval_text(summary)} in {len(summary['loops'])} loop(s) "
                  f"({summary['warmup']} warm-up each"
                  f"{', stopped by --max-steps' if summary['stopped_early'] else ''})"),
        ("steady-state step time", _median_text(summary) if median is not None
         else "n/a (no step after warm-up)"),
        ("compilations", f"{summary['compiles']} ({summary['compile_s']:.2f} s), "
                         f"{summary['distinct_graphs']} distinct graph(s)"),
        ("recompiles after warm-up", _recompiles_text(summary)),
        ("CPU fallbacks", str(summary["fallbacks"])),
        ("host reads", f"{summary['host_syncs']} ({summary['host_transfers']} transfers)"),
        ("wall time", f"{summary['wall_s']:.2f} s"),
        ("where it went", _shares_text(summary)),
    ]
    if summary.get("compile_cache"):
        rows.insert(5, ("compile cache", _cache_text(summary["compile_cache"])))
    if summary.get("mappings"):
        rows.insert(1, ("memory mappings", run_summary_type.describe_mappings(summary["mappings"])))
    for key, label in (("in_progress", "in progress"), ("stopped_in", "stopped in")):
        if summary.get(key):
            rows.insert(1, (label, run_summary_type.describe_activity(summary[key])))
    rows[1:1] = [("launch", f"{Path(launch['path']).name}:{launch['line']} ran in this process "
                            "at world size 1") for launch in summary["launches"]]
    for name, value in rows:
        table.add_row(name, value)
    Console(file=stream, highlight=False).print(table)
