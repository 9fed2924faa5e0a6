"""`tpukit verify`: the original on the CPU, the port on XLA:CPU, every step's loss compared;
a faithful port matches, a changed one diverges at the right step and is located."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest

from tpukit.verify.compare import (SPREAD, UNCOMPARABLE, amplified_from, compare_losses, describe,
                                   explained, gradient_difference, locate, noise_floor,
                                   relative, tolerances)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "fixtures" / "verify" / "train.py"
ATTENTION = ROOT / "fixtures" / "verify" / "attention.py"
DEEP = ROOT / "fixtures" / "verify" / "deep.py"


# -- the comparison, on numbers ---------------------------------------------------------------
def test_a_step_beyond_the_tolerance_is_the_first_divergent_one():
    result = compare_losses([1.0, 0.9, 0.8], [1.0, 0.9, 0.7], 1e-3, [])
    assert (result.verdict, result.first_divergent_step, result.steps_compared) == \
        ("diverged", 2, 3)
    assert result.max_rel_diff == pytest.approx(0.125)


def test_steps_after_device_randomness_are_not_compared_never_called_diverged():
    rng = [{"step": 1, "what": "scaled_dot_product_attention(dropout_p=...)"}]
    result = compare_losses([1.0, 0.9, 0.8], [1.0, 0.5, 0.1], 1e-3, rng)
    assert (result.verdict, result.steps_compared, result.comparable_until) == ("match", 1, 1)
    assert "draws random numbers on its device" in result.not_comparable_why
    nothing = compare_losses([1.0], [2.0], 1e-3, [{"step": 0, "what": "x"}])
    assert nothing.verdict == "incomparable" and nothing.first_divergent_step is None


def test_a_training_that_amplifies_rounding_gets_its_noise_floor_as_tolerance():
    # ResNet-18 at lr 0.1 on random data (pytorch/examples' ImageNet script): a faithful
    # float32 port drifts 1.4e-7, 9.6e-5, 1.6e-3; the original with its weights perturbed by
    # rounding-sized noise drifts as much, so step 2 is within its tolerance
    original, port = [6.81868, 10.08121, 11.43025], [6.81868, 10.08025, 11.44906]
    perturbed = [6.81869, 10.0732, 11.5102]
    steps = tolerances(1e-3, noise_floor(original, perturbed), len(original))
    assert steps[0] == 1e-3 and steps[2] > 5e-3
    assert compare_losses(original, port, steps, []).verdict == "match"
    assert compare_losses(original, port, 1e-3, []).verdict == "diverged"
    # a stable training's floor stays below rtol: a real change still diverges
    assert tolerances(1e-3, noise_floor([1.0, 0.9], [1.0000001, 0.9000002]), 2) == [1e-3, 1e-3]


def test_the_floor_is_an_envelope_with_spread_and_cuts_where_rounding_moves_the_loss_far():
    original = [1.0, 1.0, 1.0, 1.0, 1.0]
    perturbed = [1.0, 1.0 + 2e-4, 1.0 + 1e-5, 1.0 + 3e-3, 1.0 + 2e-2]
    steps = tolerances(1e-3, noise_floor(original, perturbed), len(original))
    # a step whose perturbed loss happens to agree keeps the floor reached before it
    assert steps[2] == pytest.approx(SPREAD * 2e-4 / (1 + 2e-4))
    assert steps[3] == pytest.approx(SPREAD * 3e-3 / (1 + 3e-3))
    assert amplified_from(1e-3, steps) == 4 and steps[4] >= UNCOMPARABLE
    assert amplified_from(0.5, steps) is None  # a tolerance the user set that high is theirs
    result = compare_losses(original, [1.0, 1.0, 1.0, 1.0, 1.5], steps, [],
                            amplified_from(1e-3, steps))
    assert (result.verdict, result.steps_compared, result.comparable_until) == ("match", 4, 4)
    assert "amplifies rounding-sized differences" in result.not_comparable_why


def test_the_gradient_difference_is_estimated_from_random_projections():
    import torch

    generator = torch.Generator().manual_seed(0)
    shapes = [(64, 32), (32,), (10, 64)]
    grads = [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]
    noisy = [g + 1e-2 * g.abs().mean() * torch.randn(s, generator=generator, dtype=torch.float64)
             for g, s in zip(grads, shapes)]
    true = math.sqrt(sum(float((a - b).pow(2).sum()) for a, b in zip(grads, noisy))
                     / sum(float(g.pow(2).sum()) for g in grads))

    def probe(tensors, seed=3, projections=64):
        directions = torch.Generator().manual_seed(seed)
        rows = []
        for t in tensors:
            flat = t.reshape(-1)
            rows.append([flat.numel(), float(flat.pow(2).sum())] + [
                float((flat * torch.randn(flat.shape, generator=directions,
                                          dtype=torch.float64)).sum())
                for _ in range(projections)])
        return rows

    assert gradient_difference(probe(grads), probe(noisy)) == pytest.approx(true, rel=0.2)
    assert gradient_difference(probe(grads), probe(grads)) == 0.0
    # other parameters on the two sides: no estimate
    assert gradient_difference(probe(grads), probe(grads[:2])) is None
    assert gradient_difference(probe(grads), probe([grads[0], grads[2], grads[1]])) is None


def test_a_gradient_difference_is_explained_at_the_scale_rounding_moves_the_gradients():
    assert explained(3.6e-5, 1.2e-4, 1e-3)  # within the tolerance, whatever the model
    # a well-conditioned model's gradients 1% off: scaled or clipped otherwise
    assert explained(1e-2, 1.2e-4, 1e-3) is False
    # SimpleDLA's: a 1e-6 change of the weights moves them 1.8e-2, XLA's kernels 7.2e-2
    assert explained(7.2e-2, 1.8e-2, 1e-3)
    assert explained(0.5, 1.8e-2, 1e-3) is False
    assert explained(1e-2, None, 1e-3) is None and explained(None, 1e-2, 1e-3) is None


def test_nan_on_both_sides_agrees_and_on_one_does_not():
    assert relative(float("nan"), float("nan")) == 0.0
    assert relative(1.0, float("nan")) == float("inf")


def test_the_place_is_the_update_before_then_the_first_module_then_the_loss():
    calls = [{"module": "fc1", "norm": 2.0}, {"module": "fc2", "norm": 3.0}]
    same = {"calls": calls, "gradient_norm": 1.0, "update_norm": 0.1, "loss_line": "t.py:9"}
    assert locate(2, same, {**same, "update_norm": 0.2}, 1e-3)["kind"] == "update"
    assert locate(2, same, {**same, "gradient_norm": 2.0}, 1e-3)["kind"] == "gradient"
    moved = locate(0, same, {**same, "calls": [calls[0], {"module": "fc2", "norm": 4.0}]}, 1e-3)
    assert (moved["kind"], moved["module"]) == ("module", "fc2")
    loss = locate(0, same, dict(same), 1e-3)
    assert loss["kind"] == "loss" and "t.py:9" in describe(loss)


# -- whole runs on XLA:CPU --------------------------------------------------------------------
def _port(tmp_path: Path, run_cli, edit=None) -> Path:
    port = tmp_path / "port.py"
    shutil.copy(SCRIPT, port)
    run_cli("migrate", "-q", str(port), check_rc=None)
    if edit is not None:
        text = port.read_text()
        old, new = edit
        assert old in text
        port.write_text(text.replace(old, new))
    return port


def _verify(run_cli, tmp_path: Path, *args, rc: int) -> dict:
    out = tmp_path / "verify.json"
    run_cli("verify", "--json", str(out), *args, check_rc=rc, cwd=tmp_path)
    return json.loads(out.read_text())["summary"]


@pytest.mark.xla
def test_a_faithful_port_matches_step_by_step(tmp_path, run_cli):
    summary = _verify(run_cli, tmp_path, str(SCRIPT), "--steps", "4", "--", "--dropout", "0.3",
                      rc=0)
    assert summary["verdict"] == "match" and summary["steps_compared"] == 4
    assert summary["first_divergent_step"] is None and summary["max_rel_diff"] < 1e-5
    assert len(summary["losses"]["original"]) == len(summary["losses"]["port"]) == 4
    assert summary["sides"]["port"]["devices"] == ["xla"]
    assert summary["sides"]["original"]["devices"] == ["cpu"]


RESEEDING = """\
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Reseeding(Dataset):
    # torchvision's FakeData: each item drawn under a seed of its own, the global state restored
    def __len__(self):
        return 64

    def __getitem__(self, i):
        state = torch.get_rng_state()
        torch.manual_seed(1000 + i)
        x = torch.randn(4)
        time.sleep(0.05)
        torch.set_rng_state(state)
        return x


torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in DataLoader(Reseeding(), batch_size=2):
    x = x.to(device)
    noise = torch.randn(2, 4, device=device)
    loss = (model(x + noise) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.xla
def test_a_loader_that_reseeds_the_global_generator_does_not_race_the_steps_draws(
        tmp_path, run_cli):
    """examples-dcgan (FakeData) diverged in 1 run of 6: the port's MpDeviceLoader loaded its
    images in a thread that reseeds torch's global generator per image, while the step drew its
    noise from that generator (verify draws the device's randomness on the host, as the
    original does). The port's loader reads its batches in the script's thread under verify:
    the same batches and noise as the original's, every run (before: diverged at step 1)."""
    script = tmp_path / "train.py"
    script.write_text(RESEEDING)
    summary = _verify(run_cli, tmp_path, str(script), "--steps", "6", rc=0)
    assert summary["verdict"] == "match" and summary["steps_compared"] == 6
    assert summary["max_rel_diff"] < 1e-5


@pytest.mark.xla
def test_a_grad_scalers_scaled_loss_counts_as_the_loss_it_scaled(tmp_path, run_cli):
    # on a CPU host with torch_xla installed the original's CUDA GradScaler is on (it scales
    # by 65536); the port has none: the losses compared are the unscaled ones
    summary = _verify(run_cli, tmp_path, str(SCRIPT), "--steps", "3", "--", "--scaler", rc=0)
    assert summary["verdict"] == "match" and summary["losses"]["original"][0] < 10


@pytest.mark.xla
def test_a_bfloat16_port_is_compared_with_the_bfloat16_tolerance(tmp_path, run_cli):
    # the original's CUDA autocast is off on the CPU (float32); the port's is bfloat16 on XLA
    summary = _verify(run_cli, tmp_path, str(SCRIPT), "--steps", "3", "--", "--amp", rc=0)
    assert summary["sides"]["port"]["low_precision"] == ["bfloat16"]
    assert summary["sides"]["original"]["low_precision"] == []
    assert summary["rtol"] == 5e-2 and "bfloat16" in summary["rtol_basis"]


@pytest.mark.xla
def test_the_autocast_of_a_forward_given_a_list_of_tensors_is_seen(tmp_path, run_cli):
    # DINO's student takes a list of crops: its autocast is the XLA device's, not the CPU's
    # (verify said "both compute in float32" of its bfloat16 port)
    summary = _verify(run_cli, tmp_path, str(SCRIPT), "--steps", "3", "--", "--amp", "--crops",
                      rc=0)
    assert summary["sides"]["port"]["low_precision"] == ["bfloat16"]
    assert "bfloat16" in summary["rtol_basis"]
    assert 1e-6 < summary["max_rel_diff"] < 5e-2


@pytest.mark.xla
@pytest.mark.parametrize("edit,step,kind", [
    (("lr=args.lr,", "lr=args.lr * 2,"), 1, "update"),
    (("    optimizer.zero_grad()\n", "    pass\n"), 2, "gradient"),
    (("nn.CrossEntropyLoss()", 'nn.CrossEntropyLoss(reduction="sum")'), 0, "module"),
    (("x, y = data[step]", "x, y = data[-1 - step]"), 0, "inputs"),
], ids=["learning-rate", "no-zero-grad", "loss-reduction", "other-batches"])
def test_a_changed_port_diverges_at_its_step_and_is_located(tmp_path, run_cli, edit, step, kind):
    port = _port(tmp_path, run_cli, edit)
    summary = _verify(run_cli, tmp_path, str(SCRIPT), "--port", str(port), "--steps", "4", rc=1)
    assert summary["verdict"] == "diverged" and summary["first_divergent_step"] == step
    assert summary["where"]["kind"] == kind
    if kind == "module":
        assert summary["where"]["module"] == "CrossEntropyLoss"


@pytest.mark.xla
def test_an_original_that_only_runs_on_cuda_is_the_reference_on_the_cpu(tmp_path, run_cli):
    """An original that puts everything on CUDA unconditionally runs on the CPU through the
    runtime layer (`--to cpu`): without it, CUDA's driver error, and nothing to compare."""
    original = tmp_path / "cuda_only.py"
    text = SCRIPT.read_text()
    guarded = 'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")'
    assert guarded in text
    original.write_text(text.replace(guarded, 'device = torch.device("cuda")'))
    summary = _verify(run_cli, tmp_path, str(original), "--steps", "3", rc=0)
    assert summary["verdict"] == "match" and summary["steps_compared"] == 3
    assert summary["sides"]["original"]["devices"] == ["cpu"]
    assert summary["sides"]["port"]["devices"] == ["xla"]


@pytest.mark.xla
def test_dropout_the_port_draws_on_its_device_is_not_comparable(tmp_path, run_cli):
    summary = _verify(run_cli, tmp_path, str(ATTENTION), "--steps", "3", rc=3)
    assert summary["verdict"] == "incomparable" and summary["first_divergent_step"] is None
    assert "scaled_dot_product_attention" in summary["not_comparable_why"]


@pytest.mark.xla
def test_a_side_that_cannot_run_is_named_with_its_error(tmp_path, run_cli):
    broken = _port(tmp_path, run_cli, ("criterion = nn.CrossEntropyLoss()",
                                       "criterion = nn.CrossEntropyLoss(\n    )\n"
                                       "raise RuntimeError('no such kernel')"))
    proc = run_cli("verify", str(SCRIPT), "--port", str(broken), "--steps", "2", check_rc=2,
                   cwd=tmp_path)
    assert re.search(r"could not run the port: RuntimeError: no such kernel", proc.stdout)


def test_a_missing_script_is_one_line_and_exit_2(tmp_path, run_cli):
    proc = run_cli("verify", str(tmp_path / "nope.py"), check_rc=2, cwd=tmp_path)
    assert proc.stderr.strip().endswith("nope.py: no such file")
    assert "Traceback" not in proc.stderr


OK_RUN = {"outcome": "max-steps", "losses": [1.0, 1.0], "low_precision": []}


def _diverged_at_step_1(tmp_path, monkeypatch, located_runs) -> dict:
    """verify's summary where the comparison's port diverges at step 1 (1.5 against 1.0) and
    the runs that locate it give `located_runs()` (original, port): no script runs."""
    from tpukit.verify import command

    script = tmp_path / "t.py"
    script.write_text("pass\n")

    def both(request, script, port, work, steps, locate_step=None):
        if locate_step is None:
            return dict(OK_RUN), {**OK_RUN, "losses": [1.0, 1.5]}
        return located_runs()

    monkeypatch.setattr(command, "_both", both)
    monkeypatch.setattr(command, "_finish", lambda *a, **k: dict(OK_RUN))
    monkeypatch.setattr(command, "_start", lambda *a, **k: None)
    summary = command.verify(command.VerifyRequest(script=script, port=script, steps=2))
    assert summary["verdict"] == "diverged" and summary["first_divergent_step"] == 1
    return summary["where"]


def test_a_locating_run_that_fails_is_said_never_a_silent_null(tmp_path, monkeypatch):
    """The run that records the divergent step's modules can fail where the comparison ran
    (a hook on a module, a timeout): the summary says which side and why."""
    where = _diverged_at_step_1(tmp_path, monkeypatch, lambda: (
        dict(OK_RUN), {"outcome": "error", "error": "RuntimeError: hook", "losses": []}))
    assert (where["kind"], where["side"], where["error"]) == ("unlocated", "port",
                                                               "RuntimeError: hook")
    assert "not located" in where["text"] and "port" in where["text"]


@pytest.mark.parametrize("rerun_port, moved", [(1.0, ["port"]), (1.5, None)])
def test_a_divergence_the_locating_run_does_not_repeat_is_said_to_vary_between_runs(
        tmp_path, monkeypatch, rerun_port, moved):
    """examples-dcgan diverged at step 2 in 1 of 6 runs: every module's output agreed in the
    run that located it, which said "the loss differs", of losses that agreed there. Where the
    rerun's losses agree at the step, the difference did not repeat: said so, with the side
    whose loss changed between its two runs. Where they still differ, the loss is named."""
    located = {**OK_RUN, "calls": [{"module": "Net", "norm": 2.0}], "loss_line": "t.py:9"}
    where = _diverged_at_step_1(tmp_path, monkeypatch, lambda: (
        dict(located), {**located, "losses": [1.0, rerun_port]}))
    if moved is None:
        assert where["kind"] == "loss" and "t.py:9" in where["text"]
        return
    assert (where["kind"], where["moved"]) == ("unreproduced", moved)
    assert where["losses"]["port"] == [1.5, 1.0]
    assert "not when both sides ran again" in where["text"]
    assert "the port's went from 1.5 to 1" in where["text"]


def test_the_ports_pythonpath_names_its_own_tree():
    from tpukit.verify.command import port_pythonpath

    original, port = Path("/r/orig/projects/gpt/train.py"), Path("/w/port/projects/gpt/train.py")
    mapped = port_pythonpath(original, port, os.pathsep.join(["/r/orig", "/r/orig/lib", "/deps", ""]))
    assert mapped.split(os.pathsep) == ["/w/port", "/w/port/lib", "/deps", ""]
    # scripts that share no tail (another name): nothing to align, nothing mapped
    assert port_pythonpath(original, Path("/w/port.py"), "/r/orig") == "/r/orig"


@pytest.mark.xla
def test_each_side_imports_its_own_package_from_pythonpath(tmp_path, run_cli):
    """A repository's own package on PYTHONPATH (minGPT's layout): the port's side imports the
    port's copy. Here the port's copy doubles the learning rate: diverged at step 1, which a
    port that imported the original's package would have called a match."""
    text = SCRIPT.read_text().replace("import torch\n", "import torch\nimport hp\n", 1)
    text = text.replace("lr=args.lr,", "lr=hp.LR,")
    for tree, lr in (("orig", "0.1"), ("port", "0.2")):
        (tmp_path / tree / "proj").mkdir(parents=True)
        (tmp_path / tree / "lib").mkdir()
        (tmp_path / tree / "lib" / "hp.py").write_text(f"LR = {lr}\n")
        (tmp_path / tree / "proj" / "train.py").write_text(text)
    run_cli("migrate", "-q", str(tmp_path / "port" / "proj" / "train.py"), check_rc=None)
    out = tmp_path / "verify.json"
    run_cli("verify", "--json", str(out), "--port", str(tmp_path / "port" / "proj" / "train.py"),
            "--steps", "3", str(tmp_path / "orig" / "proj" / "train.py"), check_rc=1,
            cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "orig" / "lib")})
    summary = json.loads(out.read_text())["summary"]
    assert summary["verdict"] == "diverged" and summary["first_divergent_step"] == 1


@pytest.mark.xla
def test_rounding_a_training_amplifies_is_never_called_diverged(tmp_path, run_cli):
    """A faithful port of a training that amplifies rounding ~30x a step: with its floor
    perturbed at the first update only, and compared to the floor itself, verify said
    "diverged" at step 3 (one draw of noise against another). Now: matched up to where
    rounding alone moves the loss beyond comparison, and said so."""
    summary = _verify(run_cli, tmp_path, str(DEEP), "--steps", "6", "--", "--lr", "0.5", rc=0)
    assert summary["verdict"] == "match"
    assert 1e-7 < summary["gradient_difference"] < 1e-3 and summary["gradient_explained"]
    assert 1 <= summary["steps_compared"] < 6
    assert summary["comparable_until"] == summary["steps_compared"]
    assert "amplifies rounding-sized differences" in summary["not_comparable_why"]


@pytest.mark.xla
@pytest.mark.parametrize("edit,kind", [
    (("lr=args.lr,", "lr=args.lr * 1.1,"), "update"),
    (("    loss.backward()\n",
      "    loss.backward()\n    for p in model.parameters():\n        p.grad.mul_(1.01)\n"),
     "gradient"),
], ids=["learning-rate", "scaled-gradients"])
def test_a_wrong_port_of_an_amplifying_training_still_diverges(tmp_path, run_cli, edit, kind):
    port = tmp_path / "port.py"
    shutil.copy(DEEP, port)
    run_cli("migrate", "-q", str(port), check_rc=None)
    text = port.read_text()
    assert edit[0] in text
    port.write_text(text.replace(edit[0], edit[1]))
    summary = _verify(run_cli, tmp_path, str(DEEP), "--port", str(port), "--steps", "4", "--",
                      "--lr", "0.5", rc=1)
    assert summary["verdict"] == "diverged" and summary["first_divergent_step"] == 1
    assert summary["where"]["kind"] == kind
    if kind == "gradient":  # a gradient 1% off is more than rounding explains: said
        assert summary["gradient_difference"] == pytest.approx(1e-2, rel=0.3)
        assert summary["gradient_explained"] is False
    else:
        assert summary["gradient_explained"]
