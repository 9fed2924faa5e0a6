"""Any `torch.cuda.*` name no other rule spoke for: it will fail or do nothing on TPU."""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.transforms.base import Transform, transform


@transform("TPU117")
class UnmappedCudaApi(Transform):
    def visit_Attribute(self, node: cst.Attribute):
        ctx = self.ctx
        if ctx.in_import:
            return None
        inner = []
        value = node.value
        while isinstance(value, cst.Attribute):
            inner.append(value)
            value = value.value
        if id(node) not in ctx.handled:
            name = ctx.qualify(node)
            if not (name and name.startswith("torch.cuda.")):
                return None
            ctx.report(
                self.rule,
                node,
                f"`{name}` has no automatic TPU mapping: {self.rule.message}",
                applied=False,
            )
        ctx.handled.update(id(n) for n in inner)
        return None
