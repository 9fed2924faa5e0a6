"""An optimizer step that updates nothing: none of the optimizer's parameters has a gradient
although a backward ran since the last step.

The classic cause on XLA: the optimizer was built from the model's parameters before the model
moved to the device. On CUDA `Module.cuda()` swaps each Parameter's storage in place and the
optimizer keeps working; on XLA `Module.to(xla)` makes new Parameter objects (torch 2.9 +
torch_xla 2.9: `m.weight is p0` False after `m.to(torch_xla.device())`), so the optimizer holds
the stale CPU tensors, the backward fills the new ones' gradients, and the step changes
nothing. No error is raised and the loss just stays where it was. `tpukit run` (TPU709) and
`tpukit verify` (a "diverged" verdict with this reason) both check each optimizer's first step
after a backward.
"""

from __future__ import annotations

import sys

from tpukit.run.frames import user_frame


def steps_nothing(optimizer) -> dict | None:
    """What this optimizer would update, when none of its parameters has a gradient: its class,
    how many parameters, and the device types they are on. None when it updates something."""
    params = [p for group in getattr(optimizer, "param_groups", ()) for p in group["params"]]
    if not params or any(getattr(p, "grad", None) is not None for p in params):
        return None
    return {"optimizer": type(optimizer).__name__, "parameters": len(params),
            "devices": sorted({p.device.type for p in params})}


class UntrainedCheck:
    """Each optimizer's first step after a backward, checked once (the check reads only
    `.grad`, which is None or not: no device value is read)."""

    def __init__(self) -> None:
        self._checked: set[int] = set()
        self.found: list[dict] = []

    def stepping(self, optimizer, backward_ran: bool, step: int) -> None:
        if not backward_ran or id(optimizer) in self._checked:
            return
        self._checked.add(id(optimizer))
        nothing = steps_nothing(optimizer)
        if nothing is None:
            return
        where = user_frame(sys._getframe(1))
        self.found.append({**nothing, "step": step,
                           "path": where[0] if where else None,
                           "line": where[1] if where else None})


def reason(found: dict) -> str:
    """The one-line reason verify gives for a port whose optimizer updates nothing."""
    devices = "/".join(found["devices"])
    return (f"the optimizer's parameters are not the model's: {found['optimizer']}.step() at "
            f"step {found['step']} updated none of its {found['parameters']} parameters (on "
            f"{devices}: none has a gradient after the backward); an optimizer built before "
            "its model moved to the XLA device holds the stale CPU tensors")
