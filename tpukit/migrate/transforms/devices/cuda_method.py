"""TPU102 cuda-method: `.cuda()` becomes `.to(device)` with the XLA device.

Its messages and tables: rules/TPU102-cuda-method.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.context import dotted
from tpukit.migrate.nodes import walk
from tpukit.migrate.transforms.base import Transform, transform


# Tensor.cuda(device=None, non_blocking=False, memory_format=...) and Module.cuda(device=None)
_CUDA_METHOD_KEYWORDS = frozenset({"device", "non_blocking", "memory_format"})


def _torch_cuda_signature(call: cst.Call) -> bool:
    """Whether `x.cuda(...)`'s arguments fit torch's `.cuda` (Tensor's or Module's): at most
    device and non_blocking by position, no other keyword, no device given twice; a splat
    could hold anything torch takes."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    return (len(positional) <= 2 and keywords <= _CUDA_METHOD_KEYWORDS
            and not (positional and "device" in keywords)
            and not (len(positional) == 2 and "non_blocking" in keywords))


def _isinstance_classes(ctx, name: str) -> list[str]:
    """The classes `isinstance(NAME, C)` tests in the enclosing function (or module) test
    `name` against, as written (`HQQLinear`, `bnb.nn.Linear4bit`): from its code, not its
    comments."""
    scope = ctx.functions[-1] if ctx.functions else ctx.module

    def compute() -> list[tuple[str, str]]:
        found = []
        for node in walk(scope):
            if isinstance(node, cst.Call) and dotted(node.func) == "isinstance" \
                    and len(node.args) == 2:
                tested = dotted(node.args[0].value)
                types = node.args[1].value
                elements = [e.value for e in types.elements] if isinstance(
                    types, (cst.Tuple, cst.List)) else [types]
                found += [(tested, dotted(e)) for e in elements if dotted(e)]
        return found

    return [cls for tested, cls in ctx.memo(("isinstance_tests", id(scope)), compute)
            if tested == name]


@transform("TPU102")
class CudaMethod(Transform):

    uses = frozenset({"device_facts"})
    def leave_Call(self, original: cst.Call, updated: cst.Call):
        func = original.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "cuda":
            return None
        receiver = self.ctx.qualify(func.value)
        if receiver is not None and receiver.split(".")[0] in ("torch", "torch_xla"):
            return None  # a module attribute, not Tensor/Module.cuda()
        own = self._own_cuda(func.value)
        if own is None and not _torch_cuda_signature(original):
            # transformers' quantized cache: `self.quantizer.cuda(qtensor, meta=meta,
            # device=...)` is HQQ's own method; as `.to(device, meta=meta)` it lost qtensor
            message = self.say("method", code=self.ctx.short(original))
            self.ctx.report(self.rule, original, message + self.say("other_signature"),
                            applied=False, fix=FixKind.NONE)
            return None
        if own is not None:
            message = self.say("method", code=self.ctx.short(original))
            self.ctx.report(self.rule, original, message + self.say(
                "own_method", receiver=self.ctx.code(func.value), cls=own[0], module=own[1]),
                applied=False, fix=FixKind.NONE)
            return None

        def build():
            kept = [
                a
                for a in updated.args
                if a.keyword is not None and a.keyword.value not in ("device",)
            ]
            device = cst.Arg(self.ctx.device_expr())
            args = [device, *kept]
            args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
            return updated.with_changes(
                func=updated.func.with_changes(attr=cst.Name("to")), args=args
            )

        return self.fix_or_report(original, self.say("method", code=self.ctx.short(original)),
                                  build)

    def _own_cuda(self, receiver: cst.BaseExpression) -> tuple[str, str] | None:
        """(class, its module) when the enclosing function tests the receiver with
        `isinstance(receiver, C)` and C comes from a package other than torch: that class's
        `.cuda` may be its own method, not torch's (hqq's `HQQLinear.cuda(device)` moves to any
        device, CPU included, and transformers' `to()` calls it so), and `.to(xla)` would not
        do what it does. A class of this file or a relative import is taken for a Module."""
        name = dotted(receiver)
        if name is None:
            return None
        for cls in _isinstance_classes(self.ctx, name):
            root, _, rest = cls.partition(".")
            full = self.ctx.aliases.get(root)  # `HQQLinear` -> hqq.core.quantize.HQQLinear
            if full is not None and full.split(".")[0] not in ("torch", "torchvision"):
                # the module it comes from: hqq.core.quantize; `bnb.nn.X` -> bitsandbytes
                return cls, full if rest else full.rpartition(".")[0] or full
        return None
