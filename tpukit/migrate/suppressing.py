"""Suppression comments in migrate (`# tpukit: ignore[TPU101]`, tpukit/suppress.py): a
suppressed finding is neither reported nor fixed.

Only a file with a suppression comment pays anything: its node positions are computed once,
and each hook of a rule that some comment names runs as a trial. A trial whose reports land
on a suppressed line is undone (its replacement dropped, the imports, side-effect imports,
helpers and guards it asked for forgotten) and its reports are kept aside as suppressed; the
node stays as written. The traversal goes on into the node's children, where the same rule
is tried again (a suppressed `.step()` statement does not hide the rest of its line from
other rules, which the comment does not name).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from tpukit.migrate.context import MigrationContext, Report
from tpukit.suppress import Suppressions


class SuppressedHooks:
    def __init__(self, ctx: MigrationContext, module: cst.Module, suppressions: Suppressions,
                 codes: set[str]) -> None:
        self.ctx = ctx
        self.suppressions = suppressions
        # The rules some comment names: only their hooks run as trials.
        self.codes = {c for c in codes if any(s.names(c) for s in suppressions.items)}
        self.positions: dict[cst.CSTNode, CodeRange] = dict(
            MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider))
        self.suppressed: list[Report] = []

    def wrap(self, hooks: dict[str, list], leave: bool) -> dict[str, list]:
        """The same hook table, the hooks of the named rules run as trials."""
        wrapped = {}
        for node_type, table in hooks.items():
            wrapped[node_type] = [self._trial(h, leave) if h.__self__.rule.code in self.codes
                                  else h for h in table]
        return wrapped

    def _trial(self, hook, leave: bool):
        if leave:
            trial = lambda original, updated: self._run(hook, original, (original, updated))  # noqa: E731
        else:
            trial = lambda node: self._run(hook, node, (node,))  # noqa: E731
        trial.hook = hook  # the rule's own hook (rewriter.rule_of)
        return trial

    def _covered(self, report: Report, at: cst.CSTNode) -> bool:
        span = self.positions.get(report.node) or self.positions.get(at)
        if span is None:
            return False
        self.positions.setdefault(report.node, span)  # where the suppressed finding is shown
        code = report.rule.code
        return any(s.names(code) and (s.whole_file or span.start.line <= s.line <= span.end.line)
                   for s in self.suppressions.items)

    def _run(self, hook, node: cst.CSTNode, args: tuple):
        ctx = self.ctx
        point = ctx.sink.checkpoint()
        result = hook(*args)
        new = ctx.reports[point[0]:]
        covered = [self._covered(r, node) for r in new]
        if not any(covered):
            return result
        ctx.sink.rollback(point, keep_handled=True)  # spoken for: no other rule's finding
        for report, suppressed in zip(new, covered):
            if suppressed:  # its fix is undone with the trial: not applied
                report.applied = False
                self.suppressed.append(report)
            else:  # reported with a suppressed one by the same hook: its fix is not applied
                report.applied = False
                ctx.reports.append(report)
        return None
