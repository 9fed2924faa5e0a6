"""TPU509 lowered-fallback: an op torch_xla runs on the CPU, given the form of it that lowers.

Its messages and tables: rules/TPU509-lowered-fallback.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.transforms.base import Transform, transform


@transform("TPU509")
class LoweredFallback(Transform):
    """A call whose op has no XLA kernel but a composite form that lowers (`[targets.T.lowered]`:
    the calls, by qualified name, and the helper that registers the composite for the XLA
    device and returns the call's value): the call is wrapped in the helper."""

    table_keys = frozenset({"lowered"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.calls = {name: entry for entry in self.mapping.get("lowered", {}).values()
                      for name in entry["calls"]}
        self.helpers = {entry["helper"] for entry in self.calls.values()}
        self.wrapped: set[int] = set()  # id() of the calls a helper is already given

    def visit_Call(self, node: cst.Call):
        # `_xla_weight_norm(torch.nn.utils.weight_norm(m))`: a port, migrated again
        if isinstance(node.func, cst.Name) and node.func.value in self.helpers and node.args:
            self.wrapped.add(id(node.args[0].value))
        return None

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        entry = self.calls.get(self.ctx.qualify(original.func) or "")
        if entry is None or id(original) in self.wrapped:
            return None
        helper = entry["helper"]

        def build():
            self.ctx.helpers_needed.add(helper)
            self.ctx.need_import("torch")
            return cst.Call(cst.Name(helper), [cst.Arg(updated)])

        return self.fix_or_report(original, self.say(
            "lowered", code=self.ctx.short(original), op=entry["op"], helper=helper), build)
