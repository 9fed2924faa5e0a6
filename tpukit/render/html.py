"""`tpukit run --html PATH`: one self-contained HTML file (plotly's JavaScript inlined, nothing
fetched when it is opened) with the step-time chart, compilations and fallbacks marked on it,
the findings, the advice with its code, and the profile's top ops when there is one."""

from __future__ import annotations

import html
import json
from pathlib import Path

from tpukit.atomic import atomic_write
from tpukit.render.json_format import as_dict

ADVICE = ("TPU705", "TPU706")


class HtmlUnavailable(Exception):
    pass


def step_chart(steps: list[dict]):
    """A plotly figure: one bar per step (ms), coloured by what happened in it."""
    try:
        import plotly.graph_objects as go
    except ImportError as exc:
        raise HtmlUnavailable("--html needs plotly: pip install 'tpukit[profile]'") from exc

    def kind(step: dict) -> str:
        if step["compiles"]:
            return "compiled a graph"
        if step["fallbacks"]:
            return "CPU fallback"
        return "warm-up" if step.get("warmup") else "steady"

    colours = {"compiled a graph": "#d62728", "CPU fallback": "#ff7f0e", "warm-up": "#9e9e9e",
               "steady": "#1f77b4"}
    figure = go.Figure()
    for name, colour in colours.items():
        chosen = [s for s in steps if kind(s) == name]
        if not chosen:
            continue
        figure.add_bar(
            name=name, marker_color=colour, x=[s["step"] for s in chosen],
            y=[s["wall_s"] * 1000 for s in chosen],
            customdata=[[s["compiles"], s["compile_s"] * 1000, ", ".join(s["fallbacks"]) or "-",
                         s["host_transfers"]] for s in chosen],
            hovertemplate=("step %{x}: %{y:.1f} ms<br>compiles: %{customdata[0]} "
                           "(%{customdata[1]:.0f} ms)<br>fallbacks: %{customdata[2]}<br>"
                           "host transfers: %{customdata[3]}<extra></extra>"))
    compile_steps = [s for s in steps if s["compiles"]]
    if compile_steps:
        figure.add_scatter(name="compile time", mode="markers", marker_symbol="x",
                           marker_color="#000000", x=[s["step"] for s in compile_steps],
                           y=[s["compile_s"] * 1000 for s in compile_steps],
                           hovertemplate="step %{x}: compiled for %{y:.0f} ms<extra></extra>")
    figure.update_layout(title="Step time", xaxis_title="step", yaxis_title="wall time (ms)",
                         barmode="overlay", template="plotly_white", height=420)
    return figure


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _location(f: dict) -> str:
    return html.escape(f"{f['path']}:{f['line']}")


def render_html(report) -> str:
    data = as_dict(report)
    summary = data["summary"]
    chart = step_chart(summary.get("step_records", [])).to_html(
        include_plotlyjs=True, full_html=False)
    findings = [f for f in data["findings"] if f["code"] not in ADVICE]
    advice = [f for f in data["findings"] if f["code"] in ADVICE]
    facts = [
        ("script", summary["script"]), ("device", summary["device"]),
        ("outcome", f"{summary['outcome']} (exit {summary['exit_code']})"),
        ("steps", str(summary["steps"])),
        ("median steady step", f"{summary['step_time_median_s'] * 1000:.1f} ms"
         if summary.get("step_time_median_s") is not None else "n/a"),
        ("compilations", f"{summary['compiles']} ({summary['compile_s']:.2f} s), "
                         f"{summary['recompiles_after_warmup']} after warm-up"),
        ("CPU fallbacks", str(summary["fallbacks"])), ("host reads", str(summary["host_syncs"])),
        ("wall time", f"{summary['wall_s']:.2f} s"),
    ]
    parts = [
        f"<h1>tpukit run: {html.escape(summary['script'])}</h1>",
        _table(["", ""], [[html.escape(k), html.escape(v)] for k, v in facts]),
        chart,
        "<h2>Findings</h2>",
        _table(["code", "where", "message"],
               [[html.escape(f["code"]), _location(f), html.escape(f["message"])]
                for f in findings]) if findings else "<p>No recompiles, fallbacks or host reads "
                                                     "after warm-up.</p>",
        "<h2>Advice</h2>",
    ]
    for f in advice:
        parts.append(f"<h3>{html.escape(f['code'])} {html.escape(f['name'])} at "
                     f"{_location(f)}</h3><p>{html.escape(f['message'])}</p>")
        if f["extra"].get("snippet"):
            parts.append(f"<pre>{html.escape(f['extra']['snippet'])}</pre>")
    if not advice:
        parts.append("<p>No head-dim or shape-bucket advice for this run.</p>")
    profile = summary.get("profile")
    if profile:
        parts.append("<h2>Profile</h2>")
        if profile.get("top_ops"):
            parts.append(f"<p>Top ops by self time ({html.escape(profile['ops_source'])} table), "
                         f"trace in <code>{html.escape(str(profile.get('run_dir')))}</code>.</p>")
            parts.append(_table(["op", "occurrences", "self ms", "self %"], [
                [html.escape(op["name"]), str(op["occurrences"]), f"{op['self_us'] / 1000:.2f}",
                 f"{op['self_share']:.1%}"] for op in profile["top_ops"]]))
        if profile.get("error"):
            parts.append(f"<p>{html.escape(profile['error'])}</p>")
        parts.extend(f"<pre>{html.escape(c)}</pre>" for c in profile.get("open_with", []))
    parts.append("<details><summary>JSON report</summary><pre>"
                 f"{html.escape(json.dumps(data, indent=2))}</pre></details>")
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ddd;"
             "padding:4px 8px;text-align:left;vertical-align:top}pre{background:#f6f8fa;"
             "padding:8px;overflow-x:auto}")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>tpukit run: "
            f"{html.escape(summary['script'])}</title><style>{style}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")


def write_html(path: Path, report) -> None:
    atomic_write(path, render_html(report))
