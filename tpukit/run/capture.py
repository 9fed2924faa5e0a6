"""Shape capture: the shapes of what each step receives (the loop's batches, the outermost
module's forward inputs) and the user line that received them, into the probe's current step;
the attention sites of the models called (attention.py)."""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any

from tpukit.run.attention import AttentionSites
from tpukit.run.frames import user_frame
from tpukit.run.shapes import Shape, signature


class ShapeCapture:
    def __init__(self, steps) -> None:
        """`steps`: what has the `current` step (the probe)."""
        self.steps = steps
        self.attention = AttentionSites()
        self.models: set[str] = set()  # class names of the outermost modules called
        self.modules: list[Any] = []  # the forward calls running now, outermost first
        self._main = threading.main_thread()
        self._params: dict[type, list[str]] = {}

    def record_batch(self, batch: Any, where: tuple[str, int] | None) -> None:
        self.record(signature(batch, "batch"), where)

    def record(self, shapes: dict[str, Shape], where: tuple[str, int] | None) -> None:
        step = self.steps.current
        step.shapes.update(shapes)
        if where is not None:
            step.origins.update(dict.fromkeys(shapes, where))
        step.inputs_seen = True

    def forward_pre(self, module, args) -> None:
        if threading.current_thread() is not self._main:
            return
        if not self.modules:
            self.attention.scan(module)
            names = self._param_names(type(module))
            owner = type(module).__name__
            self.models.add(owner)
            shapes: dict[str, Shape] = {}
            for i, value in enumerate(args):
                name = names[i] if i < len(names) else f"arg{i}"
                shapes.update(signature(value, f"{owner}.forward({name})"))
            self.record(shapes, user_frame(sys._getframe(1)))
        elif self.attention.by_module:
            self.attention.forward_called(module, user_frame(sys._getframe(1)))
        self.modules.append(module)

    def forward_post(self, module, args, output) -> None:
        if self.modules and threading.current_thread() is self._main:
            self.modules.pop()

    def _param_names(self, cls: type) -> list[str]:
        if cls not in self._params:
            try:
                params = list(inspect.signature(cls.forward).parameters.values())[1:]
            except (TypeError, ValueError):
                params = []
            self._params[cls] = [p.name for p in params
                                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return self._params[cls]
