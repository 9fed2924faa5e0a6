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

import math
from dataclasses import dataclass, field

FLOAT32_RTOL = 1e-3
LOW_PRECISION_RTOL = 5e-2
# The noise floor: the original run once more with every trained weight times (1 + E x noise)
# from step 0's first forward on. How far that moves step k's loss is how far rounding-sized
# differences grow by step k in this training (an unstable one multiplies them by 10 or more a
# step), and step k's tolerance is never below it. E is about ten float32 roundings, or a
# bfloat16 one. Perturbing the weights step 0 computes with (not only those step 1 starts from)
# moves that step's gradients as the port's kernels do: in an ill-conditioned model far more
# than the weights (kuangliu/pytorch-cifar's SimpleDLA: a 1e-6 change of the weights moves its
# first gradients 1.8e-2, XLA:CPU's kernels 7.2e-2 from ATen's; float32 on the CPU computes
# them 0.7% from float64), and that is what later steps amplify: perturbed only at its first
# update, SimpleDLA's floor was 1.1e-4 at step 2 against the faithful port's 5.3e-2; perturbed
# from step 0, 1.1e-2.
FLOAT32_PERTURBATION = 1e-6
LOW_PRECISION_PERTURBATION = 4e-3
# One draw of that noise is one sample of how far rounding moves the loss; the port's own
# kernels are another. Measured on a 24-layer BatchNorm MLP at learning rate 0.5 (fixtures/
# verify/deep.py, 2026-12-04), eight draws of the floor differed from each other by 5x to 160x
# at a step (step 1: 6.9e-4 to 4.1e-2); scaled by its calibration (0.3), 10x the smallest
# draw's envelope still covered the faithful port's difference at every step. So a step's
# tolerance is SPREAD x the largest floor up to it, and from the first step where that reaches
# UNCOMPARABLE, rounding alone moves the loss as much as a wrong port would: those steps are
# not compared (said, never called diverged).
SPREAD = 10.0
UNCOMPARABLE = 0.1


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


def gradient_difference(original: list[list[float]], port: list[list[float]]) -> float | None:
    """|g_port - g_original| / |g_original| of the first optimizer step's gradients, from the
    probes child.py records (per parameter: element count, squared norm, projections on the
    same random directions: the mean square of the projections' differences estimates the
    squared norm of the difference). None when the probes do not describe the same parameters."""
    if not original or len(original) != len(port):
        return None
    if any(len(a) != len(b) or a[0] != b[0] for a, b in zip(original, port)):
        return None
    squares = sum(row[1] for row in original)
    projections = len(original[0]) - 2
    if squares <= 0 or projections < 1:
        return None
    difference = sum((x - y) ** 2 for a, b in zip(original, port)
                     for x, y in zip(a[2:], b[2:])) / projections
    return math.sqrt(difference / squares)


def explained(measured: float | None, conditioning: float | None, rtol: float) -> bool | None:
    """Whether the port's step-0 gradient difference (`measured`, same weights and batch) is
    what rounding explains: within the tolerance, or within SPREAD x how far the floor run's
    rounding-sized weight perturbation moved the same gradients (`conditioning`). A gradient
    scaled or clipped otherwise (1e-2 on a model whose gradients rounding moves 1.2e-4) is not.
    None when either was not measured."""
    if measured is None or conditioning is None:
        return None
    return measured <= max(rtol, SPREAD * conditioning)


# The floor's perturbation is rounding-sized; the port's kernels differ by their own amount.
# Measured at step 0 on both (how far each moved the gradients), the floor is scaled by their
# ratio, as a small perturbation's effect scales before it saturates: by at least 1/10 (a port
# whose kernels agree still rounds) and at most 100.
CALIBRATION = (0.1, 100.0)


def calibration(measured: float | None, conditioning: float | None, rtol: float) -> float:
    """How many times the port's kernels moved step 0's gradients more than the floor's
    perturbation did (1 where either was not measured or rounding does not explain the
    port's difference). Measured: fixtures/verify/deep.py 0.3 (its floor draws at step 1,
    7e-4 to 4e-2, against the port's 1.5e-4), SimpleDLA 4."""
    if not explained(measured, conditioning, rtol) or not conditioning:
        return 1.0
    low, high = CALIBRATION
    return min(max(measured / conditioning, low), high)


def noise_floor(original: list[float], perturbed: list[float] | None,
                scale: float = 1.0) -> list[float]:
    """Each step's relative change of the original's loss in the floor run, scaled by
    `calibration` (at most 1)."""
    return [min(1.0, scale * relative(a, b)) for a, b in zip(original, perturbed or [])]


def tolerances(rtol: float, floor: list[float], steps: int) -> list[float]:
    """Each of `steps` steps' tolerance: `rtol`, or SPREAD x the noise floor (`noise_floor`;
    its largest up to that step: a perturbation's effect does not shrink because one step's
    loss happens to agree) where training amplifies more."""
    tolerance, envelope = [], 0.0
    for i in range(steps):
        envelope = max(envelope, floor[i] if i < len(floor) else 0.0)
        tolerance.append(max(rtol, SPREAD * envelope))
    return tolerance


def amplified_from(rtol: float, steps_rtol: list[float]) -> int | None:
    """The first step whose noise-floor tolerance reaches UNCOMPARABLE (a tolerance the user
    set that high is theirs: nothing is cut below it)."""
    return next((i for i, tol in enumerate(steps_rtol)
                 if tol >= UNCOMPARABLE and tol > rtol), None)


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
                   device_rng: list[dict], amplified: int | None = None) -> Comparison:
    """Step by step up to the shorter run, up to the first step whose randomness the port
    draws on its device (dropout inside attention: the two runs cannot agree there), and up
    to the step `amplified` (`amplified_from`) from which rounding alone moves the loss too
    far. `rtol`: one tolerance, or one per step (`tolerances`)."""
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
    if amplified is not None and amplified < limit:
        limit = amplified
        moved = steps_rtol[amplified] / SPREAD  # the floor's envelope there (> rtol)
        why = (f"from step {amplified} this training amplifies rounding-sized differences "
               f"beyond comparison: the original itself, re-run with rounding-sized "
               f"perturbations (its noise floor), moves the loss by {moved:.1e} by then")
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


def unreproduced(step: int, runs: dict, reruns: dict, rtol: float) -> dict | None:
    """The divergence of `step` did not come back when both sides ran again to locate it (their
    losses at `step` agree within `rtol`): not the port's doing but a step that differs from run
    to run. Which side's loss changed between its two runs says where. `runs`, `reruns`: the
    losses of each side ({"original": [...], "port": [...]}) in the comparison and the rerun."""
    again = [reruns[side][step] if len(reruns[side]) > step else None for side in SIDES]
    if None in again or relative(*again) > rtol:
        return None
    moved = [side for side in SIDES if len(runs[side]) > step
             and relative(runs[side][step], reruns[side][step]) > rtol]
    return {"step": step, "kind": "unreproduced", "moved": moved,
            "losses": {side: [runs[side][step], reruns[side][step]] for side in SIDES
                       if len(runs[side]) > step}}


SIDES = ("original", "port")


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
    if kind == "unreproduced":
        moved = where["moved"]
        changed = "; ".join(f"the {side}'s went from {where['losses'][side][0]:.6g} to "
                            f"{where['losses'][side][1]:.6g}" for side in moved)
        whose = (f"the loss of the same step changed between two runs of the same code: "
                 f"{changed}" if moved else "neither side's loss moved beyond the tolerance "
                 "on its own")
        return (f"step {step} diverged, but not when both sides ran again to locate it (their "
                f"losses agree there): the difference does not repeat, so it is no port's "
                f"doing but a step that differs from run to run ({whose}): threads racing "
                "on a tensor, a data loader's workers, an op with no fixed order; run verify "
                "again to see whether it recurs")
    if kind == "module":
        return (f"the first module whose output differs in step {step} is "
                f"`{where['module']}` (output norm {where['original_norm']:.6g} vs "
                f"{where['port_norm']:.6g})")
    line = f" at {where['line']}" if where.get("line") else ""
    return (f"every module's output agrees in step {step}: the loss computed after them"
            f"{line} differs (its reduction, its weights, its inputs)")
