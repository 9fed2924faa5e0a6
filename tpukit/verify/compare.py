"""Comparing the two runs of `tpukit verify`: the losses step by step, and inside the first
step that differs, the modules' outputs in call order.

The tolerance is relative, `|original - port| / max(|original|, |port|)`, per step. Its
default depends on what the port computes in: the original runs in float32 on the CPU (CUDA
hidden: a CUDA autocast is off there), the port in float32 on XLA or, after the port of its
mixed precision, in bfloat16 autocast. FLOAT32_RTOL and LOW_PRECISION_RTOL were chosen from the
corpus run in README "tpukit verify on the corpus": stable float32 ports agreed within 4.3e-7,
the bfloat16 port (timm) within 2.6e-3. A changed port of the fixture differs by 4e-3 (a
doubled learning rate, step 1) to 700% (a summed loss): under float32 every one is caught at
its step; under a bfloat16 port's 5e-2 a change as small as the learning rate's shows only
once it has grown, which is the price of comparing bfloat16 with float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FLOAT32_RTOL = 1e-3
LOW_PRECISION_RTOL = 5e-2
# The noise floor: the original run once more with every trained weight times (1 + E x noise)
# at its first optimizer step. How far that moves step k's loss is how far rounding-sized differences
# grow by step k in this training (an unstable one multiplies them by 10 or more a step), and
# step k's tolerance is never below it. E is about ten float32 roundings, or a bfloat16 one.
FLOAT32_PERTURBATION = 1e-6
LOW_PRECISION_PERTURBATION = 4e-3


def relative(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    if scale == 0:
        return 0.0
    if a != a or b != b:  # NaN
        return 0.0 if (a != a) == (b != b) else float("inf")
    return abs(a - b) / scale


def default_rtol(port_precision: list[str]) -> float:
    return LOW_PRECISION_RTOL if port_precision else FLOAT32_RTOL


def perturbation(port_precision: list[str]) -> float:
    return LOW_PRECISION_PERTURBATION if port_precision else FLOAT32_PERTURBATION


def tolerances(rtol: float, original: list[float], perturbed: list[float] | None) -> list[float]:
    """Each step's tolerance: `rtol`, or the noise floor where training amplifies more."""
    floor = [relative(a, b) for a, b in zip(original, perturbed or [])]
    return [max(rtol, floor[i] if i < len(floor) else 0.0) for i in range(len(original))]


@dataclass
class Comparison:
    verdict: str  # "match" | "diverged" | "incomparable"
    steps_compared: int
    first_divergent_step: int | None
    max_rel_diff: float | None
    rel_diffs: list[float] = field(default_factory=list)
    comparable_until: int | None = None  # steps from here on are not compared
    not_comparable_why: str | None = None


def compare_losses(original: list[float], port: list[float], rtol: float | list[float],
                   device_rng: list[dict]) -> Comparison:
    """Step by step up to the shorter run, and up to the first step whose randomness the
    port draws on its device (dropout inside attention: the two runs cannot agree there).
    `rtol`: one tolerance, or one per step (`tolerances`)."""
    steps_rtol = rtol if isinstance(rtol, list) else [rtol] * len(original)
    count = min(len(original), len(port))
    limit, why = count, None
    if device_rng:
        first = min(event["step"] for event in device_rng)
        if first < count:
            limit = first
            what = next(e["what"] for e in device_rng if e["step"] == first)
            why = (f"from step {first} the port draws random numbers on its device "
                   f"({what}), which the original draws on the CPU")
    diffs = [relative(a, b) for a, b in zip(original[:limit], port[:limit])]
    first_bad = next((i for i, d in enumerate(diffs) if d > steps_rtol[i]), None)
    if first_bad is not None:
        verdict = "diverged"
    elif not diffs:
        verdict = "incomparable"
    else:
        verdict = "match"
    return Comparison(verdict=verdict, steps_compared=len(diffs),
                      first_divergent_step=first_bad,
                      max_rel_diff=max(diffs) if diffs else None, rel_diffs=diffs,
                      comparable_until=limit if why else None, not_comparable_why=why)


# The batches of the two runs are the same data or not: their norms agree up to float32
# summation over a large batch (1.2e-5 on a CIFAR batch of 128 images, CPU vs XLA), or not.
INPUT_RTOL = 1e-4


def first_input_difference(original: list, port: list) -> int | None:
    """The first step whose first forward was given another batch (input norms differ)."""
    for step, (a, b) in enumerate(zip(original, port)):
        if a is not None and b is not None and relative(a, b) > INPUT_RTOL:
            return step
    return None


def locate(step: int, original: dict, port: dict, rtol: float) -> dict:
    """Where the first divergent step first differs: the parameters it starts from (a step
    before it updated them differently), the first module whose output differs beyond
    `rtol`, or, when every module agrees, the loss computed after them."""
    where: dict = {"step": step}
    for kind in ("gradient_norm", "update_norm"):  # the update of the step before
        a, b = original.get(kind), port.get(kind)
        if step > 0 and a is not None and b is not None and relative(a, b) > rtol:
            where.update(kind=kind.split("_")[0], original_norm=a, port_norm=b)
            return where
    before, after = original.get("parameters_norm"), port.get("parameters_norm")
    if step > 0 and before is not None and after is not None and relative(before, after) > rtol:
        where.update(kind="parameters", original_norm=before, port_norm=after)
        return where
    for index, (a, b) in enumerate(zip(original.get("calls", []), port.get("calls", []))):
        if a["module"] != b["module"]:
            where.update(kind="calls", index=index, original_module=a["module"],
                         port_module=b["module"])
            return where
        if relative(a["norm"], b["norm"]) > rtol:
            where.update(kind="module", index=index, module=a["module"],
                         original_norm=a["norm"], port_norm=b["norm"])
            return where
    where.update(kind="loss", line=port.get("loss_line") or original.get("loss_line"))
    return where


def describe(where: dict) -> str:
    step = where["step"]
    kind = where.get("kind")
    if kind == "inputs":
        return (f"the batch step {where['step']} starts from is not the original's (input norm "
                f"{where['original_norm']:.6g} vs {where['port_norm']:.6g}): the two runs read "
                "other data (shuffle, sampler, augmentation, workers: a data-loading choice "
                "the script makes differently on the accelerator?)")
    if kind == "gradient":
        return (f"step {step - 1}'s gradients already differ at its optimizer step (norm "
                f"{where['original_norm']:.6g} vs {where['port_norm']:.6g}) although its loss "
                "agreed: gradients kept from an earlier step (zero_grad), scaled, or clipped "
                "differently")
    if kind == "update":
        return (f"step {step - 1}'s update moved the parameters by another amount (norm "
                f"{where['original_norm']:.6g} vs {where['port_norm']:.6g}) from the same "
                "gradients: the optimizer differs (learning rate, momentum, weight decay, "
                "its schedule)")
    if kind == "parameters":
        return (f"the parameters already differ when step {step} starts (norm "
                f"{where['original_norm']:.6g} vs {where['port_norm']:.6g}): step {step - 1}'s "
                "update differs (learning rate, optimizer, zero_grad, gradient clipping)")
    if kind == "calls":
        return (f"the forward of step {step} calls other modules: call {where['index']} is "
                f"`{where['original_module']}` in the original, `{where['port_module']}` in "
                "the port (a model compiled on one side runs its modules as one graph there: "
                "compare with the compile off to see which module first differs)")
    if kind == "unlocated":
        return (f"not located: the run that records step {step}'s modules failed on the "
                f"{where['side']} ({where['error']})")
    if kind == "module":
        return (f"the first module whose output differs in step {step} is "
                f"`{where['module']}` (output norm {where['original_norm']:.6g} vs "
                f"{where['port_norm']:.6g})")
    line = f" at {where['line']}" if where.get("line") else ""
    return (f"every module's output agrees in step {step}: the loss computed after them"
            f"{line} differs (its reduction, its weights, its inputs)")
