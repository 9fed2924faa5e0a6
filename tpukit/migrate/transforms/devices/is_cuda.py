"""TPU103 is-cuda: `tensor.is_cuda` becomes `tensor.is_xla`.

Its messages and tables: rules/TPU103-is-cuda.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate.context import is_cuda_device_string, string_value
from tpukit.migrate.nodes import scan
from tpukit.migrate.transforms.base import Transform, transform


class _IsCudaChecks(cst.CSTVisitor):
    """The `.is_cuda` attributes in an expression."""

    def __init__(self) -> None:
        self.found: list[cst.Attribute] = []

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "is_cuda":
            self.found.append(node)


def _names_a_device(expr: cst.BaseExpression) -> bool:
    return is_cuda_device_string(expr) or string_value(expr) in ("cpu", "meta", "xla", "mps")


@transform("TPU103")
class IsCuda(Transform):
    uses = frozenset({"values"})
    table_keys = frozenset({"attribute", "expression"})
    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.choices: dict[int, tuple[str, str]] = {}  # id(`.is_cuda`) -> the two strings it picks

    def visit_IfExp(self, node: cst.IfExp) -> None:
        # `driver = "gels" if a.is_cuda else "gelsd"` (torch._numpy's lstsq): the check picks a
        # CUDA kernel or driver by name, not a device; on TPU the non-CUDA choice is the one
        # that exists, and the check, False there, already makes it.
        body, orelse = string_value(node.body), string_value(node.orelse)
        if body is None or orelse is None or _names_a_device(node.body) or _names_a_device(node.orelse):
            return
        checks = _IsCudaChecks()
        scan(node.test, checks)
        for attribute in checks.found:
            self.choices[id(attribute)] = (body, orelse)

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        if original.attr.value != "is_cuda" or self.ctx.qualify(original.value):
            return None
        if self.ctx.code(original) in self.ctx.values.attribute_targets:
            return None  # `self.is_cuda = ...`: the object's own flag, not Tensor.is_cuda
        choice = self.choices.pop(id(original), None)
        if choice is not None:
            self.ctx.report(self.rule, original, self.say(
                "choice", code=self.ctx.short(original), a=choice[0], b=choice[1]),
                applied=False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        if self.library_keeps_cuda_check(original, original):
            return None

        def build():
            if "attribute" in self.mapping:  # `.is_xla`
                return updated.with_changes(attr=cst.Name(self.mapping["attribute"]))
            # No `is_<device>` property: `x.device.type == "tpu"` (binds tighter than not/and/or).
            return self.ctx.expr(self.mapping["expression"].format(self.ctx.code(updated.value)))

        replacement = self.fix_or_report(
            original, self.say("check", code=self.ctx.short(original)), build)
        if replacement is not None:
            self.ctx.add_guard(replacement, original)
        return replacement
