"""TPU118 torch-seed: `torch.manual_seed(s)` also seeds the XLA device
(`torch_xla.manual_seed(s)`).

Its messages and tables: rules/TPU118-torch-seed.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate.nodes import walk
from tpukit.migrate.transforms.base import Transform, transform


_FORKS_RNG = ("torch.random.fork_rng",)


# The calls that seed the device's generator already: a file that makes one needs no other.
_SEEDS_DEVICE = frozenset({"torch.cuda.manual_seed", "torch.cuda.manual_seed_all",
                           "torch_xla.manual_seed", "torch_xla.core.xla_model.set_rng_state",
                           "torch.cuda.set_rng_state", "torch.cuda.set_rng_state_all",
                           "torch.set_rng_state"})


@transform("TPU118")
class SeedXla(Transform):
    """`torch.manual_seed(s)` as a statement: `torch_xla.manual_seed(s)` after it, since the XLA
    device's generator is not torch's (unless the file seeds the XLA device already)."""
    uses = frozenset({"values"})

    def __init__(self, *args) -> None:
        super().__init__(*args)
        # id() of the statements inside a `with torch.random.fork_rng(...)` (a set, not a
        # stack: a `with` another rule plans gets no leave hooks)
        self.in_fork: set[int] = set()

    def visit_With(self, node: cst.With) -> None:
        if any(isinstance(item.item, cst.Call) and self.ctx.qualify(item.item.func) in _FORKS_RNG
               for item in node.items):
            self.in_fork.update(id(n) for n in walk(node.body)
                                if isinstance(n, cst.SimpleStatementLine))

    def leave_SimpleStatementLine(self, original, updated):
        if len(original.body) != 1 or not isinstance(original.body[0], cst.Expr):
            return None
        call = original.body[0].value
        if not (isinstance(call, cst.Call) and call.args
                and self.ctx.qualify(call.func) == "torch.manual_seed"):
            return None
        if self.ctx.memo("seeds_xla", lambda: self.ctx.values.calls_any(_SEEDS_DEVICE)):
            return None
        if id(original) in self.in_fork:
            # peft's incremental PCA: fork_rng restores torch's generators when the block
            # ends, not the XLA device's: a seed added there would stay for the whole run
            self.ctx.report(self.rule, original, self.say("in_fork", code=self.ctx.short(call)),
                            False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        workers = self.ctx.values.worker_init_functions()
        if any(id(f) in workers for f in self.ctx.functions):
            return None  # a DataLoader worker's init: the XLA runtime must not start there
        if self.ctx.in_launcher():
            # SimSiam's main(): seeds, then `mp.spawn` (torch_xla.launch), which refuses to
            # start once the runtime is initialised ("Runtime is already initialized")
            self.ctx.report(self.rule, original, self.say("launcher", code=self.ctx.short(call)),
                            False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        if self.ctx.owner_leaves("TPU118", "seed"):
            # transformers' serving seeds each request, on whatever device its model is: a
            # CPU server on a TPU host started the XLA runtime (and claimed the TPU) there
            self.ctx.report(self.rule, original, self.say("library", code=self.ctx.short(call)),
                            False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        seed = updated.body[0].value.args[0].value

        def build():
            line = cst.SimpleStatementLine([cst.Expr(cst.Call(
                func=self.ctx.expr("torch_xla.manual_seed"), args=[cst.Arg(seed)]))])
            return cst.FlattenSentinel([updated, line])

        return self.fix_or_report(original, self.say("seed", code=self.ctx.short(call)), build)
