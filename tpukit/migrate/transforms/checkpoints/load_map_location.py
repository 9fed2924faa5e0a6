"""TPU305 load-map-location: `torch.load(..., map_location="cuda")` loads to the CPU.

Its messages and tables: rules/TPU305-load-map-location.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import is_cuda_device_string
from tpukit.migrate.nodes import first, name_uses
from tpukit.migrate.transforms.base import Transform, transform


DATA_HELPER = "_tensors_to"  # helpers.py: moves what torch.load gave, container by container


@transform("TPU305")
class LoadMapLocation(Transform):
    uses = frozenset({"device_facts", "values"})
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
            why = self.say("why_held_device") if held else ""  # a CUDA device: no cause
            message = self.say("data", code=self.ctx.short(value), where=where, why=why) if data \
                else self.say("map_location", code=self.ctx.short(value), where=where, why=why)
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
