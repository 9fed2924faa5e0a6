"""SARIF 2.1.0, for GitHub code scanning and other SARIF viewers."""

from __future__ import annotations

import json
from typing import TextIO

from tpukit import __version__
from tpukit.findings import Severity
from tpukit.rules import load_rules

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _region(loc) -> dict:
    region = {"startLine": loc.line, "startColumn": loc.col}
    if loc.end_line is not None:
        region["endLine"] = loc.end_line
    if loc.end_col is not None:
        region["endColumn"] = loc.end_col
    return region


def as_sarif(report) -> dict:
    rules = load_rules()
    used = sorted({f.code for f in report.findings})
    index = {code: i for i, code in enumerate(used)}
    driver_rules = []
    for code in used:
        rule = rules.get(code)
        entry = {"id": code}
        if rule is not None:
            entry.update(
                name=rule.name,
                shortDescription={"text": rule.summary},
                fullDescription={"text": rule.why},
                help={"text": f"{rule.why}\n\nRun `tpukit rules {code}` for examples; read {rule.reference}."},
                helpUri=rule.reference,
                defaultConfiguration={"level": LEVEL[rule.severity]},
                properties={"fix": rule.fix.value},
            )
        driver_rules.append(entry)
    results = []
    for finding in report.findings:
        results.append(
            {
                "ruleId": finding.code,
                "ruleIndex": index[finding.code],
                "level": LEVEL[finding.severity],
                "message": {"text": finding.message},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": finding.location.path},
                            "region": _region(finding.location),
                        }
                    }
                ]
                if finding.location.path
                else [],  # an environment check: no file to point at
                "properties": {"fix": finding.fix.value, "applied": finding.applied},
            }
        )
    notifications = [
        {
            "level": "error",
            "message": {"text": error.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": error.path},
                        "region": {"startLine": error.line, "startColumn": error.col},
                    }
                }
            ],
        }
        for error in report.errors
    ]
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "tpukit",
                        "version": __version__,
                        "rules": driver_rules,
                    }
                },
                "invocations": [
                    {
                        "executionSuccessful": not report.errors,
                        "toolExecutionNotifications": notifications,
                    }
                ],
                "results": results,
            }
        ],
    }


def render(report, out: TextIO, err: TextIO) -> None:
    json.dump(as_sarif(report), out, indent=2)
    out.write("\n")
