"""TPU304 checkpoint-save: `torch.save` of state dicts becomes `xm.save`.

Its messages and tables: rules/TPU304-checkpoint-save.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import keyword_arg
from tpukit.migrate.nodes import walk
from tpukit.migrate.transforms.base import Transform, transform


# Python's and NumPy's RNG states: tuples.
_HOST_RNG = frozenset({"random.getstate", "numpy.random.get_state"})


def _has_state_dict(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        return expr.func.attr.value == "state_dict"
    if isinstance(expr, cst.Dict):
        return any(isinstance(e, cst.DictElement) and _has_state_dict(e.value) for e in expr.elements)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "dict":
        return any(_has_state_dict(a.value) for a in expr.args)
    return False


def _is_container(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, (cst.Dict, cst.List, cst.Tuple)):
        return True
    return (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name)
            and expr.func.value in ("dict", "list", "tuple"))


@transform("TPU304")
class CheckpointSave(Transform):
    uses = frozenset({"values"})
    def leave_Call(self, node: cst.Call, updated: cst.Call):
        # A leave hook, so what the arguments hold is rewritten first (a GradScaler's state
        # leaves the checkpoint dict before the dict is saved).
        if self.ctx.qualify(node.func) != "torch.save" or not node.args:
            return None
        obj = node.args[0].value
        extra = [a for a in node.args[2:]] + [a for a in node.args[:2] if a.keyword and a.keyword.value not in ("obj", "f")]
        # A state dict, or a container (`{"images": t, "labels": u}`, `[a, b]`, a variable
        # holding one): xm.save moves the XLA tensors of nested dicts, lists and tuples to the
        # CPU, the rest as is.
        state = _has_state_dict(obj) or _is_container(obj) or self.ctx.values.holds_state(obj)
        if not state:
            self.ctx.report(self.rule, node, self.say("object", code=self.ctx.short(node)),
                            applied=False, fix=None)
            return None
        if extra:
            return None  # pickle options xm.save does not take: leave it to a person
        if self._saves_host_rng():
            # accelerate's save_accelerator_state: xm.save turns tuples into lists on the way
            # to the CPU, and random.setstate() / np.random.set_state() refuse the list when
            # the file is loaded back (accelerate then silently restores no RNG at all)
            self.ctx.report(self.rule, node, self.say("rng_tuples", code=self.ctx.short(node)),
                            applied=False, fix=FixKind.NONE)
            return None
        if self.ctx.owner_leaves("TPU304", "save"):
            # library code saves as it decides who writes (peft's save_pretrained takes
            # is_main_process; transformers' Trainer has its own XLA branch): xm.save would
            # start the runtime for a model on the CPU (timm's repghost_model_convert, peft,
            # jukebox's alignments) and write on the master only; torch.save writes XLA
            # tensors too
            self.ctx.report(self.rule, node, self.say("library", code=self.ctx.short(node)),
                            applied=False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        if self._per_rank(node):
            # xm.save writes on the master only: the other ranks' files would never be written.
            return self.fix_or_report(node, self.say("per_rank", code=self.ctx.short(node)),
                                      lambda: self._save_everywhere(node, updated))
        return self.fix_or_report(
            node, self.say("save", code=self.ctx.short(node)),
            lambda: self.ctx.with_func(node, updated, self.ctx.expr("xm.save")))

    def _saves_host_rng(self) -> bool:
        """Does the enclosing function (or the module) read Python's or NumPy's RNG state (a
        tuple) for what it saves?"""
        scope = self.ctx.functions[-1] if self.ctx.functions else self.ctx.module
        values = self.ctx.values
        return self.ctx.memo(("host_rng", id(scope)), lambda: any(
            isinstance(n, cst.Call) and values.qualified(n.func) in _HOST_RNG for n in walk(scope)))

    def _per_rank(self, node: cst.Call) -> bool:
        path = node.args[1].value if len(node.args) > 1 else None
        return path is not None and self.ctx.values.derives_from(path, K.RANK)

    def _save_everywhere(self, node: cst.Call, updated: cst.Call) -> cst.Call:
        call = self.ctx.with_func(node, updated, self.ctx.expr("xm.save"))
        args = list(call.args)
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return call.with_changes(args=[*args, keyword_arg("master_only", cst.Name("False"))])
