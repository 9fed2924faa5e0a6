"""Training and eval loops: MpDeviceLoader for DataLoader loops, a step barrier for manual
batching, and what would recompile or sync in the hot loop.

XLA traces a step lazily and runs it when the graph is cut. MpDeviceLoader cuts it once per
batch (and overlaps the host-to-device copy); a loop that batches by hand must call
`torch_xla.sync()` once per step itself, or the graph grows across steps.
"""

from __future__ import annotations

import re

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import dotted, find_keyword
from tpukit.migrate.nodes import first, walk
from tpukit.migrate.guards import scope_moves_to_cuda
from tpukit.migrate.transforms.base import Transform, transform

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


def is_barrier(ctx, call: cst.Call, qualify=None) -> bool:
    """A graph barrier: by the name the call resolves to (`qualify`: how names resolve, the
    traversal's by default), or one a rule just wrote, before its import exists."""
    return (qualify or ctx.qualify)(call.func) in BARRIERS \
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
        if is_barrier(self.ctx, node):
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

    def scan() -> bool:
        for function in ctx.memo("function_defs", definitions).get(name, ()):
            finder = _OwnStep(ctx)
            function.visit(finder)
            hand_update = finder.backward and finder.reads_grad
            if (finder.steps or hand_update) and not finder.barrier:
                return True
        return False

    return ctx.memo(("stepping", name), scan)


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
        if is_barrier(self.ctx, node):
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
    stmt.visit(finder)
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
        stmt.visit(reads)
        if reads.found:
            update = stmt
    return update


def _branch_with_hand_update(loop: cst.For | cst.While, step: cst.SimpleStatementLine):
    """The `if` of the loop body whose branch steps the optimizer while its `else` updates the
    parameters by hand (pytorch/examples word_language_model: `if args.use_optimizer:
    optimizer.step()` / `else: for p in model.parameters(): p.data.add_(p.grad, ...)`): the
    barrier goes after the whole `if`, so both kinds of step are cut."""
    body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
    top = next((stmt for stmt in body if _contains(stmt, step)), None)
    if not isinstance(top, cst.If) or top.orelse is None or not _contains(top.body, step):
        return None
    reads = _ReadsGrad()
    top.orelse.visit(reads)
    return top if reads.found else None


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
                    arg.value.visit(used)
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
        stack.extend(reversed(node.children))


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
    def scan() -> _StepFinder:
        finder = _StepFinder(ctx)
        loop.body.visit(finder)
        return finder

    return ctx.memo(("steps", id(loop)), scan)


@transform("TPU301")
class DeviceLoader(Transform):
    """A DataLoader that a loop iterates is wrapped in MpDeviceLoader; pin_memory dropped."""

    reads_device_facts = True

    def statement_triggers(self, source: str) -> set[str]:
        # a loop over a loader holds the loader's name, whatever the rule's own words
        return super().statement_triggers(source) | self.ctx.values.names_of({K.LOADER})

    def leave_For(self, original: cst.For, updated: cst.For):
        found = loader_in_iter(self.ctx, original)
        if found is None:
            return None
        loader, path = found
        if is_device_loader(loader) or self.ctx.values.kinds(loader) & {K.PREPARED, K.DEVICE_LOADER}:
            return None  # its batches are on the device already
        if _yields(original.body):
            # lightning's _FabricDataLoader: `for item in self._dataloader: yield move(item)`
            # is a loader itself (here, the one for non-XLA strategies): the loop that
            # consumes its batches is where the device loader goes, not inside it.
            return None
        if self.ctx.library_hands_off():
            # mmengine's EpochBasedTrainLoop.run_epoch: the runner's model is on the device
            # mmengine picked (the CPU on a TPU host); the loader would start the runtime there
            self.ctx.report(self.rule, original.iter,
                            self.say("library", code=self.ctx.short(loader)),
                            applied=False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        if self.ctx.owner_leaves("TPU301", "own_device") and not scope_moves_to_cuda(self.ctx):
            # fairscale's pipe benchmark: `device = torch.device("cuda") if
            # torch.cuda.is_available() else torch.device("cpu")` stays (library code), so its
            # batches stay on the CPU of a TPU host: a device loader to that device would start
            # the XLA runtime for nothing
            self.ctx.report(self.rule, original.iter,
                            self.say("library_own_device", code=self.ctx.short(loader)),
                            applied=False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        device = self.ctx.device_expr()

        def build():
            wrapped = cst.Call(
                func=self.ctx.expr("pl.MpDeviceLoader"),
                args=[cst.Arg(loader, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                      cst.Arg(device)],
            )
            return updated.with_changes(iter=_replace_innermost(updated.iter, len(path), wrapped))

        return self.fix_or_report(original.iter, self.say("loader", code=self.ctx.short(loader)),
                                  build)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        name = self.ctx.qualify(original.func)
        if name in DATALOADERS:
            pin = find_keyword(original, "pin_memory")
            if pin is None:
                return None
            def build():
                args = [a for a, o in zip(updated.args, original.args) if o is not pin]
                if args and original.args[-1] is pin:
                    args[-1] = args[-1].with_changes(comma=updated.args[-1].comma)
                return updated.with_changes(args=args)
            return self.fix_or_report(pin, self.say("pin_memory_argument"), build)
        func = original.func
        if (isinstance(func, cst.Attribute) and func.attr.value == "pin_memory"
                and not original.args and not self.ctx.qualify(func.value)):
            return self.fix_or_report(
                original, self.say("pin_memory", code=self.ctx.short(original)),
                lambda: updated.func.value)
        return None


def _yields(body: cst.BaseSuite) -> bool:
    """Does the loop body hand its items on (`yield`), outside nested functions?"""
    finder = _YieldFinder()
    body.visit(finder)
    return finder.found


class _YieldFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found = False

    def visit_Yield(self, node: cst.Yield) -> None:
        self.found = True

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def _replace_innermost(expr, depth: int, replacement):
    if depth == 0:
        return replacement
    first = expr.args[0]
    inner = _replace_innermost(first.value, depth - 1, replacement)
    return expr.with_changes(args=[first.with_changes(value=inner), *expr.args[1:]])


@transform("TPU302")
class RaggedLastBatch(Transform):
    """A DataLoader without drop_last=True ends each epoch with a smaller batch: a new shape,
    so a new XLA compilation (and another at every epoch's end on eval)."""

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) not in DATALOADERS:
            return None
        drop = find_keyword(original, "drop_last")
        if drop is not None:
            return None

        def build():
            args = list(updated.args)
            if args:
                args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return updated.with_changes(args=[*args, cst.Arg(
                cst.Name("True"), keyword=cst.Name("drop_last"),
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                      whitespace_after=cst.SimpleWhitespace("")))])

        return self.fix_or_report(original, self.say("ragged"), build)


# Code that names CUDA (what the port moves to XLA): `.cuda()`, "cuda", torch.cuda.
# A module that imports torch_xla itself (as written: tpukit adds its own imports after).
_IMPORTS_TORCH_XLA = re.compile(r"^[ \t]*(?:import|from)[ \t]+torch_xla\b", re.MULTILINE)


@transform("TPU303")
class StepBarrier(Transform):
    """Loops that batch by hand get `torch_xla.sync()` once per step, after the optimizer step
    (eval loops: once per batch). Never a second barrier where one exists."""

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.after: dict[cst.CSTNode, cst.CSTNode] = {}  # step line -> loop it belongs to
        self.at_end: set[cst.CSTNode] = set()  # eval loops: sync as last statement
        self.before: dict[cst.CSTNode, cst.CSTNode] = {}  # eval loops: sync before this line
        self.micro_steps: set[cst.CSTNode] = set()  # backward lines of accumulation loops
        self.after_update: dict[cst.CSTNode, tuple] = {}  # hand update -> (loop, message)
        self.update_at_end: set[cst.CSTNode] = set()  # hand updates elsewhere: body's end
        self.sampling: set[cst.CSTNode] = set()  # no_grad loops that feed results forward
        self.rollout: set[cst.CSTNode] = set()  # loops that fill tensors made before them
        self.callers_elsewhere: set[cst.CSTNode] = set()  # step lines of functions no code here calls
        self.no_grad_depth = 0

    def _no_grad_decorated(self, node: cst.FunctionDef) -> bool:
        for d in node.decorators:
            expr = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
            if self.ctx.qualify(expr) in NO_GRAD:
                return True
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef):
        if self._no_grad_decorated(node):
            self.no_grad_depth += 1
        self._step_called_elsewhere(node)

    def _step_called_elsewhere(self, function: cst.FunctionDef) -> None:
        """A function that is one training step (an optimizer step outside any loop of its
        own, no barrier) and that nothing in this file names: its callers' loop is in another
        module, or reaches it through what only the running program knows (pix2pix's
        `create_model` picks the model's class by a string; train.py's loop calls
        `model.optimize_parameters()`), so no loop of this port cuts its graph. The step ends
        with the barrier: after its last optimizer step. Library code's steps are its
        caller's to cut."""
        name = function.name.value
        if name.startswith("__") and name.endswith("__"):
            return  # Python calls it through syntax (`scaler(loss, opt)`), not by its name
        if (self.ctx.library_code or not is_stepping_function(self.ctx, name)
                or name in self._names_used()):
            return
        finder = find_steps(self.ctx, function)
        if finder.has_barrier or not finder.step_lines:
            return
        last = finder.step_lines[-1]
        if any(is_optimizer_step(self.ctx, node) for node in walk(last)):
            self.after[last] = function
            self.callers_elsewhere.add(last)

    def _names_used(self) -> set[str]:
        """Every name this file reads or calls, as a name or an attribute (a definition's own
        name is not a use)."""
        def scan() -> set[str]:
            used, own = set(), set()
            for node in walk(self.ctx.module):
                if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                    own.add(id(node.name))
                elif isinstance(node, cst.Name) and id(node) not in own:
                    used.add(node.value)
                elif isinstance(node, cst.Attribute):
                    used.add(node.attr.value)
            return used
        return self.ctx.memo("names_used", scan)

    def leave_FunctionDef(self, original, updated):
        if self._no_grad_decorated(original):
            self.no_grad_depth -= 1
        return None

    def visit_With(self, node: cst.With):
        if any(isinstance(i.item, cst.Call) and self.ctx.qualify(i.item.func) in NO_GRAD for i in node.items):
            self.no_grad_depth += 1

    def _loop(self, node) -> None:
        if isinstance(node, cst.For) and loader_in_iter(self.ctx, node):
            return  # MpDeviceLoader cuts the graph once per batch
        finder = find_steps(self.ctx, node)
        if finder.has_barrier:
            return
        if finder.step_lines:
            both = _branch_with_hand_update(node, finder.step_lines[-1])
            if both is not None:  # `if use_optimizer: opt.step()` / `else: p.data.add_(...)`
                self.after_update[both] = (node, self.say("both_branches"))
            else:
                self.after[finder.step_lines[-1]] = node  # after the last step: one a step
            self.micro_steps.update(accumulation_backwards(self.ctx, node))
        elif finder.backward is not None and finder.backward not in self.micro_steps:
            # A training step is found by its `.backward()`, not by an optimizer: a loop that
            # updates the parameters by hand would pile every step's update into the next
            # step's graph (a bigger graph and a new compile per step).
            update = hand_update(self.ctx, node, finder.backward)
            if update is not None:
                self.after_update[update] = (node, self.say("hand_step_after_update",
                                                            hand_step=self.say("hand_step")))
            elif isinstance(node.body, cst.IndentedBlock):
                self.update_at_end.add(node)
        elif ((sampled := bool(self.no_grad_depth
                               and (finder.calls_batch or carries_state(node))))
              or (finder.first_host_read is not None and fills_buffers(self.ctx, node))):
            if not sampled:
                self.rollout.add(node)  # a rollout's storage, under no_grad or not
            elif not finder.calls_batch:
                self.sampling.add(node)
            body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
            if finder.first_host_read is not None and finder.first_host_read in body:
                # Cut the graph before the first host read: one execution for the batch,
                # not a small one for `.item()` and another for the rest.
                self.before[finder.first_host_read] = node
            else:
                self.at_end.add(node)

    def visit_For(self, node):
        self._loop(node)

    def visit_While(self, node):
        self._loop(node)

    def fix_or_report(self, node, message, build, fix=None):
        why = self._library_barrier_left()
        if why is not None:
            self.ctx.report(self.rule, node, why, applied=False,
                            fix=FixKind.NONE, severity=Severity.INFO)
            return None
        return super().fix_or_report(node, message, build, fix)

    def _library_barrier_left(self) -> str | None:
        """Why library code (a package module) gets no barrier here (the finding's message), or
        None."""
        if not self.ctx.owner_leaves("TPU303", "barrier"):
            return None
        if _IMPORTS_TORCH_XLA.search(self.ctx.source):
            # diffusers' pipelines: `if XLA_AVAILABLE: xm.mark_step()` in the denoising loop;
            # a barrier in their guidance loops or around long-video chunks is one too many
            return self.say("library_xla_aware")
        if any(isinstance(f, cst.FunctionDef) and f.name.value in ("forward", "backward")
               for f in self.ctx.functions):
            # transformers' xLSTM: chunked inference; fairscale's OffloadFunction.backward
            return self.say("library_forward", function=next(
                f.name.value for f in self.ctx.functions if isinstance(f, cst.FunctionDef)
                and f.name.value in ("forward", "backward")))
        if self.ctx.library_hands_off():
            # DeepSpeed's superoffload step and ZenFlow's CPU-Adam child: no XLA tensor is
            # there, and the barrier would start the runtime (and claim the TPU) in them
            return self.say("library")
        if not scope_moves_to_cuda(self.ctx):
            # DeepSpeed's Ulysses sp_fwd_loss_bwd: its batches go to `self.device`, the CPU
            # on a TPU host (DeepSpeed has no XLA accelerator)
            return self.say("library_own_device")
        return None

    def _sync_line(self) -> cst.SimpleStatementLine:
        return cst.SimpleStatementLine([cst.Expr(self.ctx.expr("torch_xla.sync()"))])

    def leave_SimpleStatementLine(self, original, updated):
        if original in self.before:
            loop = self.before.pop(original)
            message = (self.say("sampling_before_read", sampling=self.say("sampling"))
                       if loop in self.sampling else
                       self.say("rollout_before_read", rollout=self.say("rollout"))
                       if loop in self.rollout else self.say("eval_before_read"))
            return self.fix_or_report(
                original, message,
                lambda: cst.FlattenSentinel([
                    self._sync_line().with_changes(leading_lines=updated.leading_lines),
                    updated.with_changes(leading_lines=()),
                ]),
            )
        if original in self.micro_steps:
            self.micro_steps.discard(original)
            return self.fix_or_report(
                original, self.say("micro_step"),
                lambda: cst.FlattenSentinel([updated, self._sync_line()]),
            )
        if original in self.after_update:
            return self._after_update(original, updated)
        if original not in self.after:
            return None
        self.after.pop(original)
        result = self.fix_or_report(
            original, self.say("step_called_elsewhere") if original in self.callers_elsewhere
            else self.say("step"),
            lambda: cst.FlattenSentinel([updated, self._sync_line()]),
        )
        return result

    def _end(self, original, updated):
        if original in self.update_at_end:
            self.update_at_end.discard(original)
            message = self.say("hand_step_at_end", hand_step=self.say("hand_step"))
        elif original in self.at_end:
            self.at_end.discard(original)
            message = (self.say("sampling_at_end", sampling=self.say("sampling"))
                       if original in self.sampling else
                       self.say("rollout_at_end", rollout=self.say("rollout"))
                       if original in self.rollout else self.say("eval_at_end"))
        else:
            return None
        body = updated.body
        if not isinstance(body, cst.IndentedBlock):
            return None
        return self.fix_or_report(
            original.body, message,
            lambda: updated.with_changes(body=body.with_changes(body=[*body.body, self._sync_line()])),
        )

    def _after_update(self, original, updated):
        """`torch_xla.sync()` right after the statement that updates the parameters by hand."""
        if original not in self.after_update:
            return None
        _, message = self.after_update.pop(original)
        return self.fix_or_report(
            original, message,
            lambda: cst.FlattenSentinel([updated, self._sync_line()]),
        )

    def _leave_loop(self, original, updated):
        ended = self._end(original, updated)
        if original in self.after_update:
            return self._after_update(original, updated if ended is None else ended)
        return ended

    leave_For = leave_While = _leave_loop

    def leave_With(self, original, updated):
        if any(isinstance(i.item, cst.Call) and self.ctx.qualify(i.item.func) in NO_GRAD
               for i in original.items):
            self.no_grad_depth -= 1
        return self._after_update(original, updated)

    def leave_If(self, original, updated):
        return self._after_update(original, updated)

    def leave_Try(self, original, updated):
        return self._after_update(original, updated)
