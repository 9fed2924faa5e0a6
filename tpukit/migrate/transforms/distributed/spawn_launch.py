"""TPU404 spawn-launch: `mp.spawn(fn, args, nprocs=n)` becomes `torch_xla.launch(fn, args)`.

Its messages and tables: rules/TPU404-spawn-launch.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.launch import SPAWN_NAMES, spawned_functions
from tpukit.migrate.context import find_keyword
from tpukit.migrate.nodes import is_docstring, walk
from tpukit.migrate.transforms.base import StatementPlan, Transform, transform


def _world_parameter(ctx, function: cst.FunctionDef, call: cst.Call) -> str | None:
    """The parameter of a spawned function that gets the number of processes: the element of
    `args=(...)` that is what `nprocs` is (or a world size or GPU count), at its place after
    the process index."""
    positional = [a for a in call.args if a.keyword is None]
    given = find_keyword(call, "args") or (positional[1] if len(positional) > 1 else None)
    nprocs = find_keyword(call, "nprocs") or (positional[2] if len(positional) > 2 else None)
    if given is None or not isinstance(given.value, (cst.Tuple, cst.List)):
        return None
    values = ctx.values
    count = values.symbol(nprocs.value) if nprocs is not None else None
    params = [p.name.value for p in function.params.params]
    for i, element in enumerate(given.value.elements):
        value = element.value
        same = nprocs is not None and (values.symbol(value) == count if count is not None
                                       else ctx.code(value) == ctx.code(nprocs.value))
        if same or values.kinds(value) & {K.WORLD, K.GPU_COUNT}:
            return params[i + 1] if i + 1 < len(params) else None
    return None


@transform("TPU404")
class SpawnLaunch(Transform):
    uses = frozenset({"launch", "values"})
    table_keys = frozenset({"before", "world_size"})
    def statement_triggers(self, source: str) -> set[str]:
        # the spawned function's own statement
        spawned = spawned_functions(self.ctx)
        return super().statement_triggers(source) | {
            node.name.value for node in (walk(self.ctx.module) if spawned else ())
            if isinstance(node, cst.FunctionDef) and id(node) in spawned}

    def _spawn_statement(self, node, call: cst.BaseExpression):
        """TorchTPU: `mp.spawn` stays; the parent sets TorchTPU's launch environment first."""
        if ("before" not in self.mapping or not isinstance(call, cst.Call)
                or self.ctx.qualify(call.func) not in SPAWN_NAMES
                or "set_tpu_launch_env" in self.ctx.source):  # set already (migrated code)
            return None
        positional = [a for a in call.args if a.keyword is None]
        nprocs = find_keyword(call, "nprocs") or (positional[2] if len(positional) > 2 else None)
        if self._library_spawn(call):
            return None
        before = self.mapping["before"].format(
            nprocs=self.ctx.code(nprocs.value) if nprocs is not None else "1")
        return self.fix_or_report(
            call, self.say("spawn", code=self.ctx.short(call)),
            lambda: StatementPlan([self.ctx.statement(before), node]))

    def _library_spawn(self, call: cst.Call) -> bool:
        """Library code starts its own processes, as many as it asks for (fairscale's
        `spawn_for_all_world_sizes`: `world_size` CPU processes over gloo on a TPU host, where
        `torch_xla.launch` starts one per TPU device and the group waited for the rest)."""
        return self.library_leaves(call, "spawn",
                                   lambda: self.say("library", code=self.ctx.short(call)))

    def visit_Expr(self, node: cst.Expr):
        return self._spawn_statement(node, node.value)

    def visit_Assign(self, node: cst.Assign):
        return self._spawn_statement(node, node.value)

    def visit_Call(self, node: cst.Call):
        if "before" in self.mapping:
            return None  # the statement holding the call is planned above
        if self.ctx.qualify(node.func) not in SPAWN_NAMES or not node.args:
            return None
        positional = [a for a in node.args if a.keyword is None]
        fn = positional[0] if positional else find_keyword(node, "fn")
        if fn is None:
            return None
        args = find_keyword(node, "args") or (positional[1] if len(positional) > 1 else None)
        start = find_keyword(node, "start_method")
        if self._library_spawn(node):
            return None

        def build():
            parts = [self.ctx.code(fn.value)]
            if args is not None:
                parts.append(f"args={self.ctx.code(args.value)}")
            if start is not None:
                parts.append(f"start_method={self.ctx.code(start.value)}")
            return self.ctx.expr(f"torch_xla.launch({', '.join(parts)})")

        return self.fix_or_report(node, self.say("launch", code=self.ctx.short(node)), build)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        """In the spawned function, a world-size parameter is the launcher's guess (it cannot ask
        the runtime): take the real one from torch_xla."""
        call = spawned_functions(self.ctx).get(id(original))
        if (call is None or not self.ctx.can_fix(self.rule)
                or "world_size" not in self.mapping
                or self.ctx.owner_leaves("TPU404", "world_size")):
            return None
        world = _world_parameter(self.ctx, original, call)
        if world is None or not isinstance(updated.body, cst.IndentedBlock):
            return None
        line = self.ctx.statement(f"{world} = {self.mapping['world_size']}")
        statement = cst.SimpleStatementLine(
            [line], trailing_whitespace=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "),
                comment=cst.Comment("# tpukit: from the runtime; the launcher cannot ask it")))
        body = list(updated.body.body)
        first = 1 if body and is_docstring(body[0]) else 0
        body.insert(first, statement)
        return updated.with_changes(body=updated.body.with_changes(body=body))
