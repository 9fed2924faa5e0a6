"""TPU406 distributed-sampler: `DistributedSampler` takes its replicas and rank from torch_xla.

Its messages and tables: rules/TPU406-distributed-sampler.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.launch import group_calls
from tpukit.migrate.context import find_keyword, keyword_arg, plain_positional, with_commas
from tpukit.migrate.transforms.base import Transform, transform


SAMPLER_NAMES = {"torch.utils.data.distributed.DistributedSampler",
                 "torch.utils.data.DistributedSampler"}


@transform("TPU406")
class SamplerReplicas(Transform):
    uses = frozenset({"launch", "values"})
    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) not in SAMPLER_NAMES or not original.args:
            return None
        plain = plain_positional(original)
        replicas = find_keyword(original, "num_replicas") or (plain[1] if len(plain) > 1 else None)
        rank = find_keyword(original, "rank") or (plain[2] if len(plain) > 2 else None)
        if (replicas is not None and rank is not None and self.ctx.code(replicas.value) == "xr.world_size()"
                and self.ctx.code(rank.value) == "xr.global_ordinal()"):
            return None
        message = self.say("sampler", code=self.ctx.short(original))
        if any(a.star for a in updated.args):
            self.ctx.report(self.rule, original, message + self.say("sampler_splat"),
                            applied=False, fix=FixKind.NONE)
            return None
        positional = plain_positional(updated)
        if not positional and find_keyword(updated, "dataset") is None:
            return None
        # Which of the two to set: a value the call passes is kept unless it is CUDA's (a GPU
        # count) or, in a script that starts its processes, a plain name (`rank`, the spawn
        # index); a group's own numbers (deepspeed's `self.dp_world_size`,
        # `mpu.get_data_parallel_rank()`) are the data-parallel group's, not the world's. A
        # value left out asks the default process group, which a ported script makes with the
        # xla backend (timm's loader): set it only where the file starts processes and makes
        # no group (xmp.spawn with no torch.distributed, where the default would raise).
        launches = bool(self.ctx.launch_calls())
        no_group = not group_calls(self.ctx)
        replace = {}
        for index, arg in ((1, replicas), (2, rank)):
            if arg is None or (isinstance(arg.value, cst.Name) and arg.value.value == "None"):
                replace[index] = launches and no_group  # None is the default
            else:
                replace[index] = self.ctx.values.derives_from(arg.value, K.GPU_COUNT) or (
                    launches and isinstance(arg.value, cst.Name))
        if not any(replace.values()):
            return None

        def build():
            # DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last): the
            # values replaced where they stand, the ones left out added after the positional
            # arguments; the rest is kept.
            new = {1: "xr.world_size()", 2: "xr.global_ordinal()"}
            index = {"num_replicas": 1, "rank": 2}
            args = [a.with_changes(value=self.ctx.expr(new[i])) if replace.get(i) else a
                    for i, a in enumerate(positional)]
            given = {i for i in new if i < len(positional)} | {
                index[a.keyword.value] for a in updated.args
                if a.keyword is not None and a.keyword.value in index}
            args += [keyword_arg(key, self.ctx.expr(new[i])) for key, i in index.items()
                     if replace[i] and i not in given]
            args += [a.with_changes(value=self.ctx.expr(new[index[a.keyword.value]]))
                     if a.keyword.value in index and replace[index[a.keyword.value]] else a
                     for a in updated.args if a.keyword is not None]
            if not positional:  # dataset=... first, as written
                args.sort(key=lambda a: a.keyword.value != "dataset")
            return updated.with_changes(args=with_commas(args))

        return self.fix_or_report(original, message, build)
