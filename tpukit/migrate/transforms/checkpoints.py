"""Checkpoints: state dicts are saved with xm.save (to CPU, on the master only); loads map
CUDA storage to the CPU."""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import is_cuda_device_string, keyword_arg
from tpukit.migrate.nodes import first, name_uses, walk
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


DATA_HELPER = "_tensors_to"  # helpers.py: moves what torch.load gave, container by container


@transform("TPU305")
class LoadMapLocation(Transform):
    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) != "torch.load":
            return None
        for i, arg in enumerate(original.args):
            keyword = arg.keyword.value if arg.keyword else None
            if keyword != "map_location" and not (keyword is None and i == 1):
                continue
            value = arg.value
            if isinstance(value, cst.IfExp) and is_cuda_device_string(value.body):
                value_is_cuda = True  # "cuda" if use_cuda else "cpu": the CPU is right for both
            else:
                value_is_cuda = False
            cuda = value_is_cuda or is_cuda_device_string(value) or isinstance(value, (cst.Dict, cst.Lambda)) or (
                isinstance(value, cst.Call) and self.ctx.qualify(value.func) == "torch.device"
                and value.args and is_cuda_device_string(value.args[0].value))
            held = not cuda and self._holds_device(value)
            if not (cuda or held):
                return None

            data = self._loaded_as_data(original)

            def build(i=i):
                args = list(updated.args)
                args[i] = args[i].with_changes(value=cst.SimpleString('"cpu"'))
                call = updated.with_changes(args=args)
                if not data:
                    return call
                self.ctx.helpers_needed.add(DATA_HELPER)
                self.ctx.need_import("torch")
                return cst.Call(cst.Name(DATA_HELPER), [
                    cst.Arg(call, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    cst.Arg(self.ctx.device_expr())])

            where = self.say("held_device") if held else self.say("cuda_device")
            message = self.say("data", code=self.ctx.short(value), where=where) if data else \
                self.say("map_location", code=self.ctx.short(value), where=where)
            return self.fix_or_report(value, message, build)
        return None

    def _loaded_as_data(self, call: cst.Call) -> bool:
        """Is what torch.load gives used as data on the device rather than as a checkpoint?
        `data = torch.load(path, map_location="cuda")` read only as `data["images"]`, in a scope
        that loads no state dict (airbench's CifarLoader: the dataset's tensors, used on the
        GPU as loaded). A checkpoint goes to `load_state_dict`, which copies CPU tensors onto
        the device; data has no such step, so the port moves it after loading. A result read
        whole (returned, handed to a function) may be either: it stays on the CPU."""
        targets = self.ctx.values.assigned_to(call)
        if len(targets) != 1 or not isinstance(targets[0], cst.Name):
            return False
        target = targets[0]
        scope = self.ctx.functions[-1] if self.ctx.functions else self.ctx.module
        if first(scope, lambda n: isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                 and n.func.attr.value == "load_state_dict"):
            return False
        reads = 0
        for node, parent, _ in name_uses(target.value, scope):
            if node is target or (isinstance(parent, cst.Attribute) and parent.attr is node):
                continue
            if not (isinstance(parent, cst.Subscript) and parent.value is node):
                return False
            reads += 1
        return reads > 0

    def _holds_device(self, value: cst.BaseExpression) -> bool:
        """A variable holding the device (`device`, `loc = "cuda:{}".format(gpu)`, a parameter
        its callers give one). After the port it holds the TPU, which torch.load cannot map
        storage to."""
        return isinstance(value, (cst.Name, cst.Attribute)) and \
            K.DEVICE in self.ctx.values.kinds(value)
