"""The differential corpus's manifest and the harness's pure logic (loss reading and comparison,
error lines, the table), without torch, mirrors or a run."""

from __future__ import annotations

import importlib.util
import re
import struct
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("real_scripts", ROOT / "benchmarks" / "real_scripts.py")
real_scripts = importlib.util.module_from_spec(_spec)
sys.modules["real_scripts"] = real_scripts
_spec.loader.exec_module(real_scripts)

ENTRIES = real_scripts.load_manifest()


def test_manifest_has_at_least_15_scripts_from_8_repositories():
    assert len({(e["repo"], e["path"]) for e in ENTRIES}) >= 15
    assert len({e["repo"] for e in ENTRIES}) >= 8


def test_names_are_unique():
    names = [e["name"] for e in ENTRIES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["name"])
def test_entry_is_complete(entry):
    assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"])
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry["repo"])
    assert entry["path"].endswith(".py") and not entry["path"].startswith("/")
    assert entry.get("data", "none") in real_scripts.RECIPES
    steps = entry.get("steps", 0)
    assert 0 <= entry.get("compare", steps) <= steps
    if steps:
        assert re.compile(entry["loss"]).groups >= 1, "the loss regex needs a group"
    if entry.get("stop_original"):
        assert steps > 0, "the original is ended after `steps` printed losses"
    if entry.get("compare", steps) < steps:
        assert entry.get("device_rng"), "say why fewer losses are compared"
    for key in ("args", "original_args", "port_args", "tree", "migrate", "pythonpath"):
        assert all(isinstance(x, str) for x in entry.get(key, []))
    for name, text in entry.get("files", {}).items():
        assert not Path(name).is_absolute() and ".." not in Path(name).parts
        assert isinstance(text, str) and text.strip()
    assert re.fullmatch(r"[\w-]+", entry.get("site", "shared")), "a site is a --site NAME"


def test_sft_jsonl_recipe_writes_conversations(tmp_path):
    import json
    real_scripts.make_sft_jsonl(tmp_path / "trainer", {"data_file": "../dataset/d.jsonl",
                                                      "data_size": 3})
    rows = [json.loads(line) for line in (tmp_path / "dataset" / "d.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    assert [t["role"] for t in rows[0]["conversations"]] == ["user", "assistant"]


def test_wave_feats_recipe_writes_matching_waves_and_features(tmp_path):
    np = pytest.importorskip("numpy")
    real_scripts.make_wave_feats(tmp_path, {"data_dir": "dump", "data_size": 2, "hop": 4,
                                            "frames": 5, "mels": 3})
    for split in ("train", "dev"):
        wave = np.load(tmp_path / "dump" / split / "utt001-wave.npy")
        feats = np.load(tmp_path / "dump" / split / "utt001-feats.npy")
        assert wave.dtype == np.float32 and wave.shape == (20,) and feats.shape == (5, 3)


def test_compare_losses_within_tolerance():
    assert real_scripts.compare_losses([2.30, 1.50], [2.31, 1.52], 2)[0] == "ok"


def test_compare_losses_names_the_step_that_differs():
    verdict, detail = real_scripts.compare_losses([2.30, 1.50, 1.0], [2.30, 1.50, 1.2], 3)
    assert verdict == "differ" and detail.startswith("step 3: 1 vs 1.2")


def test_compare_losses_counts_nan_as_a_difference():
    assert real_scripts.compare_losses([2.3], [float("nan")], 1)[0] == "differ"


def test_compare_losses_without_a_reference_is_not_a_verdict():
    assert real_scripts.compare_losses([2.3], [2.3, 1.0], 2)[0] == "n/a"
    assert real_scripts.compare_losses([], [], 0)[0] == "n/a"


def test_a_port_that_printed_too_few_losses_differs():
    assert real_scripts.compare_losses([2.3, 2.0], [2.3], 2) == ("differ", "port printed 1 of 2 losses")


def test_read_losses_takes_the_first_group_in_order():
    text = "Train Epoch: 1 [0/512]\tLoss: 2.311427\nTest set: Average loss: 0.1\nTrain Epoch: 1 [64/512]\tLoss: 1.6\n"
    assert real_scripts.read_losses(text, r"Train Epoch: .*Loss: ([0-9.]+)") == [2.311427, 1.6]
    assert real_scripts.read_losses("Loss 6.9116e+00 (6.9e+00)", r"Loss\s+([0-9.]+e[+-]\d+)\s+\(") == [6.9116]


def test_first_error_gives_the_exception_and_the_innermost_frame_in_the_tree(tmp_path):
    text = (f"Traceback (most recent call last):\n"
            f'  File "{tmp_path}/gan.py", line 129, in <module>\n'
            f"    real_imgs = Variable(imgs.type(Tensor))\n"
            f'  File "/usr/lib/python3/site-packages/torch/x.py", line 3, in f\n'
            f"    raise\n"
            f"RuntimeError: Found no NVIDIA driver on your system.\n")
    assert real_scripts.first_error(text, tmp_path) == (
        "RuntimeError: Found no NVIDIA driver on your system.", "gan.py:129")


def _result(**kw):
    r = real_scripts.Result(name=kw.pop("name", "s"), repo=kw.pop("repo", "o/r"), path="s.py")
    for key, value in kw.items():
        setattr(r, key, value)
    return r


def test_table_row_of_a_failing_port_gives_the_reason():
    run = real_scripts.Run(status="failed", exit_code=1, error="TypeError: bad", where="s.py:3")
    r = _result(parses=True, idioms_left=2, migrated=run, original=real_scripts.Run(status="ok"))
    r.reason = real_scripts.reason_of(r)
    row = real_scripts.table_rows([r])[0]
    assert row[:6] == ("s", "yes", "yes", "2", "ok", "no")
    assert row[-1] == "port failed: TypeError: bad [s.py:3]"


def test_a_port_that_ran_where_its_original_failed_says_why_the_original_did():
    # pytorch/examples' DDP demo divides the host's GPU count: 0 on a CPU host, an empty list
    original = real_scripts.Run(status="failed", error="IndexError: list index out of range")
    r = _result(parses=True, idioms_left=0, migrated=real_scripts.Run(status="ok"),
                original=original)
    assert real_scripts.reason_of(r) == (
        "original failed on this CPU host: IndexError: list index out of range")


def test_a_script_that_needs_an_edit_is_not_counted_as_run():
    r = _result(needs_edit="hard-coded sizes", parses=True, idioms_left=0)
    r.reason = real_scripts.reason_of(r)
    row = real_scripts.table_rows([r])[0]
    assert row[1] == "no" and row[5] == "-" and row[-1] == "needs edit: hard-coded sizes"
    ok = _result(name="t", repo="o/q", parses=True, idioms_left=0, loss="ok",
                 migrated=real_scripts.Run(status="ok"))
    failed = _result(name="u", repo="o/q", parses=True, idioms_left=0,
                     migrated=real_scripts.Run(status="failed"))
    line = real_scripts.summary_line([r, ok, failed])
    assert "3 scripts from 2 repositories; 1/2 runnable ports ran to their end with no edit (50%)" in line
    assert "1 checked only (needs an edit to run); 1/3 of all entries (33%)" in line
    assert "1/1 compared" in line


def test_render_table_aligns_columns():
    rows = [_result(name=n, parses=True, idioms_left=0) for n in ("a", "longer-name")]
    lines = real_scripts.render_table(rows).splitlines()
    assert lines[0].startswith("script      ") and set(lines[1]) == {"-"}
    assert lines[2].index("yes") == lines[3].index("yes")


def test_mnist_recipe_writes_idx_files_torchvision_reads(tmp_path):
    cwd = tmp_path / "mnist"
    real_scripts.make_mnist(cwd, {"data_dir": "../data", "data_size": 3, "test_size": 2})
    raw = tmp_path / "data" / "MNIST" / "raw"
    images = (raw / "train-images-idx3-ubyte").read_bytes()
    assert images[:4] == b"\0\0\x08\x03" and struct.unpack(">III", images[4:16]) == (3, 28, 28)
    assert len(images) == 16 + 3 * 28 * 28
    labels = (raw / "t10k-labels-idx1-ubyte").read_bytes()
    assert len(labels) == 8 + 2 and max(labels[8:]) < 10


def test_image_folder_recipe_writes_valid_pngs(tmp_path):
    real_scripts.make_image_folder(tmp_path, {"data_dir": "d", "data_size": 1, "image_size": 4})
    png = (tmp_path / "d" / "train" / "a" / "0.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png.endswith(b"IEND\xaeB`\x82")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["train", "validation"]


def test_first_error_resolves_a_frame_relative_to_the_working_folder(tmp_path):
    text = ('Traceback (most recent call last):\n  File "main.py", line 93, in <module>\n'
            "    model.share_memory()\nRuntimeError: _share_fd_: only available on CPU\n")
    assert real_scripts.first_error(text, tmp_path, tmp_path / "mnist_hogwild") == (
        "RuntimeError: _share_fd_: only available on CPU", "mnist_hogwild/main.py:93")


def test_idiom_codes_leave_out_performance_hazards():
    idiom = real_scripts.IDIOM_CODE.match
    assert idiom("TPU117") and idiom("TPU104") and idiom("TPU414") and idiom("TPU901")
    assert not idiom("TPU302") and not idiom("TPU501") and not idiom("TPU703")


def test_first_error_names_an_abort_at_exit():
    text = "run: 101 step(s) (stopped by --max-steps)\nterminate called without an active exception\n"
    assert real_scripts.first_error(text)[0] == "terminate called without an active exception"


def test_cifar10_recipe_writes_the_pickled_batches_torchvision_reads(tmp_path):
    import pickle

    np = pytest.importorskip("numpy")
    real_scripts.make_cifar10(tmp_path, {"data_dir": "data", "data_size": 10, "test_size": 3})
    folder = tmp_path / "data" / "cifar-10-batches-py"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["batches.meta", "data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                     "data_batch_5", "test_batch"]
    # as torchvision.datasets.CIFAR10 reads them
    data, labels = [], []
    for name in names[1:6]:
        with open(folder / name, "rb") as f:
            entry = pickle.load(f, encoding="latin1")
        data.append(entry["data"])
        labels += entry["labels"]
    images = np.vstack(data).reshape(-1, 3, 32, 32)
    assert images.shape == (10, 3, 32, 32) and images.dtype == np.uint8
    assert len(labels) == 10 and all(0 <= c < 10 for c in labels)
    with open(folder / "batches.meta", "rb") as f:
        assert len(pickle.load(f, encoding="latin1")["label_names"]) == 10


def test_offline_shims_are_for_known_recipes_and_compile():
    for recipe, code in real_scripts.OFFLINE_SHIMS.items():
        assert recipe in real_scripts.RECIPES
        compile(real_scripts.SITECUSTOMIZE + code, f"<shim {recipe}>", "exec")


def test_a_terminal_stdin_answers_stty_size(tmp_path):
    log = tmp_path / "log"
    code, status, _ = real_scripts.run_process(["stty", "size"], tmp_path, {"PATH": "/usr/bin:/bin"},
                                               log, timeout=20, terminal=True)
    assert (code, status) == (0, "ok") and log.read_text().split() == ["24", "120"]
    code, _, _ = real_scripts.run_process(["stty", "size"], tmp_path, {"PATH": "/usr/bin:/bin"},
                                          log, timeout=20)
    assert code != 0   # without it, stdin is /dev/null: not a terminal


def test_the_verify_column_says_verdict_steps_and_difference():
    r = _result(parses=True, idioms_left=0, migrated=real_scripts.Run(status="ok"),
                verdict="match", verify_steps=3, verify_max_rel=2.1e-7)
    assert real_scripts.table_rows([r])[0][-2] == "match 3 (2.1e-07)"
    d = _result(parses=True, idioms_left=0, migrated=real_scripts.Run(status="ok"),
                verdict="diverged", verify_steps=3, verify_max_rel=0.2,
                verify_detail="step 1: the optimizer differs")
    assert real_scripts.reason_of(d) == "verify: diverged at step 1: the optimizer differs"
    assert "tpukit verify: 1/2 match" in real_scripts.summary_line([r, d])


def test_image_masks_recipe_writes_rgb_images_and_grayscale_masks(tmp_path):
    # milesial's U-Net reads N.png and N_mask.png (its mask values: the unique gray levels)
    real_scripts.make_image_masks(tmp_path, {"data_size": 2, "image_size": 8})
    image = (tmp_path / "data" / "imgs" / "0.png").read_bytes()
    mask = (tmp_path / "data" / "masks" / "0_mask.png").read_bytes()
    # IHDR: width, height, bit depth 8, colour type 2 (RGB) for the image, 0 (gray) for the mask
    assert struct.unpack(">IIBB", image[16:26]) == (8, 8, 8, 2)
    assert struct.unpack(">IIBB", mask[16:26]) == (8, 8, 8, 0)
    assert sorted(p.name for p in (tmp_path / "data" / "masks").iterdir()) == ["0_mask.png", "1_mask.png"]


def test_a_torch_hub_repository_is_laid_out_as_torch_hubs_cache(tmp_path, monkeypatch):
    # DINO's parser calls torch.hub.list("facebookresearch/xcit:main"): a cached repository
    # is read from TORCH_HOME/hub/OWNER_NAME_REF without the network
    calls = []
    monkeypatch.setattr(real_scripts, "extract", lambda mirrors, entry, dest: calls.append(
        (entry["repo"], entry["commit"], dest)))
    real_scripts.make_hub_cache(tmp_path / "mirrors", {"torch_hub": [
        {"repo": "facebookresearch/xcit", "commit": "a" * 40, "ref": "main"}]}, tmp_path / "home")
    assert calls == [("facebookresearch/xcit", "a" * 40,
                      tmp_path / "home" / "hub" / "facebookresearch_xcit_main")]
    hubs = [h for e in ENTRIES for h in e.get("torch_hub", [])]
    assert hubs and all(re.fullmatch(r"[0-9a-f]{40}", h["commit"]) for h in hubs)
