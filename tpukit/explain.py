"""`tpukit rules [CODE]`: the rule table, or one rule's page (what, why, mapping, examples)."""

from __future__ import annotations

import json
from typing import TextIO

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from tpukit.rules import TARGETS, Rule, manual_message


def rule_dict(rule: Rule) -> dict:
    return {
        "code": rule.code,
        "name": rule.name,
        "severity": rule.severity.value,
        "fix": rule.fix.value,
        "summary": rule.summary,
        "why": rule.why,
        "reference": rule.reference,
        "targets": rule.targets,
        "examples": [{"before": e.before, **e.expected} for e in rule.examples],
    }


def rules_json(rules: list[Rule], out: TextIO) -> None:
    json.dump([rule_dict(r) for r in rules], out, indent=2)
    out.write("\n")


def rules_table(rules: list[Rule], con: Console) -> None:
    table = Table(title="tpukit rules", show_lines=False)
    for column in ("code", "name", "severity", "fix", "summary"):
        table.add_column(column, overflow="fold")
    for rule in rules:
        table.add_row(rule.code, rule.name, rule.severity.value, rule.fix.value, rule.summary)
    con.print(table)
    con.print("Explain one: tpukit rules CODE")


def _manual_text(value: str | dict) -> str:
    """An entry's `instead`: a string (its fix) as written, a table as "cause. Fix: fix"."""
    message = manual_message(value)
    return f"{message.cause}. Fix: {message.fix}" if message.cause and message.fix \
        else message.cause or message.fix


def _mapping_lines(rule: Rule, target: str) -> list[str]:
    mapping = rule.target(target)
    if not rule.maps(target):
        return ["(finding only: no automatic rewrite)"]
    if rule.skips(target):
        return [f"nothing to do on this target: {mapping.get('note', '')}".rstrip(": ")]
    lines = []
    for key, value in mapping.items():
        if key == "messages":
            continue  # the wording of its findings, not a mapping
        if key == "calls":
            for name, entry in value.items():
                if "replace" in entry:
                    action = f"-> {entry['replace']}"
                elif "statements" in entry:
                    action = "-> " + "; ".join(entry["statements"])
                elif "remove" in entry:
                    action = f"removed ({entry['remove']})"
                else:
                    action = f"finding: {_manual_text(entry.get('instead', ''))}"
                lines.append(f"{name}(...) {action}")
        else:
            lines.append(f"{key}: {value}")
    return lines


def explain(rule: Rule, con: Console) -> None:
    header = Text()
    header.append(f"{rule.code} {rule.name}", style="bold")
    header.append(f"  severity={rule.severity.value} fix={rule.fix.value}")
    why = "\n\n".join(" ".join(p.split()) for p in rule.why.split("\n\n"))  # reflow lines
    parts: list = [header, Text(rule.summary, style="italic"), Text(""), Text(why), Text(""),
                   Text(f"Read: {rule.reference}")]
    if not rule.checks_code:
        by = {"doctor": "tpukit doctor", "shell": "tpukit migrate (its scan of shell scripts)",
              "suppress": "tpukit migrate --strict and tpukit doctor --strict"}.get(
                  rule.extra.get("engine"), "tpukit run")
        parts += [Text(""), Text(f"Reported by `{by}`. Fix: {rule.message}")]
        fixes = rule.extra.get("fixes", {})
        if fixes:
            table = Table(show_header=True, box=None)
            table.add_column("what", style="bold", no_wrap=True)
            table.add_column("fix", overflow="fold")
            for what, fix in fixes.items():
                table.add_row(what, fix)
            parts += [Text(""), Text("Fixes tpukit suggests", style="bold"), table]
    else:
        mapping = Table(show_header=True, box=None)
        for target in TARGETS:
            mapping.add_column(target, overflow="fold")
        lines = {t: _mapping_lines(rule, t) for t in TARGETS}
        for i in range(max(len(v) for v in lines.values())):
            mapping.add_row(*(lines[t][i] if i < len(lines[t]) else "" for t in TARGETS))
        parts += [Text(""), Text("Mapping per target", style="bold"), mapping]
    for n, example in enumerate(rule.examples, 1):
        parts += [Text(""), Text(f"Example {n}: before", style="bold")]
        parts.append(Syntax(example.before.strip("\n"), "python", theme="ansi_dark"))
        for target, after in example.expected.items():
            parts.append(Text(f"after ({target})", style="bold"))
            parts.append(Syntax(after.strip("\n"), "python", theme="ansi_dark"))
        if example.codes is not None:
            parts.append(Text(f"reports: {', '.join(example.codes) or 'nothing'}"))
    con.print(Panel(Group(*parts), expand=False))
