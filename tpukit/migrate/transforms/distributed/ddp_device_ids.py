"""TPU402 ddp-device-ids: `DistributedDataParallel(model, device_ids=[rank])` loses its CUDA device
ids.

Its messages and tables: rules/TPU402-ddp-device-ids.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.analysis.ddp_inputs import ForwardInputs
from tpukit.migrate.analysis.launch import DDP_NAMES
from tpukit.migrate.context import find_keyword, keyword_arg, plain_positional, with_commas
from tpukit.migrate.transforms.base import Transform, transform


INPUTS_HELPER = "_inputs_to_device"  # helpers.py: moves a DDP model's forward inputs


@transform("TPU402")
class DistributedDataParallelArgs(Transform):
    uses = frozenset({"ddp_inputs", "launch"})
    table_keys = frozenset({"bucket_view"})
    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) not in DDP_NAMES or not original.args:
            return None
        # DDP(module, device_ids, output_device, dim, ...): the second and third positional
        plain = plain_positional(updated)
        second = plain[1] if len(plain) > 1 else None
        dropped = [a for a in updated.args[1:] if any(a is p for p in plain[1:3])
                   or (a.keyword and a.keyword.value in ("device_ids", "output_device"))]
        if len(plain) > 3:  # `dim` and later ones cannot stay positional without those two
            self.ctx.report(self.rule, original, self.say(
                "ddp_positional", code=self.ctx.short(original)), applied=False, fix=FixKind.NONE)
            return None
        # A splat may hold device_ids, or gradient_as_bucket_view itself: kept as it is.
        splat = next((a for a in updated.args if a.star), None)
        bucket_view = self.mapping.get("bucket_view", False) and splat is None
        bucket = find_keyword(original, "gradient_as_bucket_view")
        if splat is not None and not dropped:
            self.ctx.report(self.rule, original, self.say(
                "ddp_splat", code=self.ctx.short(original),
                splat=self.ctx.code(splat).rstrip(", ")),
                applied=False, fix=FixKind.NONE)
            return None
        if not dropped and (bucket is not None or not bucket_view):
            return None
        # DDP copied the forward's inputs to device_ids[0]; without device_ids nothing does.
        moves = (any(a is second or (a.keyword and a.keyword.value == "device_ids")
                     for a in dropped)
                 and not self._inputs_on_device(original))

        if moves and splat is not None:
            # The splat must stay an argument of the DDP call itself (engine's splat check):
            # the inputs' move is left for a person, said at the line.
            moves = False
            self.ctx.report(self.rule, original, self.say(
                "inputs_splat", code=self.ctx.short(original), helper=INPUTS_HELPER),
                applied=False, fix=FixKind.NONE)

        def build():
            args = [a for a in updated.args if a not in dropped]
            if bucket is None and bucket_view:
                args.append(keyword_arg("gradient_as_bucket_view", self.ctx.expr("True")))
            call = updated.with_changes(args=with_commas(args))
            if not moves:
                return call
            self.ctx.helpers_needed.add(INPUTS_HELPER)
            self.ctx.need_import("torch")
            return cst.Call(cst.Name(INPUTS_HELPER), [cst.Arg(call)])

        message = self.say("ddp", code=self.ctx.short(original))
        if moves:
            message += self.say("inputs", helper=INPUTS_HELPER)
        return self.fix_or_report(original, message, build)

    def visit_Assign(self, node: cst.Assign):
        if isinstance(node.value, cst.Call) and self.ctx.qualify(node.value.func) in DDP_NAMES:
            self.targets[id(node.value)] = [self.ctx.code(t.target) for t in node.targets]
        return None

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.targets: dict[int, list[str]] = {}  # id(DDP call) -> what it is assigned to

    def _inputs_on_device(self, call: cst.Call) -> bool:
        """Does every call of the model this DDP is assigned to pass inputs on the device?"""
        targets = self.targets.get(id(call))
        if not targets:
            return False  # `return DDP(...)`, `train(DDP(...))`: used where we cannot follow
        inputs = self.ctx.memo("forward_inputs", lambda: ForwardInputs(self.ctx.module))
        return all(inputs.on_device(t) for t in targets)
