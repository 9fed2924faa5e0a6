"""Top ops by self time and the per-step breakdown of one XProf capture, with xprof's converter.

    python -m tpukit.run.xprof_summary RUN_DIR   ->  JSON on stdout

Which table the ops come from is said in `ops_source`:
- "device": xprof's `framework_op_stats`, device rows (a TPU fills them: the XLA ops the
  device ran, by self time);
- "host": on XLA:CPU that table is empty (no device plane), so the ops are the host events of
  `trace_viewer` (compilation, graph execution, transfers, tracing), self time = duration minus
  the events nested in it on the same thread. A profiled step's own self time is the Python
  that ran in it outside any traced call.
The steps come from `overview_page` (its step-time breakdown), on either.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

TOP = 15
PYTHON_TIME = "Python (step time outside traced calls)"


def _table_rows(table: dict) -> list[dict]:
    ids = [c["id"] for c in table.get("cols", [])]
    return [{k: cell.get("v") for k, cell in zip(ids, row.get("c", []))}
            for row in table.get("rows", [])]


def device_ops(framework_op_stats: list[dict]) -> list[dict]:
    ops = []
    for table in framework_op_stats:
        for row in _table_rows(table):
            if row.get("host_or_device") != "Device" or row.get("type") == "IDLE":
                continue
            ops.append({
                "name": row.get("operation") or "?", "category": row.get("type") or "",
                "occurrences": int(row.get("occurrences") or 0),
                "self_us": float(row.get("total_self_time") or 0.0),
                "total_us": float(row.get("total_time") or 0.0),
            })
        if ops:  # the first table holds all ops; the second repeats them without IDLE
            break
    return ops


def host_ops(trace_events: list[dict]) -> list[dict]:
    """Self time per event name over the host threads of a trace_viewer JSON."""
    threads: dict[tuple, list[dict]] = defaultdict(list)
    for event in trace_events:
        if event.get("ph") == "X" and "dur" in event:
            threads[(event.get("pid"), event.get("tid"))].append(event)
    totals: dict[str, dict] = {}
    for events in threads.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []  # [end, name, time in children, duration]
        for event in events:
            start, end = event["ts"], event["ts"] + event["dur"]
            while stack and stack[-1][0] <= start:
                _account(totals, stack.pop())
            if stack:
                stack[-1][2] += min(end, stack[-1][0]) - start
            name = PYTHON_TIME if (event.get("args") or {}).get("step_name") else event["name"]
            entry = totals.setdefault(name, {"name": name, "category": "host", "occurrences": 0,
                                             "self_us": 0.0, "total_us": 0.0})
            entry["occurrences"] += 1
            entry["total_us"] += event["dur"]
            stack.append([end, name, 0.0, event["dur"]])
        while stack:
            _account(totals, stack.pop())
    return list(totals.values())


def _account(totals: dict, frame: list) -> None:
    _, name, children, duration = frame
    totals[name]["self_us"] += max(0.0, duration - children)


def steps(overview_page: list[dict]) -> list[dict]:
    for table in overview_page:
        ids = [c["id"] for c in table.get("cols", [])]
        if "stepnum" in ids and "stepTimeMs" in ids:
            return [{k: v for k, v in row.items() if k != "tooltip"} for row in _table_rows(table)]
    return []


def top(ops: list[dict], n: int = TOP) -> list[dict]:
    total = sum(op["self_us"] for op in ops) or 1.0
    ranked = sorted(ops, key=lambda op: -op["self_us"])[:n]
    return [{**op, "self_us": round(op["self_us"], 3), "total_us": round(op["total_us"], 3),
             "self_share": round(op["self_us"] / total, 4)} for op in ranked]


def summarise(run_dir: Path) -> dict:
    from xprof.convert import raw_to_tool_data as convert

    paths = [str(p) for p in sorted(run_dir.glob("*.xplane.pb"))]

    def tool(name: str):
        data, _ = convert.xspace_to_tool_data(paths, name, {})
        return json.loads(data) if data else []

    ops, source = device_ops(tool("framework_op_stats")), "device"
    if not ops:
        ops, source = host_ops(tool("trace_viewer").get("traceEvents", [])), "host"
    overview = tool("overview_page")
    hardware = next((t.get("p", {}).get("hardware_type") for t in overview
                     if t.get("p", {}).get("hardware_type")), None)
    return {"ops_source": source, "hardware": hardware, "top_ops": top(ops),
            "op_count": len(ops), "step_breakdown": steps(overview)}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tpukit.run.xprof_summary RUN_DIR", file=sys.stderr)
        return 2
    print(json.dumps(summarise(Path(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
