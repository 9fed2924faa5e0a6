"""Imports of CUDA-only libraries: an error finding with the TPU alternative."""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.analysis.cuda_only import ported_import
from tpukit.migrate.context import import_target
from tpukit.migrate.transforms.base import Transform, engine


@engine("cuda-only-import")
class CudaOnlyImport(Transform):
    """An import of a CUDA-only library: an error finding with the TPU alternative; where
    what it imports has a torch equivalent on the target (`[targets.T.equivalents]`, every
    call giving it only what the equivalent takes) the import becomes torch's."""

    uses = frozenset({"cuda_only"})
    table_keys = frozenset({"equivalents"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.modules = tuple(rule.extra["modules"])

    def _matches(self, module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in self.modules)

    def _report(self, node: cst.CSTNode, module: str) -> None:
        self.ctx.report(self.rule, node, self.say(
            "import", module=module, message=self.rule.message_for(self.ctx.target)), False)

    def visit_Import(self, node: cst.Import):
        for alias in node.names:
            module = import_target(alias.name)
            if self._matches(module):
                self._report(node, module)
                break

    def visit_ImportFrom(self, node: cst.ImportFrom):
        if node.relative or node.module is None:
            return None
        module = ported_import(self.ctx, node) if self._matches(import_target(node.module)) else None
        if module is not None:
            names = ", ".join(import_target(a.name) for a in node.names)
            return self.fix_or_report(
                node, self.say("equivalent", module=import_target(node.module), names=names,
                               new=module),
                lambda: node.with_changes(module=cst.parse_expression(module)), fix=FixKind.SAFE)
        module = import_target(node.module)
        names = [] if isinstance(node.names, cst.ImportStar) else node.names
        full = [f"{module}.{import_target(a.name)}" for a in names]
        hit = next((m for m in [module, *full] if self._matches(m)), None)
        if hit:
            self._report(node, hit)
