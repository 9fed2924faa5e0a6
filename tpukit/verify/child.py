"""One side of `tpukit verify`, in a process of its own: the script runs as `python SCRIPT
ARGS` would run it, seeded the same way on both sides, and every training step's loss is read
from the run itself: the tensor whose `backward()` runs. A step ends at an optimizer's step
(micro-steps of gradient accumulation are averaged into it); a script that steps no optimizer
has one step per backward.

Random numbers are made comparable where they can be: the host's generator draws them on both
sides. Dropout's masks (and dropout1d/2d/3d's channel masks) are drawn on the host and moved
to the input's device (on both sides, so both use the same masks); the random factory functions and in-place fills (`torch.randn(...,
device=d)`, `x.normal_()`, `torch.multinomial`) draw on the host and move their result when
the device is not the CPU. What stays on the device's own generator (dropout inside
`scaled_dot_product_attention`, the alpha dropouts) is recorded with its step: from there on
the two runs cannot be compared.

With `--perturb E` (the noise floor run, command.py) every trained parameter is multiplied by
(1 + E x noise) when step 0 first calls its model (or, one no model call reaches, when an
optimizer first steps it): how far a rounding-sized change of the weights moves each step's
loss in this training. With `--probe-gradients` the first optimizer step's gradients are
recorded as PROJECTIONS random projections per parameter (the same directions in every run):
command.py estimates from them how far the port's gradients differ from the original's at the
one step both start from the same weights and batch, and how far the floor run's perturbation
moved them.
With `--locate K` the output norm of every module call of step K is recorded in call order,
with the parameters' norm when that step's first forward starts, and the gradients' norm
and the update's size of step K-1: where the two runs first differ (command.py compares them).

    python -m tpukit.verify.child --out OUT.json [--steps N] [--locate K] [--perturb E]
                                  [--probe-gradients] [--seed S] [--shim xla|cpu|none]
                                  SCRIPT ARGS
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import traceback
from pathlib import Path

from tpukit.run.untrained import UntrainedCheck


PROJECTIONS = 4


class StopVerify(Exception):
    """The steps asked for are done."""


def _first_tensor(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _squares(tensor):
    """The squared norm, as a tensor where it is (read when the run ends: a read inside the
    step would cut the port's graph there, one compile per module)."""
    return tensor.detach().float().pow(2).sum()


def _root(squares: list) -> float | None:
    return math.sqrt(sum(float(t.cpu()) for t in squares)) if squares else None


def _user_line(script: Path) -> str | None:
    """`file:line` of the innermost frame in the script's folder (the backward's caller)."""
    folder = str(script.resolve().parent)
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(folder) and "/tpukit/" not in frame.filename:
            return f"{Path(frame.filename).name}:{frame.lineno}"
    return None


class Recorder:
    def __init__(self, script: Path, steps: int | None, locate: int | None, seed: int,
                 perturb: float = 0.0, probe_gradients: bool = False) -> None:
        self.script = script
        self.perturb = perturb  # the noise floor run: parameters perturbed by this much
        self._perturbed: set[int] = set()
        self.probe_gradients = probe_gradients
        self._probe: list = []  # step 0's gradients: [numel, squares, projections...] each
        self.max_steps = steps
        self.locate = locate
        self.seed = seed
        self.micro: list = []  # this step's losses (tensors, read at the end)
        self.scaled: dict[int, object] = {}  # id(GradScaler.scale(loss)) -> loss
        self.steps: list[list] = []
        self.backwards = 0
        self.optimizer_steps = 0
        self.loss_line: str | None = None
        self.device_rng: list[dict] = []  # {"step", "what"}: randomness the host cannot draw
        self.low_precision: set[str] = set()  # "bfloat16"/"float16" seen in a forward
        self.devices: set[str] = set()
        self.calls: list[dict] = []  # --locate: {"module", "norm"} in call order
        # --locate K, squared norms as tensors: the parameters when step K starts, step K-1's
        # gradients at its update, and how far that update moved the parameters
        self._parameter_squares: list | None = None
        self._gradient_squares: list = []
        self._update_squares: list = []
        self._before: list = []
        self._inputs: dict[int, object] = {}  # step -> its first forward's input norm (tensor)
        self._depth = 0
        self._names: dict[int, str] = {}
        self.untrained = UntrainedCheck()  # optimizers whose step updates nothing

    @property
    def step(self) -> int:
        return len(self.steps)

    # -- losses and steps ------------------------------------------------------------------
    def install(self) -> None:
        import torch
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        recorder = self
        backward = torch.Tensor.backward

        def recorded_backward(tensor, *args, **kwargs):
            if tensor.numel() == 1 and tensor.requires_grad:
                recorder.backwards += 1
                # a GradScaler's scaled loss counts as the loss it scaled (the scale differs
                # where the original's scaler is on and the port's is gone)
                loss = recorder.scaled.pop(id(tensor), tensor)
                recorder.micro.append(loss.detach().reshape(()))
                recorder.loss_line = recorder.loss_line or _user_line(recorder.script)
            return backward(tensor, *args, **kwargs)

        torch.Tensor.backward = recorded_backward
        scale = torch.amp.GradScaler.scale

        def recorded_scale(scaler, outputs):
            scaled = scale(scaler, outputs)
            if isinstance(outputs, torch.Tensor) and scaled is not outputs:
                recorder.scaled[id(scaled)] = outputs
            return scaled

        torch.amp.GradScaler.scale = recorded_scale
        register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: self._stepping(optimizer))
        register_optimizer_step_post_hook(lambda optimizer, args, kwargs: self._stepped(optimizer))
        torch.nn.modules.module.register_module_forward_pre_hook(self._pre_forward)
        torch.nn.modules.module.register_module_forward_hook(self._forward)
        self._install_randomness()

    def _watched(self) -> bool:
        """The update of the step before the one located is measured (its gradients, and how
        far it moved the parameters)."""
        return self.locate is not None and self.locate > 0 and self.step == self.locate - 1

    def _stepping(self, optimizer) -> None:
        self.untrained.stepping(optimizer, bool(self.micro), self.step)
        if self.probe_gradients and self.step == 0 and not self._probe:
            self._project(optimizer)
        if self.perturb:  # parameters no model call reached
            self._perturb(_parameters(optimizer), self.perturb)
        if not self._watched() or not self.micro:
            return
        params = _parameters(optimizer)
        self._gradient_squares += [_squares(p.grad) for p in params if p.grad is not None]
        self._before = [(p, p.detach().clone()) for p in params]

    def _stepped(self, optimizer=None) -> None:
        if self._watched() and self._before:
            self._update_squares += [_squares(p.detach() - old) for p, old in self._before]
            self._before = []
        if not self.micro:
            return  # a second optimizer of the same step (GANs: one step, two losses each)
        self.optimizer_steps += 1
        self.steps.append(self.micro)
        self.micro = []
        if self.max_steps is not None and self.step >= self.max_steps:
            raise StopVerify

    def settle(self) -> None:
        """The run is over: on XLA, what it left pending (the last step, stopped before the
        script's own barrier, and the tensors recorded for the report) runs as one graph, the
        step's own, not one graph per value read."""
        if "torch_xla" in sys.modules:
            import torch_xla

            torch_xla.sync()

    def located(self) -> dict:
        """--locate: the norms of step `locate` and of the update before it."""
        return {"calls": [{"module": call["module"], "norm": math.sqrt(float(call["norm"].cpu()))}
                          for call in self.calls],
                "parameters_norm": _root(self._parameter_squares or []),
                "gradient_norm": _root(self._gradient_squares),
                "update_norm": _root(self._update_squares)}

    def inputs(self) -> list[float | None]:
        count = len(self.steps) if self.optimizer_steps else len(self.micro)
        return [float(self._inputs[i].cpu()) if i in self._inputs else None
                for i in range(count)]

    def losses(self) -> list[float]:
        steps = self.steps
        if not self.optimizer_steps:  # no optimizer: one step per backward
            steps = [[loss] for loss in self.micro]
            if self.max_steps is not None:
                steps = steps[: self.max_steps]
        return [sum(float(t.float().cpu()) for t in step) / len(step) for step in steps]

    # -- modules: precision, and the norms of step `locate` ---------------------------------
    def _pre_forward(self, module, args):
        import torch

        # a model called from the script (a data transform that is a Module, torchvision's
        # Normalize in the loader, has no parameters: it is not one)
        if self._depth == 0 and next(module.parameters(), None) is not None:
            if self.perturb and self.step == 0:  # the model as step 0 first calls it
                self._perturb(module.parameters(), self.perturb)
            if self.step not in self._inputs:
                # the batch the step starts from: its norm, read when the run ends (no sync)
                first = _first_tensor(args)
                if first is not None and first.is_floating_point():
                    self._inputs[self.step] = first.detach().float().norm()
                elif first is not None:
                    self._inputs[self.step] = first.detach().double().norm()
            if id(module) not in self._names:
                self._names.update({id(m): name or type(module).__name__
                                    for name, m in module.named_modules()})
            if self.step == self.locate and self._parameter_squares is None:
                self._parameter_squares = [_squares(p) for p in module.parameters()]
            # the device the forward computes on: its first tensor input's, nested ones too
            # (DINO's student takes a list of crops), else its parameters'
            first = _first_tensor(args)
            if first is None:
                first = next(module.parameters(), None)
            device = first.device.type if first is not None else "cpu"
            self.devices.add(device)
            for kind in {device, "cpu"}:
                try:
                    if torch.is_autocast_enabled(kind):
                        self.low_precision.add(str(torch.get_autocast_dtype(kind)).split(".")[-1])
                except (RuntimeError, TypeError):
                    pass
            for parameter in module.parameters():
                if parameter.dtype in (torch.bfloat16, torch.float16):
                    self.low_precision.add(str(parameter.dtype).split(".")[-1])
                break
        self._depth += 1

    def _perturb(self, parameters, size: float) -> None:
        """Each parameter not perturbed before, times (1 + size x a fixed normal draw), drawn
        from a generator of its own so the run's own random numbers are the same."""
        import torch

        noise = torch.Generator().manual_seed(self.seed + 2)
        with torch.no_grad():
            for parameter in parameters:
                if id(parameter) in self._perturbed or not parameter.is_floating_point():
                    continue
                self._perturbed.add(id(parameter))
                draw = torch.randn(parameter.shape, generator=noise).to(parameter.device)
                parameter.mul_(1 + size * draw.to(parameter.dtype))

    def _project(self, optimizer) -> None:
        """The gradients the first optimizer step applies, as PROJECTIONS dot products with
        random directions per parameter (drawn on the host from a generator of their own: the
        same directions on both sides), its element count and its squared norm. Kept as
        tensors and read when the run ends (no host sync inside the step)."""
        import torch

        directions = torch.Generator().manual_seed(self.seed + 3)
        with torch.no_grad():
            for parameter in _parameters(optimizer):
                grad = parameter.grad
                if grad is None or grad.is_sparse or not grad.is_floating_point():
                    continue
                flat = grad.detach().float().reshape(-1)
                row = [torch.tensor(float(flat.numel()), device=flat.device),
                       flat.pow(2).sum()]
                for _ in range(PROJECTIONS):
                    draw = torch.randn(flat.shape, generator=directions).to(flat.device)
                    row.append((flat * draw).sum())
                self._probe.append(torch.stack(row))

    def gradient_probe(self) -> list[list[float]]:
        # a row at a time: parameters may live on more than one device
        return [row.cpu().double().tolist() for row in self._probe]

    def _forward(self, module, args, output):
        self._depth -= 1
        if self.locate is not None and self.step == self.locate and not self.micro:
            tensor = _first_tensor(output)
            if tensor is not None and tensor.is_floating_point():
                self.calls.append({"module": self._names.get(id(module), type(module).__name__),
                                   "norm": _squares(tensor)})

    # -- randomness ------------------------------------------------------------------------
    def _install_randomness(self) -> None:
        import torch
        import torch.nn.functional as F

        recorder = self
        masks = torch.Generator().manual_seed(self.seed + 1)

        def dropout(input, p=0.5, training=True, inplace=False):
            if not training or p == 0:
                return original_dropout(input, p, training, inplace)
            keep = torch.rand(input.shape, generator=masks) >= p
            scale = keep.to(dtype=input.dtype, device=input.device) / (1 - p) if p < 1 \
                else torch.zeros_like(input)
            return input.mul_(scale) if inplace else input * scale

        original_dropout = F.dropout
        F.dropout = dropout

        def feature_dropout(original, spatial):
            """dropout1d/2d/3d: whole channels zeroed, the mask drawn on the host."""
            def wrapper(input, p=0.5, training=True, inplace=False):
                if not training or p == 0:
                    return original(input, p, training, inplace)
                batched = input.dim() == spatial + 2
                shape = tuple(input.shape[:2] if batched else input.shape[:1])
                shape += (1,) * (input.dim() - len(shape))
                keep = torch.rand(shape, generator=masks) >= p
                scale = keep.to(dtype=input.dtype, device=input.device) / (1 - p) if p < 1 \
                    else torch.zeros(shape, dtype=input.dtype, device=input.device)
                return input.mul_(scale) if inplace else input * scale
            return wrapper

        for spatial in (1, 2, 3):
            name = f"dropout{spatial}d"
            setattr(F, name, feature_dropout(getattr(F, name), spatial))

        def on_device_only(name, original):
            def wrapper(*args, **kwargs):
                tensor = _first_tensor(args)
                training = kwargs.get("training", args[2] if len(args) > 2 else True)
                p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
                if tensor is not None and tensor.device.type != "cpu" and training and p:
                    recorder.device_rng.append({"step": recorder.step, "what": name})
                return original(*args, **kwargs)
            return wrapper

        for name in ("alpha_dropout", "feature_alpha_dropout"):
            setattr(F, name, on_device_only(f"torch.nn.functional.{name}", getattr(F, name)))
        attention = F.scaled_dot_product_attention

        def scaled_dot_product_attention(query, *args, **kwargs):
            if kwargs.get("dropout_p", args[3] if len(args) > 3 else 0.0) and \
                    query.device.type != "cpu":
                recorder.device_rng.append({"step": recorder.step,
                                            "what": "scaled_dot_product_attention(dropout_p=...)"})
            return attention(query, *args, **kwargs)

        F.scaled_dot_product_attention = scaled_dot_product_attention
        self._host_factories(torch)

    def _host_factories(self, torch) -> None:
        """Random factories and fills that would draw on the device draw on the host."""

        def device_of(kwargs):
            device = kwargs.get("device")
            return torch.device(device) if device is not None else None

        def factory(original):
            def wrapper(*args, **kwargs):
                device = device_of(kwargs)
                if device is None or device.type == "cpu" or kwargs.get("generator") is not None:
                    return original(*args, **kwargs)
                kwargs["device"] = "cpu"
                return original(*args, **kwargs).to(device)
            return wrapper

        def like(original):
            def wrapper(input, *args, **kwargs):
                device = device_of(kwargs) or input.device
                if device.type == "cpu":
                    return original(input, *args, **kwargs)
                kwargs["device"] = "cpu"
                kwargs.setdefault("dtype", input.dtype)
                return original(torch.empty(input.shape, dtype=input.dtype), *args,
                                **kwargs).to(device)
            return wrapper

        def drawn_from(original):  # torch.multinomial(probs), torch.bernoulli(p), normal(mean)
            def wrapper(input, *args, **kwargs):
                if not isinstance(input, torch.Tensor) or input.device.type == "cpu" \
                        or kwargs.get("generator") is not None:
                    return original(input, *args, **kwargs)
                return original(input.cpu(), *args, **kwargs).to(input.device)
            return wrapper

        def fill(original):
            def wrapper(tensor, *args, **kwargs):
                if tensor.device.type == "cpu" or kwargs.get("generator") is not None:
                    return original(tensor, *args, **kwargs)
                drawn = original(torch.empty(tensor.shape, dtype=tensor.dtype), *args, **kwargs)
                with torch.no_grad():
                    return tensor.copy_(drawn)
            return wrapper

        for name in ("rand", "randn", "randint", "randperm", "normal"):
            wrap = drawn_from if name == "normal" else factory
            setattr(torch, name, _keep_doc(wrap(getattr(torch, name)), getattr(torch, name)))
        for name in ("rand_like", "randn_like", "randint_like"):
            setattr(torch, name, like(getattr(torch, name)))
        for name in ("multinomial", "bernoulli", "poisson"):
            setattr(torch, name, drawn_from(getattr(torch, name)))
        for name in ("multinomial", "bernoulli"):
            setattr(torch.Tensor, name, drawn_from(getattr(torch.Tensor, name)))
        for name in ("normal_", "uniform_", "bernoulli_", "random_", "exponential_",
                     "geometric_", "cauchy_", "log_normal_"):
            setattr(torch.Tensor, name, fill(getattr(torch.Tensor, name)))


def _parameters(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _keep_doc(wrapper, original):
    wrapper.__doc__ = original.__doc__
    return wrapper


def _load_in_this_thread() -> None:
    """The port's MpDeviceLoader reads its loader in the script's own thread, as the original
    reads its DataLoader. Its background thread drew the host's random numbers (an
    augmentation's; torchvision's FakeData reseeds the global generator for each image and
    restores it) in an order against the step's own draws that changed from run to run, and
    the step draws from that same generator here (the device's randomness drawn on the host,
    as the original draws it): examples-dcgan's noise, 1 run in 6. The batches, their order
    and the barrier before each are MpDeviceLoader's."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    from torch_xla.distributed import parallel_loader

    def batches(self):
        sharding = self._parallel_loader_kwargs.get("input_sharding")
        for batch in self._loader:
            torch_xla.sync()  # PerDeviceLoader's barrier before each batch
            with torch.no_grad():
                moved = xm.send_cpu_data_to_device([batch], self._device, sharding)[0]
            yield moved
        torch_xla.sync()

    parallel_loader.MpDeviceLoader.__iter__ = batches


def _seed(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpukit.verify.child")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--locate", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--perturb", type=float, default=0.0)
    parser.add_argument("--probe-gradients", action="store_true")
    parser.add_argument("--shim", choices=("xla", "cpu", "none"), default="none",
                        help="the runtime layer (tpukit/shim) and where it sends CUDA calls")
    parser.add_argument("script", type=Path)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    from tpukit.run.script import run_target

    if options.shim != "none":  # before the recorder's patches, which then call through it
        import tpukit.shim

        tpukit.shim.install(options.script, options.shim)
    if options.shim == "xla":  # the port's side
        _load_in_this_thread()
    _seed(options.seed)
    recorder = Recorder(options.script, options.steps, options.locate, options.seed,
                        options.perturb, options.probe_gradients)
    recorder.install()
    outcome = run_target(str(options.script), None, options.args, (StopVerify,))
    result = {"outcome": outcome.kind, "exit_code": outcome.exit_code, "error": outcome.error,
              "backwards": recorder.backwards, "optimizer_steps": recorder.optimizer_steps,
              "loss_line": recorder.loss_line, "device_rng": recorder.device_rng,
              "low_precision": sorted(recorder.low_precision),
              "devices": sorted(recorder.devices), "untrained": recorder.untrained.found}
    try:
        recorder.settle()
        result.update(recorder.located())
        result["losses"] = recorder.losses()
        result["inputs"] = recorder.inputs()
        try:
            result["gradient_probe"] = recorder.gradient_probe()
        except Exception as exc:  # no probe, said: the losses still count
            result["gradient_probe"], result["probe_error"] = [], f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a loss that cannot be read back (the device failed)
        result.update(outcome="error", error=f"reading the losses: {type(exc).__name__}: {exc}",
                      losses=[])
    options.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
