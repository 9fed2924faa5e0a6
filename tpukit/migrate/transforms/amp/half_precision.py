"""TPU202 half-precision: `.half()` and float16 casts become bfloat16 in a training script.

Its messages and tables: rules/TPU202-half-precision.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.nodes import walk
from tpukit.migrate.transforms.amp.common import FP16
from tpukit.migrate.transforms.base import Transform, transform

# What writes its first argument to a file: a float16 cast there is the file's format.
SAVES = frozenset({"torch.save", "torch_xla.core.xla_model.save", "safetensors.torch.save_file"})


@transform("TPU202")
class HalfPrecision(Transform):
    """`.half()` and float16 casts of models and inputs: bfloat16 on TPU. Applied in a training
    script (it calls `.backward()`), as fp16 AMP becomes bf16 autocast there; elsewhere (a
    library, an export script) a finding, applied with --unsafe-fixes: a float16 there may be
    the format of a file it writes.

    In any file, a cast whose value is written (the object given to `torch.save`, or a dict
    made for it: `sd = {k: v.half().cpu() ...}; torch.save(sd, path)`) is the format of the
    file and stays: XLA casts to float16 as CUDA does, and what reads the file expects it."""

    uses = frozenset({"values"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self._written: set[int] = set()  # id() of every node inside what a save writes
        self._saved_symbols = None

    def _saved(self) -> set:
        """The variables given to a save as the object it writes, and the dicts merged into
        one of those (`state.update(lora_state)`)."""
        if self._saved_symbols is None:
            values = self.ctx.values
            saved = {values.symbol(call.args[0].value) for call, _ in values.calls
                     if call.args and isinstance(call.args[0].value, cst.Name)
                     and values.qualified(call.func) in SAVES} - {None}
            merges = [(values.symbol(call.func.value), values.symbol(call.args[0].value))
                      for call, _ in values.calls
                      if isinstance(call.func, cst.Attribute) and call.func.attr.value == "update"
                      and len(call.args) == 1 and isinstance(call.args[0].value, cst.Name)]
            grown = True
            while grown:
                before = len(saved)
                saved |= {merged for into, merged in merges if into in saved and merged}
                grown = len(saved) > before
            self._saved_symbols = saved
        return self._saved_symbols

    def visit_Call(self, node: cst.Call):
        if node.args and self.ctx.qualify(node.func) in SAVES:
            self._written.update(map(id, walk(node.args[0].value)))
        return None

    def visit_Assign(self, node: cst.Assign):
        # `state = {k: v.half().cpu() for ...}` then `torch.save(state, path)`: a dict made
        # to be written; `state[key] = w.cpu().half()`: an entry of one
        if len(node.targets) != 1:
            return None
        target = node.targets[0].target
        if isinstance(target, cst.Name) and isinstance(node.value, (cst.Dict, cst.DictComp)):
            written = self.ctx.values.symbol(target) in self._saved()
        elif isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name):
            written = self.ctx.values.symbol(target.value) in self._saved()
        else:
            written = False
        if written:
            self._written.update(map(id, walk(node.value)))
        return None

    def visit_AugAssign(self, node: cst.AugAssign):
        # `state[key] += (b @ a).cpu().half()`
        target = node.target
        if isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name) \
                and self.ctx.values.symbol(target.value) in self._saved():
            self._written.update(map(id, walk(node.value)))
        return None

    def fix_or_report(self, node, message, build, fix=None):
        if self.ctx.package_module or ".backward(" not in self.ctx.source:
            if not (self.ctx.unsafe_fixes and not self.ctx.cuda_only):
                message += self.say("not_training")
            return super().fix_or_report(node, message, build, fix=FixKind.UNSAFE)
        return super().fix_or_report(node, message + self.say("training"), build)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if id(original) in self._written:
            return None  # written to a file: its format
        func = original.func
        if isinstance(func, cst.Attribute) and func.attr.value == "half" and not original.args:
            if self.ctx.qualify(func.value):
                return None
            return self.fix_or_report(
                original, self.say("half", code=self.ctx.short(original)),
                lambda: updated.with_changes(func=updated.func.with_changes(attr=cst.Name("bfloat16"))),
            )
        if isinstance(func, cst.Attribute) and func.attr.value in ("to", "type"):
            for i, (old, new) in enumerate(zip(original.args, updated.args)):
                if self.ctx.qualify(old.value) in FP16 and (old.keyword is None or old.keyword.value == "dtype"):
                    replacement = self.fix_or_report(
                        old.value, self.say("cast", code=self.ctx.short(original)),
                        lambda: cst.parse_expression(f"{self.ctx.torch_name()}.bfloat16"),
                    )
                    if replacement is None:
                        return None
                    args = list(updated.args)
                    args[i] = new.with_changes(value=replacement)
                    return updated.with_changes(args=args)
        return None
