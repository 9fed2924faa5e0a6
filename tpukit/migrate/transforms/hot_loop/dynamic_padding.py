"""TPU503 dynamic-padding: Batches padded to their own longest sequence, or a sequence grown by
`torch.cat` per step, recompile per length (a sampler's is ported on XLA).

Its messages and tables: rules/TPU503-dynamic-padding.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.context import dotted
from tpukit.migrate.nodes import walk
from tpukit.migrate.transforms.base import Transform, transform
import tpukit.migrate.transforms.hot_loop.samplers as samplers


@transform("TPU503")
class DynamicPadding(Transform):
    """Batches padded to their own longest sequence get a new shape, so a new compilation,
    almost every step."""
    uses = frozenset({"values"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.loops = 0
        self.ported: dict[int, samplers.Sampler] = {}  # id(For) -> the sampler it ports
        self.lines: dict[int, tuple[str, samplers.Sampler]] = {}  # id(line) -> its part in it
        self.bounded: set[int] = set()  # id(Assign) of cats cropped right after (bounded_cats)

    def _samplers(self) -> dict[int, samplers.Sampler]:
        """The file's growing samplers (samplers.py), by id() of their loop: ported on XLA."""
        if self.ctx.target != "xla" or not self.ctx.memo(
                "calls_cat", lambda: self.ctx.values.calls_any(samplers.CATS)):
            return {}  # (a sampler grows its sequence with a `cat`)
        return self.ctx.memo("samplers", lambda: {
            id(node): found for node in walk(self.ctx.module) if isinstance(node, cst.For)
            and (found := samplers.growing_sampler(node, self.ctx.values.qualified))})

    def statement_triggers(self, source: str) -> set[str]:
        # the crop's line names no trigger word of its own: the sequence it crops does
        return super().statement_triggers(source) | {s.grown for s in self._samplers().values()}

    def _statement(self, code: str) -> cst.SimpleStatementLine:
        return cst.SimpleStatementLine([self.ctx.statement(code)])

    def visit_For(self, node):
        self.loops += 1
        self.bounded |= samplers.bounded_cats(node, self.ctx.qualify)
        sampler = self._samplers().get(id(node))
        if sampler is not None:
            self.ported[id(node)] = sampler
            if self.rule.maps(self.ctx.target) and self.ctx.can_fix(self.rule, FixKind.SAFE):
                self.lines[id(sampler.crop)] = ("crop", sampler)
                self.lines[id(sampler.cat)] = ("cat", sampler)

    def leave_SimpleStatementLine(self, original, updated):
        role, sampler = self.lines.pop(id(original), (None, None))
        if role == "cat":
            return samplers.cat_lines(original, sampler, self._statement)
        return None

    def _crop(self, original, updated):
        role, sampler = self.lines.pop(id(original), (None, None))
        return samplers.crop(updated, sampler) if role == "crop" else None

    def leave_IfExp(self, original, updated):
        return self._crop(original, updated)

    def leave_Subscript(self, original, updated):
        return self._crop(original, updated)

    def leave_For(self, original, updated):
        self.loops -= 1
        sampler = self.ported.pop(id(original), None)
        if sampler is None:
            return None
        message = self.say("sampler", code=self.ctx.short(sampler.cat), name=sampler.grown,
                           bound=self.ctx.short(sampler.bound))
        return self.fix_or_report(sampler.cat, message, lambda: samplers.around(
            updated, sampler, self._statement, self.ctx.qualify), fix=FixKind.SAFE)

    def visit_While(self, node):
        self.loops += 1
        self.bounded |= samplers.bounded_cats(node, self.ctx.qualify)

    def leave_While(self, original, updated):
        self.loops -= 1
        return None

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        # idx = torch.cat((idx, idx_next), dim=1) in a loop: a longer tensor every iteration
        value = original.value
        if not (self.loops and isinstance(value, cst.Call)
                and self.ctx.qualify(value.func) in ("torch.cat", "torch.concat", "torch.concatenate")
                and value.args and isinstance(value.args[0].value, (cst.Tuple, cst.List))):
            return None
        grown = {t.target.value for t in original.targets if isinstance(t.target, cst.Name)}
        parts = value.args[0].value.elements
        if any(original is s.cat.body[0] for s in self.ported.values()) \
                or id(original) in self.bounded:
            return None  # the sampler's port (leave_For) says it; a window that stops growing
        if grown and parts and isinstance(parts[0].value, cst.Name) and parts[0].value.value in grown:
            name = parts[0].value.value
            self.ctx.report(self.rule, original,
                            self.say("grows", code=self.ctx.short(original), name=name),
                            applied=False, fix=FixKind.NONE)
        return None

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        name = self.ctx.qualify(original.func) or dotted(original.func) or ""
        padding = name.endswith("pad_sequence") or name.endswith("DataCollatorWithPadding")
        # a DataLoader's collate_fn (given as one, whatever it is called) pads each batch
        collates = self.ctx.values.functions_given_as("collate_fn")
        if padding and (name.endswith("DataCollatorWithPadding")
                        or any(id(f) in collates for f in self.ctx.functions)):
            self.ctx.report(self.rule, original, self.say("padding", code=self.ctx.short(original)),
                            applied=False, fix=FixKind.NONE)
        return None
