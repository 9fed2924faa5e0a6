"""TPU302 ragged-last-batch: A DataLoader without `drop_last=True` recompiles on its last, smaller
batch.

Its messages and tables: rules/TPU302-ragged-last-batch.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis.steps import DATALOADERS
from tpukit.migrate.context import find_keyword
from tpukit.migrate.transforms.base import Transform, transform


@transform("TPU302")
class RaggedLastBatch(Transform):
    """A DataLoader without drop_last=True ends each epoch with a smaller batch: a new shape,
    so a new XLA compilation (and another at every epoch's end on eval)."""
    uses = frozenset({"steps"})

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) not in DATALOADERS:
            return None
        drop = find_keyword(original, "drop_last")
        if drop is not None:
            return None

        def build():
            args = list(updated.args)
            if args:
                args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return updated.with_changes(args=[*args, cst.Arg(
                cst.Name("True"), keyword=cst.Name("drop_last"),
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                      whitespace_after=cst.SimpleWhitespace("")))])

        return self.fix_or_report(original, self.say("ragged"), build)
