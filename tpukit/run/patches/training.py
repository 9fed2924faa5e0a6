"""What tells a micro-step of gradient accumulation from a training step: a backward ran, an
optimizer exists, an optimizer stepped."""

from __future__ import annotations

import functools

from tpukit.run.patches.base import Patch


class BackwardPatch(Patch):
    def install(self, probe) -> None:
        import torch

        original = torch.Tensor.backward

        @functools.wraps(original)
        def backward(*args, **kwargs):
            probe.backward_ran = True
            return original(*args, **kwargs)

        self.replace(torch.Tensor, "backward", backward)


class OptimizerPatch(Patch):
    """A torch.optim.Optimizer was made (steps are then its steps), and each of its steps."""

    def install(self, probe) -> None:
        import torch
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        original = torch.optim.Optimizer.__init__

        @functools.wraps(original)
        def init(*args, **kwargs):
            probe.optimizers_made = True
            return original(*args, **kwargs)

        self.replace(torch.optim.Optimizer, "__init__", init)
        # an optimizer whose first step after a backward updates nothing (untrained.py)
        self.hook(register_optimizer_step_pre_hook(
            lambda optimizer, args, kwargs: probe.untrained.stepping(
                optimizer, probe.backward_ran, probe.current.index)))
        self.hook(register_optimizer_step_post_hook(
            lambda optimizer, args, kwargs: probe.optimizer_stepped()))
