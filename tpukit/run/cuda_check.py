"""`python -m tpukit.run.cuda_check SCRIPT`: the CUDA idioms the migrate rules still find in a
script, as JSON findings on stdout. `tpukit run` starts it in a subprocess next to torch_xla's
import (seconds of its own), so the check costs the run no wall time on a machine with a
spare core. Never imports torch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tpukit.findings import Finding
from tpukit.migrate.ownership import Owner


def cuda_idioms(script: Path) -> list[Finding]:
    """What the migrate rules would still change in the script (check mode)."""
    from tpukit.migrate.engine import MigrateOptions, migrate_source
    from tpukit.rules import load_rules, select_rules

    try:
        source = script.read_text(encoding="utf-8")
        migration = migrate_source(source, str(script), MigrateOptions(
            select_rules(None, None), render_source=False, owner=Owner.PROGRAM))
    except Exception:  # not parseable: python will say so when it runs it
        return []
    rules = load_rules()
    # (what runs on a TPU host as written, a seed or a cuDNN flag, an `except` of torch's
    # out-of-memory error, fails nowhere: not counted)
    return [f for f in migration.findings
            if (f.applied or f.code.startswith(("TPU1", "TPU2", "TPU9")))
            and not _runs_as_written(rules, f)]


def _runs_as_written(rules, found: Finding) -> bool:
    """The rule says so of all its findings (`runs_as_written` in its file), or the finding
    of itself."""
    rule = rules.get(found.code)
    return bool(found.extra.get("runs_as_written")) or (
        rule is not None and bool(rule.extra.get("runs_as_written")))


def main() -> None:
    findings = cuda_idioms(Path(sys.argv[1]))
    json.dump([{"code": f.code, "line": f.location.line, "col": f.location.col,
                "end_line": f.location.end_line, "end_col": f.location.end_col,
                "message": f.message} for f in findings], sys.stdout)


if __name__ == "__main__":
    main()
