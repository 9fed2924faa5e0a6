"""An optimizer built before its model moved to the XLA device trains nothing.

On CUDA, `model.to(device)` keeps each Parameter object and swaps its storage, so an optimizer
created earlier still holds the model's parameters. torch_xla cannot swap storage across
devices: `.to(xla)` gives the module new Parameter objects, and the optimizer keeps updating
the old CPU ones while the XLA model never changes, silently. The tutorial pattern
`model = Net(); opt = SGD(model.parameters()); Trainer(model, opt)` (the trainer moves the
model) hits exactly this. The fix moves the model where it is built, before the optimizer.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import dotted, is_cuda_device_string
from tpukit.migrate.nodes import children
from tpukit.migrate.transforms.base import Transform, transform
from tpukit.migrate.analysis.steps import uses_prepare


WRAPPERS = ("DistributedDataParallel", "DataParallel", "DDP", "FullyShardedDataParallel", "compile",
            "deepcopy", "_inputs_to_device")  # the last: TPU402's helper around a DDP


_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def _runs(stmt: cst.CSTNode):
    """The nodes of `stmt` that run when it runs: not the bodies of functions, classes and
    lambdas it defines (their names are bound, their code runs later)."""
    stack = [stmt]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _SCOPES):
            stack.append(node.name) if not isinstance(node, cst.Lambda) else None
            continue
        stack.extend(reversed(children(node)))


def _bound(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """The targets `node` binds (assignments, loop and `with` targets, walrus, definitions)."""
    if isinstance(node, cst.Assign):
        return [t.target for t in node.targets]
    if isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.NamedExpr)):
        return [node.target]
    if isinstance(node, (cst.For, cst.CompFor)):
        return [node.target]
    if isinstance(node, cst.AsName):
        return [node.name]
    if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        return [node.name]
    return []


def _targets(expr: cst.BaseExpression) -> set[str]:
    """The variables a target writes: a name, an attribute chain (`args.lr`), each element
    of a tuple or list target; a subscript writes into its base."""
    if isinstance(expr, (cst.Tuple, cst.List)):
        return {n for e in expr.elements for n in _targets(e.value)}
    if isinstance(expr, cst.StarredElement):
        return _targets(expr.value)
    if isinstance(expr, cst.Subscript):
        return _targets(expr.value)
    name = dotted(expr)
    return {name} if name else set()


def _reads(expr: cst.CSTNode) -> set[str]:
    """Every name and attribute chain `expr` reads (`args.lr` gives `args` and `args.lr`)."""
    found = set()
    for node in _runs(expr):
        name = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
        if name:
            found.add(name)
    return found


def _assigned_name(stmt: cst.CSTNode) -> tuple[str, cst.Assign] | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        assign = stmt.body[0]
        if (isinstance(assign, cst.Assign) and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name)):
            return assign.targets[0].target.value, assign
    return None


@transform("TPU106")
class OptimizerBeforeDevice(Transform):

    uses = frozenset({"device_facts", "steps", "values"})

    def _optimizer_model(self, stmt: cst.CSTNode) -> tuple[str, cst.Call] | None:
        """`opt = torch.optim.X(model.parameters(), ...)` -> ("model", the call)."""
        found = _assigned_name(stmt)
        if found is None or not isinstance(found[1].value, cst.Call):
            return None
        call = found[1].value
        # (by the file's scopes: planned when a block is entered, before the traversal has
        # seen the imports that follow a module's first line)
        name = self.ctx.values.qualified(call.func) or self.ctx.qualify(call.func) or ""
        if not name.startswith("torch.optim.") or not call.args:
            return None
        first = call.args[0].value
        if (isinstance(first, cst.Call) and isinstance(first.func, cst.Attribute)
                and first.func.attr.value == "parameters" and isinstance(first.func.value, cst.Name)):
            return first.func.value.value, call
        return None

    def _moves(self, stmt: cst.CSTNode, model: str) -> bool:
        """`model.to(...)`/`model.cuda()`, or `model = ....to(...)` / `....cuda()`."""
        code = self.ctx.code(stmt)
        if f"{model}.to(" in code or f"{model}.cuda(" in code:
            return True
        assigned = _assigned_name(stmt)
        return (assigned is not None and assigned[0] == model
                and any(m in self.ctx.code(assigned[1].value) for m in (".to(", ".cuda(")))

    def _wraps_moved(self, value: cst.Call, before) -> bool:
        """`DDP(model)`, `torch.compile(model)`, `copy.deepcopy(model)`: a wrapper of a module
        that was moved before (or is moved by its own rule): not a model built here."""
        if (self.ctx.qualify(value.func) or dotted(value.func) or "").endswith(WRAPPERS):
            return True
        inner = value.args[0].value if value.args else None
        return isinstance(inner, cst.Name) and any(self._moves(s, inner.value) for s in before)

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        # line that builds a model -> (the optimizer call built before it moves, model name).
        # Planned on the original block before its statements are visited, applied to the
        # rewritten line: other rules may add lines before it, so positions would not do.
        self.plans: dict[cst.CSTNode, tuple[cst.Call, str]] = {}
        # (the optimizer's line, the later line that moves its model, the optimizer call,
        # the model's name): the optimizer line moves after the move, in the block's leave
        self.later: list[tuple[cst.CSTNode, cst.CSTNode, cst.Call, str]] = []

    def _plan(self, body) -> None:
        if uses_prepare(self.ctx):
            # accelerate's `prepare` moves the model and points the optimizer at the moved
            # parameters itself on XLA; a model it is not given is a CPU reference (its
            # test scripts' baselines), which must stay where its inputs are
            return
        for j, stmt in enumerate(body):
            found = self._optimizer_model(stmt)
            if found is None:
                continue
            model, call = found
            for i in range(j - 1, -1, -1):
                assigned = _assigned_name(body[i])
                if self._moves(body[i], model):
                    break  # moved (or built on the device) before the optimizer: fine
                if assigned is None or assigned[0] != model:
                    continue
                value = assigned[1].value
                if isinstance(value, cst.Call) and not self._wraps_moved(value, body[:i]):
                    self.plans[body[i]] = (call, model)
                break
            else:
                # not built in this block as one assignment (built in the branches of an
                # `if`, or given as a parameter): the optimizer follows the model's move
                self._plan_later(body, j, model, call)

    def _device_move(self, node: cst.CSTNode, model: str) -> bool:
        """`model.cuda(...)`, or `model.to(d)` with `d` a device by dataflow (not a dtype)."""
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and isinstance(node.func.value, cst.Name) and node.func.value.value == model):
            return False
        method = node.func.attr.value
        if method == "cuda":
            return True
        if method != "to" or not node.args:
            return False
        target = node.args[0].value
        return (is_cuda_device_string(target) or K.DEVICE in self.ctx.values.kinds(target)
                or self.ctx.values.qualified(getattr(target, "func", None)) == "torch.device")

    def _plan_later(self, body, j: int, model: str, call: cst.Call) -> None:
        """The first later statement of this block that moves `model` to a device, where
        building the optimizer after it computes the same: nothing between reads the
        optimizer's variable or writes what its call reads (the model only by the move)."""
        optimizer = _assigned_name(body[j])[0]
        reads = _reads(call) - {model}
        for k in range(j + 1, len(body)):
            nodes = list(_runs(body[k]))
            moves = any(self._device_move(n, model) for n in nodes)
            written = {t for n in nodes for b in _bound(n) for t in _targets(b)}
            if optimizer in _reads(body[k]) or any(
                    w == r or r.startswith(w + ".") for w in written for r in reads):
                return
            if moves:
                self.later.append((body[j], body[k], call, model))
                self.ctx.left_as[body[j]] = self.ctx.left_as[body[k]] = None
                return
            if model in written:
                return  # rebound before it moves: another object
    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._plan(node.body)

    def visit_Module(self, node: cst.Module) -> None:
        self._plan(node.body)

    def leave_SimpleStatementLine(self, original, updated):
        return self._move(original, updated)

    def _apply_in(self, original_body, updated_body) -> list | None:
        """Lines the engine skipped (nothing in them to rewrite) get no leave hook of their
        own: they are the same objects in the rewritten block, found there by identity."""
        new_body, changed = list(updated_body), False
        for stmt in original_body:
            if stmt in self.plans:
                at = next((k for k, s in enumerate(new_body) if s is stmt), None)
                moved = self._move(stmt, stmt) if at is not None else None
                if moved is not None:
                    new_body[at], changed = moved, True
        return new_body if changed else None

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock):
        applied = self._apply_in(original.body, updated.body)
        body = self._reorder(original.body, applied if applied is not None else updated.body)
        body = body if body is not None else applied
        return None if body is None else updated.with_changes(body=body)

    def leave_Module(self, original: cst.Module, updated: cst.Module):
        applied = self._apply_in(original.body, updated.body)
        body = self._reorder(original.body, applied if applied is not None else updated.body)
        body = body if body is not None else applied
        return None if body is None else updated.with_changes(body=body)

    def _reorder(self, original_body, body) -> list | None:
        """The optimizer lines planned to follow their model's move, moved there (found in
        the rewritten block by what the traversal made of them, ctx.left_as)."""
        plans = [p for p in self.later if any(p[0] is s for s in original_body)]
        changed, body = False, list(body)
        for plan in plans:
            self.later.remove(plan)
            opt_line, move_line, call, model = plan
            built, moved = (_nodes(self.ctx.left_as.pop(n, None)) for n in (opt_line, move_line))
            current = body

            def build(built=built, moved=moved):
                start = next(k for k, s in enumerate(current) if s is built[0])
                rest = [s for s in current if not any(s is b for b in built)]
                # the blank lines and comments above stay where they were: the statement
                # that now comes first there takes the optimizer's, and gives its own
                follower = rest[start]
                built = [built[0].with_changes(leading_lines=follower.leading_lines), *built[1:]]
                rest[start] = follower.with_changes(leading_lines=current[start].leading_lines)
                at = start if moved[-1] is follower else next(
                    k for k, s in enumerate(rest) if s is moved[-1])
                return rest[:at + 1] + built + rest[at + 1:]

            if not built or not moved or not _all_in(built + moved, current):
                continue
            if any(opt_line is s for s in self.ctx.module.body):
                self.ctx.sink.current_top = opt_line  # (found at the optimizer's own line)
            new = self.fix_or_report(call, self.say("optimizer_later", call=self.ctx.short(call),
                                                    model=model), build)
            if new is not None:
                body, changed = new, True
        return body if changed else None

    def _move(self, original, updated):
        planned = self.plans.pop(original, None)
        if planned is None:
            return None
        call, model = planned

        def build():
            assign = updated.body[0]
            return updated.with_changes(body=[assign.with_changes(value=cst.Call(
                func=cst.Attribute(value=assign.value, attr=cst.Name("to")),
                args=[cst.Arg(self.ctx.device_expr())]))])

        return self.fix_or_report(
            call, self.say("optimizer", call=self.ctx.short(call), model=model), build)


def _nodes(result) -> list:
    """The statements a traversal result stands for in its block (none when removed)."""
    if result is None or isinstance(result, cst.RemovalSentinel):
        return []
    return list(result.nodes) if isinstance(result, cst.FlattenSentinel) else [result]


def _all_in(nodes: list, body: list) -> bool:
    return all(any(n is s for s in body) for n in nodes)
