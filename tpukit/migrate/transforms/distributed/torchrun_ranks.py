"""TPU405 torchrun-ranks: torchrun's rank variables and rank-numbered devices become torch_xla's.

Its messages and tables: rules/TPU405-torchrun-ranks.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.launch import chosen_at_run_time, env_key, scope_facts
from tpukit.migrate.context import dotted
from tpukit.migrate.transforms.base import Transform, transform


DEVICE_INDEX_KEYWORDS = ("device", "device_id", "output_device")


@transform("TPU405")
class TorchrunRanks(Transform):
    uses = frozenset({"device_facts", "launch", "values"})
    table_keys = frozenset({"env"})

    def statement_triggers(self, source: str) -> set[str]:
        """`.to(NAME` and `device(NAME` for the variables that hold a rank in this file."""
        return super().statement_triggers(source) | {
            f"{prefix}{name}" for name in self.ctx.values.names_of({K.RANK})
            for prefix in (".to(", "device(", ".to(self.")}

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.device_values: set[int] = set()  # id() of values given as a device

    def visit_Call(self, node: cst.Call):
        # FSDP(device_id=int(os.environ["LOCAL_RANK"])): a rank given as a device index
        self.device_values.update(id(a.value) for a in node.args if a.keyword is not None
                                  and a.keyword.value in DEVICE_INDEX_KEYWORDS)
        # int(os.environ["LOCAL_RANK"]) -> xr.local_ordinal()
        if dotted(node.func) == "int" and len(node.args) == 1:
            key, has_default = env_key(self.ctx, node.args[0].value)
            if key in self.mapping.get("env", {}) and not has_default:
                # The function meets through its own `store=` (TPU401 leaves that group as it
                # is), or reads another launcher's numbers (mpirun's OMPI_*, SLURM's, PMI's:
                # deepspeed's mpi_discovery; xr.world_size() is 1 outside torch_xla's launch):
                # its RANK / WORLD_SIZE are that launcher's, not torch_xla's.
                facts = scope_facts(self.ctx)
                if facts.own_store or facts.other_launcher or (
                        facts.calls_group and chosen_at_run_time(self.ctx)):
                    return None  # ... or they go to a group TPU401 leaves (its backend chosen)
                if id(node) in self.device_values:
                    return self._rank_device(node, node, is_to=False)
                if self.ctx.owner_leaves("TPU405", "rank"):
                    # lightning's TorchElasticEnvironment: torchrun sets these for CPU, GPU
                    # and XLA runs alike; as `xr.world_size()` a CPU DDP run on a TPU host
                    # started the XLA runtime in every process and read world size 1, rank 0
                    self.ctx.report(self.rule, node, self.say(
                        "rank_library", code=self.ctx.short(node), key=key),
                        applied=False, fix=FixKind.NONE, severity=Severity.INFO)
                    return None
                return self._replace(node, key)
            return None
        # .to(rank) / torch.device(rank): a rank used as a CUDA device index
        name = self.ctx.qualify(node.func)
        is_to = isinstance(node.func, cst.Attribute) and node.func.attr.value == "to"
        if (is_to or name == "torch.device") and len(node.args) == 1 and node.args[0].keyword is None:
            value = node.args[0].value
            if isinstance(value, (cst.Name, cst.Attribute)) and K.RANK in self.ctx.values.kinds(value):
                return self._rank_device(node, value, is_to)
        return None

    def _replace(self, node: cst.Call, key: str):
        new = self.mapping["env"][key]
        return self.fix_or_report(node, self.say("rank", code=self.ctx.short(node), new=new),
                                  lambda: self.ctx.expr(new))

    def _rank_device(self, node: cst.Call, value, is_to: bool):
        def build():
            if not is_to:  # a device built here: never the variable it may be assigned to
                return self.ctx.expr(self.ctx.device_object)
            device = self.ctx.device_expr()
            return node.with_changes(args=[node.args[0].with_changes(value=device)])

        return self.fix_or_report(
            node, self.say("device", code=self.ctx.short(node), rank=self.ctx.code(value)), build)
