"""TPU416 shared-memory-model: `model.share_memory()` (Hogwild) has no XLA form.

Its messages and tables: rules/TPU416-shared-memory-model.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.transforms.base import Transform, transform


@transform("TPU416")
class SharedMemoryModel(Transform):
    """`model.share_memory()` (Hogwild training: processes that update one model in shared
    host memory): a device tensor has no shared-memory form ("_share_fd_: only available on
    CPU" on XLA). A finding, with the two ways out."""

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        func = original.func
        if (isinstance(func, cst.Attribute) and func.attr.value == "share_memory"
                and not original.args and not self.ctx.qualify(func.value)):
            self.ctx.report(self.rule, original,
                            self.say("share_memory", code=self.ctx.short(original)), applied=False)
        return None
