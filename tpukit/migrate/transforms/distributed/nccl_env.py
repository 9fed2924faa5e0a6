"""TPU413 nccl-env: NCCL_* environment variables do nothing on TPU.

Its messages and tables: rules/TPU413-nccl-env.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis.launch import env_key
from tpukit.migrate.context import string_value
from tpukit.migrate.transforms.base import Transform, transform


@transform("TPU413")
class NcclEnv(Transform):
    uses = frozenset({"launch"})
    def visit_Assign(self, node: cst.Assign):
        if len(node.targets) != 1:
            return None
        key, _ = env_key(self.ctx, node.targets[0].target)
        return self._report(node, key)

    def visit_Call(self, node: cst.Call):
        if self.ctx.qualify(node.func) == "os.environ.setdefault" and node.args:
            return self._report(node, string_value(node.args[0].value))
        return None

    def _report(self, node, key: str | None):
        if key and key.startswith("NCCL_"):
            self.ctx.report(self.rule, node, self.say("nccl", key=key), applied=False)
        return None
