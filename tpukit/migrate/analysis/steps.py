"""Loops and steps, the facts the loop rules share: what a loader is and which `for` iterates
one, what a graph barrier and an optimizer step are, which functions are one training step, and
what a loop body holds (its steps, barriers, hand-written updates, buffers it fills).

Decided by where values come from (values.py), never by a variable's name; computed once per
loop or file (`ctx.memo`) for every rule that asks.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import dotted
from tpukit.migrate.nodes import children, first, scan

DATALOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
BARRIERS = {"torch_xla.sync", "torch_xla.core.xla_model.mark_step", "torch_xla.step",
            "torch_xla.core.xla_model.optimizer_step"}
ITER_WRAPPERS = K.ITER_WRAPPERS
NO_GRAD = {"torch.no_grad", "torch.inference_mode"}
# Tensor methods that read the value on the host: each waits for the device to compute it.
HOST_READS = ("item", "tolist", "cpu", "numpy")


def uses_prepare(ctx) -> bool:
    """Does the file hand objects to accelerate's `Accelerator.prepare` (whose loader places
    batches itself, and wraps MpDeviceLoader on XLA)?"""
    return ctx.memo("uses_prepare", lambda: any(
        K.PREPARED in ctx.values.kinds(call) for call, _ in ctx.values.calls))


def is_device_loader(expr: cst.BaseExpression) -> bool:
    """Already `pl.MpDeviceLoader(...)` (migrated code, or a hand port)."""
    return isinstance(expr, cst.Call) and (dotted(expr.func) or "").endswith("MpDeviceLoader")


def is_loader(ctx, expr: cst.BaseExpression) -> bool:
    """A DataLoader, by where the value comes from or what is done with it (values.py)."""
    return is_device_loader(expr) or K.LOADER in ctx.values.kinds(expr)


def loader_in_iter(ctx, loop: cst.For) -> tuple[cst.BaseExpression, list] | None:
    """The loader a `for` iterates, through enumerate()/tqdm(): (loader, path of calls). An
    iterable of unknown origin (a parameter no call of this file gives) whose items the loop
    body moves to the device is a host loader too: that move is what a loader of host batches
    needs."""
    expr = loop.iter
    path = []
    while isinstance(expr, cst.Call) and dotted(expr.func) in ITER_WRAPPERS and expr.args:
        path.append(expr)
        expr = expr.args[0].value
    if is_loader(ctx, expr):
        return expr, path
    if isinstance(expr, (cst.Name, cst.Attribute)) and not ctx.values.kinds(expr) \
            and not ctx.owner_leaves("TPU301", "given_loop") and _moves_items(ctx, loop):
        # (library code keeps a loop whose iterable it is given as it is: its caller's)
        return expr, path
    return None


def _moves_items(ctx, loop: cst.For) -> bool:
    """Does the loop body move a name its target binds to a device (`x = x.to(device)`,
    `x.cuda()`)?"""
    def names(target) -> set[str]:
        if isinstance(target, cst.Name):
            return {target.value}
        if isinstance(target, (cst.Tuple, cst.List)):
            return {n for e in target.elements for n in names(e.value)}
        return set()

    bound = names(loop.target)

    def moves(node: cst.CSTNode) -> bool:
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("to", "cuda")
                and isinstance(node.func.value, cst.Name) and node.func.value.value in bound):
            return False
        if node.func.attr.value == "cuda":
            return True
        target = node.args[0].value if node.args and node.args[0].keyword is None else None
        # a device, or a CUDA device index (`.to(rank)`)
        return target is not None and bool(ctx.values.kinds(target) & {K.DEVICE, K.RANK})

    return ctx.memo(("moves_items", id(loop)), lambda: bool(first(loop.body, moves)))


def is_barrier(call: cst.Call, qualify) -> bool:
    """A graph barrier: by the name the call resolves to (`qualify`: how names resolve, the
    traversal's `ctx.qualify` or a whole-file scan's `values.qualified`), or one a rule just
    wrote, before its import exists."""
    return qualify(call.func) in BARRIERS \
        or dotted(call.func) in ("torch_xla.sync", "xm.mark_step")


def is_optimizer_step(ctx, call: cst.BaseExpression) -> bool:
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
        return False
    if ctx.qualify(call.func) == "torch_xla.core.xla_model.optimizer_step":
        return True
    if call.func.attr.value != "step":
        return False
    # `scaler.step(optimizer)` is an optimizer step too; a scheduler's is not
    return bool(ctx.values.kinds(call.func.value) & {K.OPTIMIZER, K.SCALER})


class _OwnStep(cst.CSTVisitor):
    """Is a function one training step: an optimizer step (or a `.backward()` and a hand-written
    update that reads `.grad`) outside any loop of its own, and no graph barrier? (A function
    that loops over batches gets its barriers inside.)"""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.steps = False
        self.barrier = False
        self.backward = False  # `.backward()` outside any loop of its own
        self.reads_grad = False  # `p.grad`: a hand-written update (no optimizer object)
        self.loops = 0

    def visit_For(self, node) -> None:
        self.loops += 1

    def leave_For(self, node) -> None:
        self.loops -= 1

    def visit_While(self, node) -> None:
        self.loops += 1

    def leave_While(self, node) -> None:
        self.loops -= 1

    def visit_Call(self, node: cst.Call) -> None:
        if is_optimizer_step(self.ctx, node) and not self.loops:
            self.steps = True
        if is_barrier(node, self.ctx.qualify):
            self.barrier = True
        if (isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward"
                and not self.loops):
            self.backward = True

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "grad":
            self.reads_grad = True


def is_stepping_function(ctx, name: str) -> bool:
    """Does this file define a function or method `name` that is one training step (steps an
    optimizer and leaves the barrier to its caller: `loss = self._run_batch(x, y)` in a
    trainer's epoch loop)? Only the named function is scanned, once per file."""
    def definitions() -> dict[str, list[cst.FunctionDef]]:
        found: dict[str, list[cst.FunctionDef]] = {}
        if (".step(" not in ctx.source and "optimizer_step" not in ctx.source
                and ".backward(" not in ctx.source):
            return found  # nothing steps an optimizer or runs a backward in this file
        for stmt in ctx.module.body:
            defs = [stmt] if isinstance(stmt, cst.FunctionDef) else (
                [s for s in stmt.body.body if isinstance(s, cst.FunctionDef)]
                if isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock)
                else [])
            for function in defs:
                found.setdefault(function.name.value, []).append(function)
        return found

    def compute() -> bool:
        for function in ctx.memo("function_defs", definitions).get(name, ()):
            finder = _OwnStep(ctx)
            scan(function, finder)
            hand_update = finder.backward and finder.reads_grad
            if (finder.steps or hand_update) and not finder.barrier:
                return True
        return False

    return ctx.memo(("stepping", name), compute)


class _StepFinder(cst.CSTVisitor):
    """Statements of one loop body (not nested loops or functions) that step an optimizer or
    call `.backward()`, whether the body already has a graph barrier, and the loops nested in
    it."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.step_lines: list[cst.SimpleStatementLine] = []
        self.has_barrier = False
        self.calls_batch = False
        self.first_host_read: cst.SimpleStatementLine | None = None  # `.item()` and friends
        self.backward: cst.SimpleStatementLine | None = None  # the first `.backward()` line
        self.inner_loops: list[cst.For | cst.While] = []
        self._line: cst.SimpleStatementLine | None = None

    def visit_For(self, node) -> bool:
        self.inner_loops.append(node)
        return False

    def visit_While(self, node) -> bool:
        self.inner_loops.append(node)
        return False

    def visit_FunctionDef(self, node) -> bool:
        return False

    def visit_SimpleStatementLine(self, node) -> None:
        self._line = node

    def visit_Call(self, node: cst.Call) -> None:
        if is_barrier(node, self.ctx.qualify):
            self.has_barrier = True
        if (is_optimizer_step(self.ctx, node) or _calls_stepping_function(self.ctx, node)) \
                and self._line is not None:
            if not self.step_lines or self.step_lines[-1] is not self._line:
                self.step_lines.append(self._line)
        if self.ctx.values.calls_for_data(node):
            self.calls_batch = True
        if (isinstance(node.func, cst.Attribute) and node.func.attr.value in HOST_READS
                and self.first_host_read is None and self._line is not None):
            self.first_host_read = self._line
        if (isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward"
                and self.backward is None):
            self.backward = self._line


def _calls_stepping_function(ctx, node: cst.Call) -> bool:
    func = node.func
    if isinstance(func, cst.Attribute) and (ctx.values.self_class.get(id(func)) is not None
                                            or ctx.values.classes_of(func.value)):
        # `self.train_step(...)`: a method of the class this method is in (its first
        # parameter, whatever it is called); `model.optimize(x)` of `model = Model(...)`, a
        # class of this file
        return is_stepping_function(ctx, func.attr.value)
    return isinstance(func, cst.Name) and is_stepping_function(ctx, func.value)


class _ReadsGrad(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found = False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if node.attr.value == "grad":
            self.found = True
        return not self.found


def _contains(stmt: cst.CSTNode, target: cst.CSTNode) -> bool:
    class Find(cst.CSTVisitor):
        found = False

        def on_visit(self, node) -> bool:
            if node is target:
                self.found = True
            return not self.found

    finder = Find()
    scan(stmt, finder)
    return finder.found


def hand_update(ctx, loop: cst.For | cst.While, backward: cst.SimpleStatementLine):
    """A training step with no optimizer object (`loss.backward()`, then
    `for p in model.parameters(): p.data.add_(p.grad, alpha=-lr)` or `p -= lr * p.grad` under
    `torch.no_grad()`): the statement of the loop body, at or after the backward's, that last
    reads `.grad` (the update), or None when no statement does (the update is in a function of
    another file: the barrier then ends the body)."""
    body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
    start = next((i for i, stmt in enumerate(body) if _contains(stmt, backward)), None)
    if start is None:
        return None
    update = None
    for stmt in body[start:]:
        reads = _ReadsGrad()
        scan(stmt, reads)
        if reads.found:
            update = stmt
    return update


def branch_with_hand_update(loop: cst.For | cst.While, steps: list[cst.SimpleStatementLine]):
    """The `if` of the loop body one of whose branches steps the optimizer while another steps
    it too or updates the parameters by hand (pytorch/examples word_language_model: `if
    args.use_optimizer: optimizer.step()` / `else: for p in model.parameters():
    p.data.add_(p.grad, ...)`; DINO: `if fp16_scaler is None: optimizer.step()` / `else:
    fp16_scaler.step(optimizer)`): the barrier goes after the whole `if`, so every kind of step
    is cut, not only the last one written. With it, whether a branch updates by hand."""
    body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
    top = next((stmt for stmt in body if _contains(stmt, steps[-1])), None)
    if not isinstance(top, cst.If) or top.orelse is None:
        return None
    branches = [top.body]
    branch = top.orelse
    while isinstance(branch, cst.If):  # elif chains
        branches.append(branch.body)
        branch = branch.orelse
    if branch is not None:
        branches.append(branch.body)

    def by_hand(block) -> bool:
        reads = _ReadsGrad()
        scan(block, reads)
        return reads.found

    stepped = [block for block in branches if any(_contains(block, step) for step in steps)]
    by_hand = [block for block in branches if block not in stepped and by_hand(block)]
    if len(stepped) + len(by_hand) < 2:
        return None
    return top, bool(by_hand)


class _Names(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return {n for e in target.elements for n in _target_names(e.value)}
    return set()


def carries_state(loop: cst.For | cst.While) -> bool:
    """Does the loop feed a call's result back into the next iteration (a sampling loop:
    `output, state = model(x, state)`, `idx = torch.cat((idx, idx_next), dim=1)`)? Without a
    cut per iteration XLA traces the whole chain into every later graph: a new, longer graph
    at each host read (yunjey's language-model sampler: 164 graphs in 186 s)."""
    body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
    # Names this iteration binds before it reads them are not carried over: the loop's own
    # target (diffusers' `for one_image in image: one_image = preprocess(one_image)`), and
    # what an earlier statement of the body assigned.
    fresh = set(_target_names(loop.target)) if isinstance(loop, cst.For) else set()
    for stmt in body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if not isinstance(small, cst.Assign):
                continue
            targets = {n for t in small.targets for n in _target_names(t.target)}
            if isinstance(small.value, cst.Call):
                used = _Names()
                for arg in small.value.args:
                    scan(arg.value, used)
                if (targets & used.names) - fresh:
                    return True
            fresh |= targets
    return False


def _own_statements(body: cst.CSTNode):
    """`body` and what it contains, without the bodies of loops and functions nested in it
    (their writes are theirs: each loop is judged on its own)."""
    stack = [body]
    while stack:
        node = stack.pop()
        yield node
        if node is not body and isinstance(node, (cst.For, cst.While, cst.FunctionDef,
                                                   cst.ClassDef, cst.Lambda)):
            continue
        stack.extend(reversed(children(node)))


def fills_buffers(ctx, loop: cst.For | cst.While) -> bool:
    """Does the loop write its iterations' results in place into tensors made before it
    (`values[step] = value.flatten()`: an RL rollout's storage)? Each write is a pending
    update of a tensor that outlives the iteration: without a cut, the writes (and the random
    number state a sampling op advances) pile into the graph of the next host read, a new and
    longer graph each iteration (cleanrl's PPO: 65 graphs from one line in a rollout)."""
    bound_inside = set(_target_names(loop.target)) if isinstance(loop, cst.For) else set()
    writes = []
    for node in _own_statements(loop.body):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                bound_inside.update(_target_names(target.target))
                if isinstance(target.target, cst.Subscript):
                    writes.append(target.target.value)
        elif isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Subscript):
            writes.append(node.target.value)
    return any(isinstance(buffer, cst.Name) and buffer.value not in bound_inside
               and K.TENSOR in ctx.values.kinds(buffer) for buffer in writes)


def accumulation_backwards(ctx, loop: cst.For | cst.While) -> list[cst.SimpleStatementLine]:
    """Gradient accumulation in a training step's loop: the `.backward()` lines of its inner
    loops that neither step an optimizer nor cut the graph (nanoGPT's micro-steps)."""
    lines = []
    for micro in find_steps(ctx, loop).inner_loops:
        steps = find_steps(ctx, micro)
        if not (steps.step_lines or steps.has_barrier) and steps.backward is not None:
            lines.append(steps.backward)
    return lines


def find_steps(ctx, loop: cst.For | cst.While) -> _StepFinder:
    """The optimizer steps and barriers of a loop body, computed once per loop for all rules."""
    def compute() -> _StepFinder:
        finder = _StepFinder(ctx)
        scan(loop.body, finder)
        return finder

    return ctx.memo(("steps", id(loop)), compute)
