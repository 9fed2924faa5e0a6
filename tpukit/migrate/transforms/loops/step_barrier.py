"""TPU303 step-barrier: A training loop that batches by hand gets `torch_xla.sync()` once per step.

Its messages and tables: rules/TPU303-step-barrier.toml.
"""

from __future__ import annotations

import re

import libcst as cst

from tpukit.findings import FixKind, Message, Severity
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.steps import (
    NO_GRAD,
    accumulation_backwards,
    branch_with_hand_update,
    carries_state,
    fills_buffers,
    find_steps,
    hand_update,
    is_optimizer_step,
    is_stepping_function,
    loader_in_iter,
)
from tpukit.migrate.guards import scope_moves_to_cuda
from tpukit.migrate.nodes import walk
from tpukit.migrate.transforms.base import Transform, transform


# Code that names CUDA (what the port moves to XLA): `.cuda()`, "cuda", torch.cuda.
# A module that imports torch_xla itself (as written: tpukit adds its own imports after).
_IMPORTS_TORCH_XLA = re.compile(r"^[ \t]*(?:import|from)[ \t]+torch_xla\b", re.MULTILINE)


@transform("TPU303")
class StepBarrier(Transform):
    """Loops that batch by hand get `torch_xla.sync()` once per step, after the optimizer step
    (eval loops: once per batch). Never a second barrier where one exists."""
    uses = frozenset({"steps", "values"})

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
        self.called_once: set[cst.CSTNode] = set()  # ... of functions no loop here calls
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
        if self.ctx.library_code or not is_stepping_function(self.ctx, name):
            return
        if self._no_grad_decorated(function) or self._optimizer_method(function):
            # an optimizer's own step (timm's Lookahead.step around its base optimizer's, under
            # no_grad): an update, not a training step; its caller's step is what is cut
            return
        named = name in self._names_used()
        if named and name in self._called_in_loops():
            return  # a loop of this file steps it (and cuts it there)
        finder = find_steps(self.ctx, function)
        if finder.has_barrier or not finder.step_lines:
            return
        last = finder.step_lines[-1]
        if any(is_optimizer_step(self.ctx, node) for node in walk(last)):
            # Named but called by no loop (the DDP tutorial's `demo_basic(rank)`, once per
            # process): its one step is never cut, and lazy XLA runs nothing until a value
            # is read: the program could end having trained nothing on the device.
            self.after[last] = function
            (self.called_once if named else self.callers_elsewhere).add(last)

    def _optimizer_method(self, function: cst.FunctionDef) -> bool:
        cls = self.ctx.values.method_of.get(id(function))
        return cls is not None and K.OPTIMIZER in self.ctx.values.instance_kinds(cls)

    def _called_in_loops(self) -> set[str]:
        """The names of the functions and methods called inside a loop of this file."""
        def compute() -> set[str]:
            called = set()
            for loop in walk(self.ctx.module):
                if isinstance(loop, (cst.For, cst.While, cst.ListComp, cst.GeneratorExp)):
                    for node in walk(loop):
                        if isinstance(node, cst.Call):
                            func = node.func
                            if isinstance(func, cst.Name):
                                called.add(func.value)
                            elif isinstance(func, cst.Attribute):
                                called.add(func.attr.value)
            return called
        return self.ctx.memo("called_in_loops", compute)

    def _names_used(self) -> set[str]:
        """Every name this file reads or calls, as a name or an attribute (a definition's own
        name is not a use)."""
        def compute() -> set[str]:
            used, own = set(), set()
            for node in walk(self.ctx.module):
                if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                    own.add(id(node.name))
                elif isinstance(node, cst.Name) and id(node) not in own:
                    used.add(node.value)
                elif isinstance(node, cst.Attribute):
                    used.add(node.attr.value)
            return used
        return self.ctx.memo("names_used", compute)

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
            both = branch_with_hand_update(node, finder.step_lines)
            if both is not None:  # `if use_optimizer: opt.step()` / `else: p.data.add_(...)`
                top, by_hand = both
                message = self.say("both_branches") if by_hand else self.say("every_branch")
                self.after_update[top] = (node, message)
            else:
                self.after[finder.step_lines[-1]] = node  # after the last step: one a step
            self.micro_steps.update(accumulation_backwards(self.ctx, node))
        elif finder.backward is not None and finder.backward not in self.micro_steps:
            # A training step is found by its `.backward()`, not by an optimizer: a loop that
            # updates the parameters by hand would pile every step's update into the next
            # step's graph (a bigger graph and a new compile per step).
            update = hand_update(self.ctx, node, finder.backward)
            if update is not None:
                self.after_update[update] = (node, self.say("hand_step")
                                             + self.say("hand_step_after_update"))
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

    def _library_barrier_left(self) -> Message | None:
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
            message = (self.say("sampling") + self.say("sampling_before_read")
                       if loop in self.sampling else
                       self.say("rollout") + self.say("rollout_before_read")
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
        message = (self.say("step_called_elsewhere") if original in self.callers_elsewhere
                   else self.say("step_called_once") if original in self.called_once
                   else self.say("step"))
        result = self.fix_or_report(
            original, message,
            lambda: cst.FlattenSentinel([updated, self._sync_line()]),
        )
        return result

    def _end(self, original, updated):
        if original in self.update_at_end:
            self.update_at_end.discard(original)
            message = self.say("hand_step") + self.say("hand_step_at_end")
        elif original in self.at_end:
            self.at_end.discard(original)
            message = (self.say("sampling") + self.say("sampling_at_end")
                       if original in self.sampling else
                       self.say("rollout") + self.say("rollout_at_end")
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
