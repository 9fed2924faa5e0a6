"""`tpukit verify SCRIPT [--port PORT] -- ARGS`: does the port train as the original does?

Without `--port`, the script and the local modules it imports are copied to a temporary
folder (the rest of the script's folder is linked there, so files found next to `__file__`
are found) and migrated there. The original runs on the CPU with CUDA hidden, the port on
XLA (the TPU, or XLA:CPU where there is none), each in a process of its own (child.py) with
the same seeds, one after the other; each step's loss is compared (compare.py). At the first
step that differs,
both runs are repeated up to that step with the modules' outputs recorded, to say where
inside the step they first differ.

Exit status: 0 match, 1 diverged, 2 one side could not run (or bad usage), 3 nothing was
comparable (the port draws its randomness on the device from the first step).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tpukit.errors import UsageError
from tpukit.run.untrained import reason
from tpukit.verify.compare import (SPREAD, amplified_from, calibration, compare_losses,
                                   default_rtol, describe, explained, first_input_difference,
                                   gradient_difference, locate, noise_floor, perturbation,
                                   relative, tolerances, unreproduced)

EXIT = {"match": 0, "diverged": 1, "incomparable": 3}
RANDOMNESS = ("dropout masks and the random numbers asked for on the device are drawn from "
              "the host's generator on both sides")


@dataclass
class VerifyRequest:
    script: Path
    args: list[str] = field(default_factory=list)
    port: Path | None = None
    steps: int = 10
    rtol: float | None = None
    seed: int = 0
    target: str = "xla"
    fmt: str = "text"
    json_path: Path | None = None
    timeout: float | None = None
    original_args: list[str] = field(default_factory=list)  # after `args`, the original's only


def _mirror(folder: Path, copied: set[Path], dest: Path) -> None:
    """`dest` mirrors `folder`: the files in `copied` are copies (the migration writes them),
    folders holding one are made, everything else is a link to the original."""
    for entry in folder.iterdir():
        target = dest / entry.name
        resolved = entry.resolve()
        if resolved in copied:
            shutil.copy2(entry, target)
        elif entry.is_dir() and not entry.is_symlink() and any(
                resolved in path.parents for path in copied):
            target.mkdir()
            _mirror(entry, copied, target)
        else:
            target.symlink_to(resolved)


def make_port(script: Path, work: Path, target: str) -> tuple[Path, str]:
    """A migrated copy of `script` (and its local modules) under `work`: (its path, the
    migration's summary line)."""
    from tpukit.migrate.local_imports import local_modules

    script = script.resolve()
    copied = {script, *(p.resolve() for p in local_modules(script))}
    root = work / "port"
    root.mkdir()
    _mirror(script.parent, copied, root)
    port = root / script.name
    proc = subprocess.run([sys.executable, "-m", "tpukit", "migrate", "--quiet", "--exit-zero",
                           "--target", target, str(port)],
                          capture_output=True, text=True, cwd=root)
    if proc.returncode not in (0, 1):
        raise UsageError(f"{script}: the migration failed: "
                         f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return port, proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


def _environment(side: str, original: Path, port: Path) -> dict:
    env = dict(os.environ)
    if side == "original":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the original on the CPU
        env.pop("PJRT_DEVICE", None)
    else:
        from tpukit.run.command import choose_device, xla_cpu_compile_flags

        choose_device(env)
        xla_cpu_compile_flags(env)  # as `tpukit run` compiles on XLA:CPU
        if env.get("PYTHONPATH"):
            env["PYTHONPATH"] = port_pythonpath(original, port, env["PYTHONPATH"])
    return env


def port_pythonpath(original: Path, port: Path, pythonpath: str) -> str:
    """The port's PYTHONPATH: a folder of the original's tree on it (the repository's own
    packages: minGPT's `mingpt/` beside `projects/chargpt/`) becomes the same folder of the
    port's tree, so that each side imports its own. The trees are aligned by the two scripts'
    paths: their longest common tail (the file's name at least) names the same file in both."""
    o, p = original.resolve().parts, port.resolve().parts
    tail = 0
    while tail < min(len(o), len(p)) - 1 and o[-1 - tail] == p[-1 - tail]:
        tail += 1
    if tail == 0:
        return pythonpath
    o_root, p_root = Path(*o[:len(o) - tail]), Path(*p[:len(p) - tail])
    entries = []
    for entry in pythonpath.split(os.pathsep):
        folder = Path(entry).resolve() if entry else None
        if folder is not None and (folder == o_root or o_root in folder.parents):
            entry = str(p_root / folder.relative_to(o_root))
        entries.append(entry)
    return os.pathsep.join(entries)


def _start(side: str, script: Path, request: VerifyRequest, work: Path,
           steps: int, locate_step: int | None = None,
           perturb: float = 0.0) -> tuple[subprocess.Popen, Path, Path]:
    name = side if locate_step is None else f"{side}-locate"
    name = f"{name}-perturbed" if perturb else name
    out = work / f"{name}.json"
    log = work / f"{name}.log"
    # the runtime layer, as `tpukit run` installs it: the port's CUDA in code tpukit does not
    # rewrite lands on XLA; the original's CUDA (a `.cuda()`, a package's device='cuda', an
    # unconditional synchronize) runs on the CPU, its reference
    command = [sys.executable, "-m", "tpukit.verify.child", "--out", str(out),
               "--steps", str(steps), "--seed", str(request.seed),
               "--shim", "cpu" if side == "original" else "xla"]
    if locate_step is not None:
        command += ["--locate", str(locate_step)]
    if perturb:
        command += ["--perturb", repr(perturb)]
    if locate_step is None:  # step 0's gradients: the port's, and the floor run's
        command += ["--probe-gradients"]
    command += [str(script), *request.args]
    if side == "original":
        command += request.original_args
    handle = log.open("w")
    proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT,
                            env=_environment(side, request.script, script), text=True)
    handle.close()
    return proc, out, log


def _finish(side: str, started, timeout: float | None) -> dict:
    proc, out, log = started
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"outcome": "error", "error": f"timed out after {timeout:g} s", "losses": [],
                "log": _tail(log)}
    if not out.is_file():
        return {"outcome": "error", "error": f"the {side} run ended without a result (exit "
                f"status {proc.returncode})", "losses": [], "log": _tail(log)}
    result = json.loads(out.read_text())
    result["log"] = _tail(log)
    return result


def _tail(log: Path, lines: int = 12) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _both(request: VerifyRequest, original: Path, port: Path, work: Path, steps: int,
          locate_step: int | None = None) -> tuple[dict, dict]:
    """The original, then the port: one after the other, so that what a script writes where
    it runs (a checkpoint, a log) is never written by both at once."""
    first = _finish("original", _start("original", original, request, work, steps, locate_step),
                    request.timeout)
    second = _finish("port", _start("port", port, request, work, steps, locate_step),
                     request.timeout)
    return first, second


def _first_failed(original: dict, ported: dict) -> tuple[str, dict] | None:
    """The first side that could not run (its error said, its exit status where it said
    none), or None."""
    for side, result in (("original", original), ("port", ported)):
        if _failed(result):
            if not result.get("error"):
                result["error"] = f"it exited with status {result.get('exit_code')}"
            return side, result
    return None


def _failed(result: dict) -> bool:
    return not result.get("losses") and result.get("outcome") in ("error", "exit") and (
        result.get("outcome") == "error" or result.get("exit_code"))


def verify(request: VerifyRequest) -> dict:
    """The summary of one verification (the JSON `--json` writes)."""
    script = request.script
    if not script.is_file():
        raise UsageError(f"{script}: no such file")
    if request.port is not None and not request.port.is_file():
        raise UsageError(f"{request.port}: no such file")
    with tempfile.TemporaryDirectory(prefix="tpukit-verify-") as folder:
        work = Path(folder)
        migration = None
        port = request.port
        if port is None:
            port, migration = make_port(script, work, request.target)
        original, ported = _both(request, script, port, work, request.steps)
        summary = {
            "tool": "tpukit verify", "script": str(script),
            "port": str(request.port) if request.port else None, "migration": migration,
            "steps_requested": request.steps, "seed": request.seed, "randomness": RANDOMNESS,
            "sides": {side: {k: r.get(k) for k in ("outcome", "error", "devices",
                                                    "low_precision", "backwards",
                                                    "optimizer_steps", "loss_line")}
                      for side, r in (("original", original), ("port", ported))},
        }
        failed = _first_failed(original, ported)
        if failed:
            side, result = failed
            summary.update(verdict="error", failed_side=side, error=result.get("error"),
                           log=result.get("log"), losses={"original": original.get("losses", []),
                                                          "port": ported.get("losses", [])})
            return summary
        precision = ported.get("low_precision", [])
        rtol = request.rtol if request.rtol is not None else default_rtol(precision)
        measured = gradient_difference(original.get("gradient_probe", []),
                                       ported.get("gradient_probe", []))
        floor_run = _finish("original", _start("original", script, request, work, request.steps,
                                               perturb=perturbation(precision)), request.timeout)
        noise = floor_run.get("losses") or None
        conditioning = gradient_difference(original.get("gradient_probe", []),
                                           floor_run.get("gradient_probe", []))
        scale = calibration(measured, conditioning, rtol)
        floor = noise_floor(original["losses"], noise, scale)
        steps_rtol = tolerances(rtol, floor, len(original["losses"]))
        comparison = compare_losses(original["losses"], ported["losses"], steps_rtol,
                                    ported.get("device_rng", []),
                                    amplified_from(rtol, steps_rtol))
        if not original["losses"] and not ported["losses"]:
            comparison.not_comparable_why = ("no training step ran on either side (no "
                                             "backward() of a scalar)")
        elif len(original["losses"]) != len(ported["losses"]):
            shorter = "original" if len(original["losses"]) < len(ported["losses"]) else "port"
            comparison.not_comparable_why = comparison.not_comparable_why or (
                f"the {shorter} ran {min(len(original['losses']), len(ported['losses']))} "
                f"steps, the other {max(len(original['losses']), len(ported['losses']))}")
            comparison.comparable_until = comparison.comparable_until or comparison.steps_compared
        summary.update(
            verdict=comparison.verdict, steps_compared=comparison.steps_compared,
            first_divergent_step=comparison.first_divergent_step,
            max_rel_diff=comparison.max_rel_diff, rtol=rtol, step_rtol=steps_rtol,
            noise_floor=floor,
            perturbation=perturbation(precision),
            gradient_difference=measured, gradient_conditioning=conditioning,
            gradient_explained=explained(measured, conditioning, rtol), calibration=scale,
            rtol_basis="set by --rtol" if request.rtol is not None else (
                "the port computes in " + "/".join(ported.get("low_precision", []))
                if ported.get("low_precision") else "both compute in float32"),
            rel_diffs=comparison.rel_diffs,
            comparable_until=comparison.comparable_until,
            not_comparable_why=comparison.not_comparable_why,
            losses={"original": original["losses"], "port": ported["losses"]}, where=None)
        if _steps_nothing(summary, original, ported):
            return summary
        step = comparison.first_divergent_step
        fed = first_input_difference(original.get("inputs", []), ported.get("inputs", []))
        if step is not None and fed is not None and fed <= step:
            where = {"step": fed, "kind": "inputs", "original_norm": original["inputs"][fed],
                     "port_norm": ported["inputs"][fed]}
            summary["where"] = {**where, "text": describe(where)}
        elif step is not None:
            first, second = _both(request, script, port, work, step + 1, locate_step=step)
            failed = _first_failed(first, second)
            if failed:  # said, never a silent null
                side, result = failed
                where = {"step": step, "kind": "unlocated", "side": side,
                         "error": result["error"]}
            else:
                where = locate(step, first, second, steps_rtol[step])
                if where["kind"] == "loss":  # nothing differs before the loss: did it repeat?
                    where = unreproduced(
                        step, {"original": original["losses"], "port": ported["losses"]},
                        {"original": first["losses"], "port": second["losses"]},
                        steps_rtol[step]) or where
            summary["where"] = {**where, "text": describe(where)}
        return summary


def _steps_nothing(summary: dict, original: dict, ported: dict) -> bool:
    """A port whose optimizer updates nothing (untrained.py) has diverged at that step, whatever
    the losses say so far: a small learning rate keeps an untrained loss within tolerance for
    steps, and the run would end "successfully" having trained nothing."""
    stale = [f for f in ported.get("untrained") or () if not any(
        o["optimizer"] == f["optimizer"] for o in original.get("untrained") or ())]
    if not stale:
        return False
    found = stale[0]
    where = {"step": found["step"], "kind": "optimizer", "path": found.get("path"),
             "line": found.get("line"), "text": reason(found)}
    summary.update(verdict="diverged", first_divergent_step=found["step"], where=where)
    return True


# -- output ------------------------------------------------------------------------------------
def render_text(summary: dict) -> str:
    lines = [f"tpukit verify {summary['script']}"]
    if summary.get("migration"):
        lines.append(f"  port: migrated copy ({summary['migration']})")
    elif summary.get("port"):
        lines.append(f"  port: {summary['port']}")
    if summary["verdict"] == "error":
        lines.append(f"could not run the {summary['failed_side']}: {summary['error']}")
        if summary.get("log"):
            lines += ["  " + line for line in summary["log"].splitlines()]
        return "\n".join(lines)
    original, port = summary["losses"]["original"], summary["losses"]["port"]
    diffs = summary["rel_diffs"]
    lines.append(f"  {'step':>4}  {'original':>12}  {'port':>12}  rel. diff")
    for i in range(max(len(original), len(port))):
        a = f"{original[i]:.6g}" if i < len(original) else "-"
        b = f"{port[i]:.6g}" if i < len(port) else "-"
        if i < len(diffs):
            d = f"{diffs[i]:.2e}"
        elif i < min(len(original), len(port)):
            d = f"{relative(original[i], port[i]):.2e} (not compared)"
        else:
            d = "not compared"
        stale = (summary.get("where") or {}).get("kind") == "optimizer"
        mark = "" if i != summary["first_divergent_step"] else (
            "  <- the port's optimizer updated nothing" if stale else "  <- first beyond tolerance")
        tol = summary["step_rtol"][i] if i < len(summary.get("step_rtol", [])) else None
        if tol is not None and tol > summary["rtol"]:
            mark += f"  (tolerance {tol:.1e}: {SPREAD:g}x the noise floor)"
        lines.append(f"  {i:>4}  {a:>12}  {b:>12}  {d}{mark}")
    if any(tol > summary["rtol"] for tol in summary.get("step_rtol", [])):
        lines.append(f"  noise floor: the original re-run with its weights x (1 + "
                     f"{summary['perturbation']:.0e} x noise) from step 0, its effect x "
                     f"{summary['calibration']:.2g} (how far the port's kernels moved step 0's "
                     "gradients against it)")
    if summary.get("gradient_explained") is False:
        lines.append(f"  step 0's gradients differ by {summary['gradient_difference']:.1e} (the "
                     "same weights, the same batch): more than rounding explains (a "
                     f"{summary['perturbation']:.0e} change of the weights moves them "
                     f"{summary['gradient_conditioning']:.1e}): scaled, clipped or computed "
                     "otherwise")
    verdict = summary["verdict"]
    compared = summary["steps_compared"]
    tol = f"rtol {summary['rtol']:g}: {summary['rtol_basis']}"
    if verdict == "match":
        lines.append(f"match: {compared} steps compared, max relative difference "
                     f"{summary['max_rel_diff']:.2e} ({tol})")
    elif verdict == "diverged":
        lines.append(f"diverged at step {summary['first_divergent_step']} of {compared} "
                     f"compared ({tol})")
        if summary.get("where"):
            lines.append(f"  where: {summary['where']['text']}")
    else:
        lines.append("incomparable: no step could be compared")
    if summary.get("not_comparable_why"):
        lines.append(f"  steps from {summary['comparable_until']} on not compared: "
                     f"{summary['not_comparable_why']}")
    return "\n".join(lines)


def findings_of(summary: dict) -> list:
    """The verification as findings, for the json/sarif/github renderers."""
    from tpukit.findings import Finding, Location
    from tpukit.rules import load_rules

    rules = load_rules()
    path = summary["script"]
    line_of = (summary.get("sides", {}).get("port", {}) or {}).get("loss_line") or ""
    line = int(line_of.rsplit(":", 1)[1]) if ":" in line_of else 1
    if summary["verdict"] == "diverged":
        where = summary.get("where") or {}
        step = summary["first_divergent_step"]
        if where.get("kind") == "optimizer":
            message = f"the port does not train from step {step}: {where['text']}"
        else:
            message = (f"the port's loss differs from the original's at step {step} (relative "
                       f"difference {summary['rel_diffs'][step]:.2e} > {summary['rtol']:g})"
                       + (f": {where['text']}" if where else ""))
        rule = rules["TPU801"]
    elif summary["verdict"] in ("incomparable", "error"):
        message = summary.get("not_comparable_why") or (
            f"could not run the {summary.get('failed_side')}: {summary.get('error')}")
        rule = rules["TPU802"]
    else:
        return []
    return [Finding.from_rule(rule, Location(path, line, 1), message)]


def run_verify(request: VerifyRequest) -> int:
    import io

    from tpukit.render import Format, Report, render

    summary = verify(request)
    report = Report(command="verify", findings=findings_of(summary), summary=summary,
                    summary_line=render_text(summary).splitlines()[-1])
    if request.json_path is not None:
        buffer = io.StringIO()
        render(report, Format.JSON, buffer, sys.stderr)
        request.json_path.write_text(buffer.getvalue())
    if request.fmt == "text":
        print(render_text(summary))
    else:
        render(report, Format(request.fmt), sys.stdout, sys.stderr)
    if summary["verdict"] == "error":
        return 2
    return EXIT[summary["verdict"]]
