"""A differential test corpus: public CUDA training scripts, run as they are on the CPU and, after
`tpukit migrate`, on XLA:CPU through `tpukit run`, with their printed losses compared.

The scripts are listed in benchmarks/corpus/real_scripts.toml (repo, commit, path, arguments,
data recipe, steps, the regex that reads the script's own printed loss). None of their code is
kept here: each run reads the repository from a bare mirror at the pinned commit
(`git archive`) into a temporary folder. A mirror of owner/name is MIRRORS/owner+name/repo.

    PYTHONPATH=. .venv/bin/python benchmarks/real_scripts.py --site DEPS [--only NAME] [--json OUT]

DEPS is a folder with the scripts' own dependencies that tpukit's venv lacks, e.g.
`pip install --no-deps --target DEPS torchvision==0.24.0 pillow tqdm`. Nothing in a script is
edited: data is made by the harness (tiny, offline), everything else is command-line arguments
and environment. A script that cannot run without an edit says so in the manifest
(`needs_edit`) and is still migrated and checked, not run.

Per script, one row: the port needed no hand edit, every migrated file compiles, CUDA idioms
left (a `tpukit migrate --check` of the migrated files), the original on the CPU
(`CUDA_VISIBLE_DEVICES=""`), the port ran to its end (exit 0, or `--max-steps` reached),
compilations after warm-up (from the run's JSON report), the first N printed losses against
the original's (relative tolerance, bf16), `tpukit verify` of the original against the port
(verdict, steps compared, max relative difference: each step's loss read from the tensor whose
backward() runs, not from printed text; `verify_steps` in the manifest, default 3), and the
first error line of a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
import zlib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "benchmarks" / "corpus" / "real_scripts.toml"
# The tpukit the runs import (first on their PYTHONPATH): this checkout's, or --tpukit's (a
# worktree of an earlier commit, for the table of before and after, benchmarks/proof_table.py)
CODE_ROOT = ROOT
LOSS_RTOL = 0.05
# Codes of findings that are CUDA idioms: not the performance hazards (TPU302 ragged last batch,
# TPU5xx host syncs and shapes) nor run-time findings (TPU70x).
IDIOM_CODE = re.compile(r"TPU(?!302)[12349]\d\d$")
ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(?:\w*Error|\w*Exception|KeyboardInterrupt|SystemExit|"
                        r"AssertionError|StopIteration)\b.*")
FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)')


# ----------------------------------------------------------------------------- data recipes
# Each recipe makes tiny local data, deterministic, relative to the script's working folder.

def _rng(entry: dict) -> random.Random:
    return random.Random(entry.get("data_seed", 0))


def _write_idx(path: Path, dims: tuple[int, ...], data: bytes) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, len(dims)) + struct.pack(">" + "I" * len(dims), *dims)
    path.write_bytes(header + data)


def _digits(rng: random.Random, n: int) -> tuple[bytes, bytes]:
    """n 28x28 images, each a bright bar whose position is its class, over noise; 40% of the
    labels are random, so that the loss stays well above 0 (a printed loss keeps its digits)."""
    classes = [rng.randrange(10) for _ in range(n)]
    labels = bytes(c if rng.random() < 0.6 else rng.randrange(10) for c in classes)
    images = bytearray()
    for c in classes:
        for row in range(28):
            for col in range(28):
                bar = 2 + 2 * c <= col < 4 + 2 * c
                images.append(min(255, (200 if bar else 0) + rng.randrange(56)))
    return bytes(images), labels


def make_mnist(cwd: Path, entry: dict) -> None:
    """torchvision's MNIST raw files (checked for existence only, not for their MD5)."""
    raw = cwd / entry.get("data_dir", "../data") / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = _rng(entry)
    for prefix, n in (("train", entry.get("data_size", 512)), ("t10k", entry.get("test_size", 128))):
        images, labels = _digits(rng, n)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", (n, 28, 28), images)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", (n,), labels)


def _words(rng: random.Random, n: int) -> list[str]:
    vocab = [f"w{i}" for i in range(40)]
    words, last = [], 0
    for _ in range(n):  # a little structure, so that a language model has something to learn
        last = (last + rng.choice((1, 1, 2, 3, 7))) % len(vocab)
        words.append(vocab[last])
    return words


def _lines(words: list[str], width: int = 12) -> str:
    return "\n".join(" " + " ".join(words[i:i + width]) + " " for i in range(0, len(words), width)) + "\n"


def make_wikitext(cwd: Path, entry: dict) -> None:
    """train.txt, valid.txt, test.txt as word_language_model's Corpus reads them."""
    folder = cwd / entry.get("data_dir", "data/wikitext-2")
    folder.mkdir(parents=True, exist_ok=True)
    rng = _rng(entry)
    size = entry.get("data_size", 800)
    for name, n in (("train.txt", size), ("valid.txt", size // 4), ("test.txt", size // 4)):
        (folder / name).write_text(_lines(_words(rng, n)))


def make_text_file(cwd: Path, entry: dict) -> None:
    """One plain text file of words (a character or word language model's corpus), after
    `data_prefix` (text the script looks up, such as a sampling prompt's characters)."""
    path = cwd / entry["data_file"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(entry.get("data_prefix", "") + _lines(_words(_rng(entry), entry.get("data_size", 2000))))


def make_nanogpt_bins(cwd: Path, entry: dict) -> None:
    """nanoGPT's data/DATASET/{train,val}.bin (uint16 token ids) and meta.pkl (vocab size)."""
    import pickle

    folder = cwd / entry.get("data_dir", "data/shakespeare_char")
    folder.mkdir(parents=True, exist_ok=True)
    rng = _rng(entry)
    vocab = 65
    text = "".join(_lines(_words(rng, entry.get("data_size", 4000))))
    chars = sorted(set(text))
    ids = [chars.index(c) for c in text]
    cut = len(ids) * 9 // 10
    for name, part in (("train.bin", ids[:cut]), ("val.bin", ids[cut:])):
        (folder / name).write_bytes(struct.pack(f"<{len(part)}H", *part))
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": vocab, "itos": dict(enumerate(chars)),
                     "stoi": {c: i for i, c in enumerate(chars)}}, f)


def _png(path: Path, width: int, height: int, pixel, gray: bool = False) -> None:
    """An 8-bit PNG: `pixel(x, y)` gives (r, g, b), or (v,) where `gray`."""
    rows = b"".join(b"\x00" + bytes(v for x in range(width) for v in pixel(x, y)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0 if gray else 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def make_image_folder(cwd: Path, entry: dict) -> None:
    """An ImageFolder tree: SPLIT/CLASS/N.png for each split, small RGB images."""
    root = cwd / entry.get("data_dir", "data/images")
    rng = _rng(entry)
    size = entry.get("image_size", 64)
    for split in entry.get("splits", ["train", "validation"]):
        for label, cls in enumerate(entry.get("classes", ["a", "b"])):
            folder = root / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(entry.get("data_size", 8)):
                seed = rng.randrange(256)
                _png(folder / f"{i}.png", size, size,
                     lambda x, y: ((x * 4 + seed) % 256, (y * 4 * (label + 1)) % 256, (x + y + seed) % 256))


def make_image_masks(cwd: Path, entry: dict) -> None:
    """A segmentation set: IMAGES/N.png (RGB) and MASKS/N_mask.png (grayscale, 0 or 255), the
    mask a square the image draws brighter, so the masks can be learned (`data_dir` IMAGES,
    `mask_dir` MASKS)."""
    images = cwd / entry.get("data_dir", "data/imgs")
    masks = cwd / entry.get("mask_dir", "data/masks")
    images.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    rng = _rng(entry)
    size = entry.get("image_size", 64)
    for i in range(entry.get("data_size", 8)):
        x0, y0, side = rng.randrange(size // 2), rng.randrange(size // 2), size // 4 + rng.randrange(size // 4)
        seed = rng.randrange(256)

        def inside(x: int, y: int) -> bool:
            return x0 <= x < x0 + side and y0 <= y < y0 + side

        _png(images / f"{i}.png", size, size,
             lambda x, y: ((200 if inside(x, y) else (x * 3 + seed) % 120),
                           (y * 5 + seed) % 256, (x + y) % 256))
        _png(masks / f"{i}_mask.png", size, size, lambda x, y: (255 if inside(x, y) else 0,), gray=True)


def make_cifar10(cwd: Path, entry: dict) -> None:
    """torchvision's cifar-10-batches-py: five training batches, a test batch and batches.meta,
    pickled as the real archive is (uint8 rows of 3072, a list of labels). torchvision checks
    each file's MD5 against the real archive's, which no other data can match: the harness's
    sitecustomize (OFFLINE_SHIMS) makes that check one of existence, as MNIST's already is."""
    import pickle

    import numpy as np

    folder = cwd / entry.get("data_dir", "data") / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(entry.get("data_seed", 0))

    def batch(n: int) -> dict:
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 64, (n, 3, 32, 32), dtype=np.uint8)
        for i, c in enumerate(labels):   # class c: a bright band in channel c % 3, rows 3c..3c+2
            images[i, c % 3, 3 * c:3 * c + 3, :] += 180
        noisy = rng.random(n) < 0.4      # 40% random labels: the loss stays well above 0
        labels[noisy] = rng.integers(0, 10, int(noisy.sum()))
        return {"batch_label": "tpukit corpus", "labels": labels.tolist(),
                "data": images.reshape(n, 3072), "filenames": [f"{i}.png" for i in range(n)]}

    train = entry.get("data_size", 640)
    for k in range(1, 6):
        with open(folder / f"data_batch_{k}", "wb") as f:
            pickle.dump(batch(train // 5), f)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(batch(entry.get("test_size", 100)), f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": ["plane", "car", "bird", "cat", "deer", "dog", "frog", "horse",
                                     "ship", "truck"], "num_vis": 3072, "num_cases_per_batch": train // 5}, f)


def make_cora(cwd: Path, entry: dict) -> None:
    """A citation graph as pyGAT's load_data reads it: data/cora/cora.content (a paper id, binary
    word features, a class name per line, tab-separated) and cora.cites (pairs of paper ids).
    `data_size` papers (at least 1,500: the script's test split is papers 500-1499)."""
    folder = cwd / entry.get("data_dir", "data/cora")
    folder.mkdir(parents=True, exist_ok=True)
    rng = _rng(entry)
    n, features = max(entry.get("data_size", 1600), 1500), entry.get("data_features", 32)
    classes = ["Case_Based", "Genetic_Algorithms", "Neural_Networks", "Probabilistic_Methods",
               "Reinforcement_Learning", "Rule_Learning", "Theory"]
    ids = rng.sample(range(10_000, 10_000_000), n)
    with open(folder / "cora.content", "w") as f:
        for paper in ids:
            label = rng.randrange(len(classes))
            # a class's papers share words: the classes can be learned
            bits = ["1" if rng.random() < (0.4 if k % len(classes) == label else 0.05) else "0"
                    for k in range(features)]
            f.write("\t".join([str(paper), *bits, classes[label]]) + "\n")
    with open(folder / "cora.cites", "w") as f:
        for _ in range(n * 3):
            f.write(f"{rng.choice(ids)}\t{rng.choice(ids)}\n")


def make_sft_jsonl(cwd: Path, entry: dict) -> None:
    """Chat fine-tuning data as JSON lines (`data_file`): {"conversations": [{"role": "user",
    "content": ...}, {"role": "assistant", "content": ...}]}, `data_size` conversations."""
    path = cwd / entry.get("data_file", "data.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = _rng(entry)
    with open(path, "w") as f:
        for _ in range(entry.get("data_size", 8)):
            turns = [{"role": "user", "content": " ".join(_words(rng, 8)) + "?"},
                     {"role": "assistant", "content": " ".join(_words(rng, 16)) + "."}]
            f.write(json.dumps({"conversations": turns}) + "\n")


def make_wave_feats(cwd: Path, entry: dict) -> None:
    """Vocoder training pairs as NumPy files, per split (`splits`) under `data_dir`:
    UTT-wave.npy (float32 samples, `frames` x `hop` long) and UTT-feats.npy (`frames` x `mels`
    log-mel-like features), `data_size` utterances each: the dump ParallelWaveGAN's recipes
    write with `format: npy`. A feature frame follows its samples' energy, so it can be learned."""
    import numpy as np
    rng = np.random.default_rng(entry.get("data_seed", 0))
    hop, frames, mels = entry.get("hop", 16), entry.get("frames", 32), entry.get("mels", 20)
    for split in entry.get("splits", ["train", "dev"]):
        folder = cwd / entry.get("data_dir", "dump") / split
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(entry.get("data_size", 4)):
            t = np.arange(frames * hop) / 16_000
            wave = (0.3 * np.sin(2 * np.pi * rng.uniform(100, 800) * t)
                    * np.repeat(rng.uniform(0.1, 1.0, frames), hop)).astype(np.float32)
            energy = np.log(np.abs(wave.reshape(frames, hop)).mean(1) + 1e-5)
            feats = (energy[:, None] + 0.1 * rng.standard_normal((frames, mels))).astype(np.float32)
            np.save(folder / f"utt{k:03d}-wave.npy", wave)
            np.save(folder / f"utt{k:03d}-feats.npy", feats)


def make_nothing(cwd: Path, entry: dict) -> None:
    """The script makes its own data (FakeData, torch.randn, a generator in the repo)."""


RECIPES = {
    "mnist": make_mnist,
    "wikitext": make_wikitext,
    "text_file": make_text_file,
    "nanogpt_bins": make_nanogpt_bins,
    "image_folder": make_image_folder,
    "cifar10": make_cifar10,
    "image_masks": make_image_masks,
    "cora": make_cora,
    "sft_jsonl": make_sft_jsonl,
    "wave_feats": make_wave_feats,
    "none": make_nothing,
}

# Seeds Python, NumPy and torch at interpreter start, for scripts that seed nothing themselves
# (`seed = true`): the original and the port then draw the same weights, noise and shuffles.
SITECUSTOMIZE = """\
import random
random.seed(0)
try:
    import numpy
    numpy.random.seed(0)
except ImportError:
    pass
try:
    import torch
    torch.manual_seed(0)
except ImportError:
    pass
"""

# Per recipe, what sitecustomize must add for the data to load offline (run before the script in
# both processes, the original and the port).
OFFLINE_SHIMS = {
    "cifar10": """\
import os as _os
import torchvision.datasets.cifar as _cifar
_cifar.check_integrity = lambda fpath, md5=None: _os.path.isfile(fpath)
""",
}


# ----------------------------------------------------------------------------- results

@dataclass
class Run:
    """One process: the original on the CPU, or the port under `tpukit run`."""
    status: str = "not run"          # ok | stopped (harness ended it after N losses) | failed | timeout | not run
    exit_code: int | None = None
    wall_s: float = 0.0
    losses: list[float] = field(default_factory=list)
    error: str = ""                  # the first error line
    where: str = ""                  # path:line of the innermost frame in the script's tree
    where_source: str = ""           # that line's text


@dataclass
class Result:
    name: str
    repo: str
    path: str
    needs_edit: str = ""
    migrate_exit: int | None = None
    changed_files: int = 0
    fixes: int = 0
    parses: bool | None = None
    parse_error: str = ""
    idioms_left: int | None = None
    left_codes: dict[str, int] = field(default_factory=dict)   # every finding left, by code
    left_findings: list[str] = field(default_factory=list)
    original: Run = field(default_factory=Run)
    migrated: Run = field(default_factory=Run)
    outcome: str = ""                # the run report's summary.outcome
    steps: int | None = None
    recompiles_after_warmup: int | None = None   # not counting a long warm-up's (below)
    recompiles_in_long_warmup: int | None = None
    compiles: int | None = None
    # What the port's run costs after warm-up (issue 48's table, benchmarks/proof_table.py):
    # distinct graphs, CPU fallbacks in all and by op, and per steady training step the median
    # CPU fallbacks and device-to-host transfers; the median steady step time
    graphs: int | None = None
    fallbacks: int | None = None
    fallback_ops: dict[str, int] = field(default_factory=dict)
    fallbacks_per_step: float | None = None
    host_reads_per_step: float | None = None
    step_time_s: float | None = None
    run_findings: list[str] = field(default_factory=list)  # the run report's, dearest first
    loss: str = "n/a"                # ok | differ | n/a (...): printed losses, by regex
    loss_detail: str = ""
    # `tpukit verify`: match | diverged | incomparable | error | n/a, and its summary's figures
    verdict: str = "n/a"
    verify_steps: int | None = None
    verify_max_rel: float | None = None
    verify_detail: str = ""
    reason: str = ""


def compare_losses(original: list[float], migrated: list[float], steps: int,
                   rtol: float = LOSS_RTOL) -> tuple[str, str]:
    """The first `steps` losses of both runs: ("ok"|"differ"|"n/a", detail)."""
    if steps <= 0:
        return "n/a", "the script prints no loss"
    if len(original) < steps:
        return "n/a", f"original printed {len(original)} of {steps} losses"
    if len(migrated) < steps:
        return "differ", f"port printed {len(migrated)} of {steps} losses"
    worst, worst_at = 0.0, 0
    for i, (a, b) in enumerate(zip(original[:steps], migrated[:steps])):
        rel = abs(a - b) / max(abs(a), 1e-8)
        if rel != rel or rel > worst:  # NaN counts as the worst
            worst, worst_at = (float("inf") if rel != rel else rel), i
    if worst <= rtol:
        return "ok", f"max rel. diff {worst:.2%} over {steps}"
    return "differ", (f"step {worst_at + 1}: {original[worst_at]:.4g} vs {migrated[worst_at]:.4g} "
                      f"({worst:.1%})")


def read_losses(text: str, pattern: str) -> list[float]:
    """Every loss the script printed, in order: the regex's first group (or the whole match)."""
    out = []
    for match in re.finditer(pattern, text, flags=re.MULTILINE):
        value = match.group(1) if match.groups() else match.group(0)
        try:
            out.append(float(value))
        except ValueError:
            continue
    return out


def first_error(text: str, tree: Path | None = None, cwd: Path | None = None) -> tuple[str, str]:
    """The exception line of the last traceback (else the last line that says error) and the
    innermost frame of that traceback inside `tree`, as path:line (a relative frame path is
    relative to `cwd`)."""
    lines = text.splitlines()
    start = max((i for i, x in enumerate(lines) if x.startswith("Traceback (most recent call last)")),
                default=-1)
    where = ""
    error = ""
    if start >= 0:
        for line in lines[start + 1:]:
            frame = FRAME.match(line)
            if frame:
                path = frame["path"]
                if cwd is not None and not os.path.isabs(path) and not path.startswith("<"):
                    path = os.path.normpath(cwd / path)
                if tree is not None and path.startswith(str(tree) + os.sep):
                    where = f"{os.path.relpath(path, tree)}:{frame['line']}"
                continue
            if ERROR_LINE.match(line.strip()) and not line.startswith(" "):
                error = line.strip()
                break
    if not error:
        for line in reversed(lines):
            if re.search(r"\berror\b|Error\b|^terminate called|^Fatal Python error|Segmentation fault|"
                         r"^Aborted", line) and not line.startswith(" "):
                error = line.strip()
                break
    return error[:300], where


def yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


COLUMNS = ("script", "no edit", "parses", "left", "original", "port runs", "recompiles", "loss",
           "verify", "reason")


def verify_cell(r: Result) -> str:
    """verdict, steps compared, max relative difference: `match 3 (2.1e-07)`."""
    if r.verdict in ("n/a", "error"):
        return r.verdict
    rel = "" if r.verify_max_rel is None else f" ({r.verify_max_rel:.1e})"
    return f"{r.verdict} {r.verify_steps}{rel}"


def table_rows(results: list[Result]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        no_edit = not r.needs_edit
        runs = None if r.needs_edit else r.migrated.status in ("ok", "stopped")
        recompiles = "-" if r.recompiles_after_warmup is None else str(r.recompiles_after_warmup)
        if r.recompiles_in_long_warmup:
            recompiles += f" (+{r.recompiles_in_long_warmup} warm-up)"
        rows.append((r.name, yes_no(no_edit), yes_no(r.parses),
                     "-" if r.idioms_left is None else str(r.idioms_left),
                     r.original.status, yes_no(runs) if r.migrated.status != "timeout" else "timeout",
                     recompiles, r.loss, verify_cell(r), _short(r.reason)))
    return rows


def _short(text: str, width: int = 140) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def render_table(results: list[Result]) -> str:
    rows = [COLUMNS] + table_rows(results)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    out = []
    for n, row in enumerate(rows):
        out.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
        if n == 0:
            out.append("-" * (sum(widths) + 2 * len(widths) + len(COLUMNS[-1])))
    return "\n".join(out)


def summary_line(results: list[Result]) -> str:
    """Counts over the runnable entries; an entry that `needs_edit` to run at all (sizes or
    downloads hard-coded) is migrated and checked only, and counted apart, in both shares."""
    runnable = [r for r in results if not r.needs_edit]
    ran = [r for r in runnable if r.migrated.status in ("ok", "stopped")]
    compared = [r for r in results if r.loss in ("ok", "differ")]
    matched = [r for r in compared if r.loss == "ok"]
    repos = {r.repo for r in results}
    share = f" ({len(ran) / len(runnable):.0%})" if runnable else ""
    checked = len(results) - len(runnable)
    apart = (f"; {checked} checked only (needs an edit to run); {len(ran)}/{len(results)} "
             f"of all entries ({len(ran) / len(results):.0%})") if checked else ""
    verified = [r for r in results if r.verdict in ("match", "diverged")]
    return (f"{len(results)} scripts from {len(repos)} repositories; {len(ran)}/{len(runnable)} "
            f"runnable ports ran to their end with no edit{share}{apart}; losses within "
            f"{LOSS_RTOL:.0%}: {len(matched)}/{len(compared)} compared; tpukit verify: "
            f"{sum(r.verdict == 'match' for r in verified)}/{len(verified)} match")


def reason_of(r: Result) -> str:
    if r.needs_edit:
        return f"needs edit: {r.needs_edit}"
    if r.migrate_exit == 2 or r.parses is False:
        return f"migrate: {r.parse_error}"
    if r.migrated.status == "not run" and r.verdict != "n/a":  # --verify-only
        return f"verify: {r.verdict}" + (f": {r.verify_detail}" if r.verify_detail else "")
    if r.migrated.status == "timeout":
        return (f"port timeout after {r.migrated.wall_s:.0f} s: {r.steps} step(s), {r.compiles} "
                f"compile(s) so far")
    if r.migrated.status not in ("ok", "stopped"):
        what = r.migrated.error or f"exit {r.migrated.exit_code}"
        if r.original.status in ("failed", "timeout") and r.original.error == r.migrated.error:
            return f"both failed: {what}"
        return f"port {r.migrated.status}: {what}" + (f" [{r.migrated.where}]" if r.migrated.where else "")
    if r.original.status == "failed":  # (a script that needs a GPU: the port still runs)
        return f"original failed on this CPU host: {r.original.error}"
    if r.verdict == "diverged":
        return f"verify: diverged at {r.verify_detail}"
    if r.loss == "differ":
        return f"loss differs: {r.loss_detail}"
    if r.recompiles_after_warmup:
        return f"{r.recompiles_after_warmup} recompile(s) after warm-up"
    return ""


# ----------------------------------------------------------------------------- running

def extract(mirrors: Path, entry: dict, dest: Path) -> None:
    git_dir = mirrors / entry["repo"].replace("/", "+") / "repo"
    if not git_dir.is_dir():
        raise FileNotFoundError(f"no mirror {git_dir} (fetch github:{entry['repo']})")
    tree = entry.get("tree", [str(Path(entry["path"]).parent) if "/" in entry["path"] else "."])
    dest.mkdir(parents=True)
    # A mirror may lack its largest blobs (data files the recipes replace): leave those out. Where
    # git archive still reads an excluded blob (it does for some trees), the manifest's `tree`
    # lists only what the script needs.
    excluded: list[str] = []
    for _ in range(50):
        done = subprocess.run(["git", f"--git-dir={git_dir}", "archive", entry["commit"], "--", *tree,
                               *excluded], capture_output=True)
        missing = re.search(rb"invalid object \w+ \w+ for '([^']+)'", done.stderr)
        if done.returncode == 0 or not missing or f":(exclude){missing[1].decode()}" in excluded:
            break
        excluded.append(f":(exclude){missing[1].decode()}")
    if done.returncode:
        raise OSError(f"git archive {entry['commit']}: {done.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=done.stdout, check=True)


def make_hub_cache(mirrors: Path, entry: dict, torch_home: Path) -> None:
    """The repositories a script loads with `torch.hub` (`torch_hub`: repo, commit, ref), laid
    out as torch.hub's cache (TORCH_HOME/hub/OWNER_NAME_REF) from their mirrors, as a first
    download would have left them: torch.hub reads a cached repository without the network."""
    for hub in entry.get("torch_hub", []):
        owner, name = hub["repo"].split("/")
        dest = torch_home / "hub" / f"{owner}_{name}_{hub.get('ref', 'main').replace('/', '_')}"
        extract(mirrors, {"repo": hub["repo"], "commit": hub["commit"], "path": ".",
                          "tree": hub.get("tree", ["."])}, dest)


def _terminal(rows: int = 24, columns: int = 120) -> tuple[int, int]:
    """A pseudo-terminal (primary, secondary) of this size, for a script that asks its
    terminal's size (`stty size`) as it would in an interactive shell."""
    import fcntl
    import pty
    import termios

    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    return primary, secondary


def run_process(cmd: list[str], cwd: Path, env: dict, log: Path, timeout: float,
                loss_pattern: str = "", stop_after: int = 0,
                terminal: bool = False) -> tuple[int | None, str, float]:
    """Run cmd with stdout and stderr into log; end it (SIGTERM, then SIGKILL) at the timeout,
    or once `stop_after` losses have been printed. With `terminal`, stdin is a pseudo-terminal
    (output still goes to the log). Returns (exit code, status, wall seconds)."""
    start = time.monotonic()
    fds = _terminal() if terminal else None
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=fds[1] if fds else subprocess.DEVNULL, start_new_session=True)
        if fds:
            os.close(fds[1])
        status = ""
        while proc.poll() is None:
            time.sleep(0.5)
            if time.monotonic() - start > timeout:
                status = "timeout"
            elif stop_after and loss_pattern and \
                    len(read_losses(log.read_text(errors="replace"), loss_pattern)) >= stop_after:
                status = "stopped"
            if status:
                _end(proc)
                break
    code = proc.returncode
    if fds:
        os.close(fds[0])
    if not status:
        status = "ok" if code == 0 else "failed"
    return code, status, time.monotonic() - start


def _end(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def tpukit(python: str, *args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "tpukit", *args], cwd=cwd, env=env, capture_output=True,
                          text=True)


def base_env(entry: dict, tree: Path, sites: list[Path], seed_dir: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "XLA_", "PT_XLA_"))}
    paths = [str(CODE_ROOT)] + [str(s) for s in sites]
    if seed_dir is not None:
        paths.append(str(seed_dir))
    paths += [str(tree / p) for p in entry.get("pythonpath", [])]
    env.update(PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="",
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"), MPLBACKEND="Agg")
    env.update({k: str(v) for k, v in entry.get("env", {}).items()})
    return env


def run_entry(entry: dict, mirrors: Path, work: Path, python: str, sites: list[Path],
              timeout: float, verify_only: bool = False) -> Result:
    r = Result(name=entry["name"], repo=entry["repo"], path=entry["path"],
               needs_edit=entry.get("needs_edit", ""))
    steps = entry.get("steps", 0)
    pattern = entry.get("loss", "")
    timeout = entry.get("timeout", timeout)
    seed_dir = None
    shim = OFFLINE_SHIMS.get(entry.get("data", "none"), "")
    if entry.get("seed") or shim:
        seed_dir = work / "seed"
        seed_dir.mkdir()
        (seed_dir / "sitecustomize.py").write_text((SITECUSTOMIZE if entry.get("seed") else "") + shim)

    # The original, on the CPU.
    orig = work / "original"
    extract(mirrors, entry, orig)
    port = work / "port"
    shutil.copytree(orig, port, symlinks=True)
    cwd_rel = entry.get("cwd", str(Path(entry["path"]).parent))
    script_rel = os.path.relpath(entry["path"], cwd_rel)
    args = [str(a) for a in entry.get("args", [])]
    if not r.needs_edit:
        for tree in (orig, port):
            RECIPES[entry.get("data", "none")](tree / cwd_rel, entry)
            for name, text in entry.get("files", {}).items():
                (tree / cwd_rel / name).parent.mkdir(parents=True, exist_ok=True)
                (tree / cwd_rel / name).write_text(text)
    if entry.get("torch_hub"):
        make_hub_cache(mirrors, entry, work / "torch_home")
        entry = {**entry, "env": {**entry.get("env", {}), "TORCH_HOME": str(work / "torch_home")}}
    # verify starts from the trees as they were before any run (a script that resumes from its
    # own output folder would otherwise resume the plain runs' checkpoints)
    clean = work / "verify-trees"
    shutil.copytree(orig, clean / "original", symlinks=True)
    if not r.needs_edit and not verify_only:
        env = base_env(entry, orig, sites, seed_dir)
        # original_shim: the original runs under the runtime layer sent to the CPU (CUDA in an
        # installed package, or an unconditional CUDA call, that nothing on a CPU host answers)
        shim = ["-m", "tpukit.shim", "--to", "cpu"] if entry.get("original_shim") else []
        cmd = [python, *shim, script_rel, *args,
               *[str(a) for a in entry.get("original_args", [])]]
        log = work / "original.log"
        code, status, wall = run_process(cmd, orig / cwd_rel, env, log, timeout, pattern,
                                         steps if entry.get("stop_original", False) else 0,
                                         terminal=entry.get("terminal", False))
        text = log.read_text(errors="replace")
        r.original = Run(status=status, exit_code=code, wall_s=round(wall, 1), losses=read_losses(text, pattern))
        if status in ("failed", "timeout"):
            r.original.error, r.original.where = first_error(text, orig, orig / cwd_rel)

    # The port: migrate the listed paths of a copy, then check what is left.
    targets = entry.get("migrate", [entry["path"]])
    env = base_env(entry, port, sites, seed_dir)
    done = tpukit(python, "migrate", "--format", "json", "--exit-zero", *targets, cwd=port, env=env)
    r.migrate_exit = done.returncode
    try:
        report = json.loads(done.stdout)
        r.changed_files = report["summary"]["files_changed"]
        r.fixes = report["summary"]["fixes"]
        if report.get("errors"):
            r.parse_error = report["errors"][0]["message"]
    except (json.JSONDecodeError, KeyError):
        r.parse_error = (done.stderr.strip().splitlines() or ["no JSON from tpukit migrate"])[-1]
    r.parses = r.migrate_exit != 2 and not r.parse_error
    shutil.copytree(port, clean / "port", symlinks=True)
    for path in _python_files(port, targets):
        try:
            compile(path.read_text(), str(path), "exec")
        except SyntaxError as exc:
            r.parses, r.parse_error = False, f"{path.relative_to(port)}:{exc.lineno}: {exc.msg}"
            break
    check = tpukit(python, "migrate", "--check", "--format", "json", *targets, cwd=port, env=env)
    try:
        findings = json.loads(check.stdout)["findings"]
        left = [f for f in findings if f["severity"] != "info"]
        r.idioms_left = sum(1 for f in left if IDIOM_CODE.match(f["code"]))
        for f in left:
            r.left_codes[f["code"]] = r.left_codes.get(f["code"], 0) + 1
            r.left_findings.append(f"{f['path']}:{f['line']}: {f['code']} {f['message'][:160]}")
    except (json.JSONDecodeError, KeyError):
        pass

    if verify_only and not r.needs_edit and r.parses:
        verify_entry(r, entry, clean / "original", clean / "port", cwd_rel, args, work, python,
                     sites, seed_dir, timeout)
    elif not r.needs_edit and r.parses:
        report_path = work / "run.json"
        env["PJRT_DEVICE"] = "CPU"
        cmd = [python, "-m", "tpukit", "run", "--json", str(report_path)]
        if entry.get("max_steps"):
            cmd += ["--max-steps", str(entry["max_steps"])]
        cmd += [script_rel, *args, *[str(a) for a in entry.get("port_args", [])]]
        log = work / "port.log"
        code, status, wall = run_process(cmd, port / cwd_rel, env, log, timeout,
                                         terminal=entry.get("terminal", False))
        text = log.read_text(errors="replace")
        r.migrated = Run(status=status, exit_code=code, wall_s=round(wall, 1), losses=read_losses(text, pattern))
        findings = []
        try:
            report = json.loads(report_path.read_text())
            summary, findings = report["summary"], report.get("findings", [])
            r.outcome = summary.get("outcome", "")
            r.steps = summary.get("steps")
            r.compiles = summary.get("compiles")
            read_costs(r, summary)
            r.run_findings = [_finding_line(f, port) for f in findings[:8]]
            after = summary.get("recompiles_after_warmup")
            r.recompiles_in_long_warmup = summary.get("recompiles_in_long_warmup", 0)
            r.recompiles_after_warmup = None if after is None else after - (r.recompiles_in_long_warmup or 0)
            if summary.get("outcome") == "max-steps" and code == 0:
                r.migrated.status = "ok"
        except (OSError, json.JSONDecodeError, KeyError):
            summary = {}
        if r.migrated.status not in ("ok", "stopped"):
            r.migrated.error, r.migrated.where = first_error(text, port, port / cwd_rel)
            if not r.migrated.error and summary.get("error"):
                r.migrated.error = summary["error"]
            stopped_by = {"compile-storm": "TPU710", "died": None}
            if summary.get("outcome") in stopped_by:
                # stopped by tpukit (a compile storm) or killed by a signal: what the report says
                code_wanted = stopped_by[summary["outcome"]]
                said = next((f for f in findings if f.get("code") == code_wanted), None)
                r.migrated.error = summary["outcome"] + (
                    f" ({summary['signal']})" if summary.get("signal") else "") + (
                    f": {said['code']} {said['message'].split(':')[0]}" if said else "")
                if said and said.get("path", "").startswith(str(port) + os.sep):
                    r.migrated.where = f"{os.path.relpath(said['path'], port)}:{said.get('line', 0)}"
            if r.migrated.where:
                path, line = r.migrated.where.rsplit(":", 1)
                try:
                    r.migrated.where_source = (port / path).read_text().splitlines()[int(line) - 1].strip()
                except (OSError, IndexError, ValueError):
                    pass
        compare = entry.get("compare", steps)
        if steps and not compare:
            r.loss, r.loss_detail = "n/a", f"not comparable: {entry.get('device_rng', '')}"
        elif r.migrated.status not in ("ok", "stopped") and len(r.migrated.losses) < compare:
            r.loss, r.loss_detail = "n/a", f"port {r.migrated.status} after {len(r.migrated.losses)} losses"
        elif r.original.status in ("ok", "stopped") or r.original.losses:
            r.loss, r.loss_detail = compare_losses(r.original.losses, r.migrated.losses, compare)
            if entry.get("device_rng") and r.loss in ("ok", "differ"):
                r.loss_detail += f"; first {entry.get('compare', steps)} only: {entry['device_rng']}"
        else:
            r.loss, r.loss_detail = "n/a", f"original {r.original.status} on CPU: {r.original.error}"
        if steps == 0:
            r.loss, r.loss_detail = "n/a", "the script prints no loss"
        if r.migrated.status in ("ok", "stopped"):
            verify_entry(r, entry, clean / "original", clean / "port", cwd_rel, args, work,
                         python, sites, seed_dir, timeout)
    r.reason = reason_of(r)
    return r


SCALAR_READ_OP = "aten::_local_scalar_dense"  # `.item()`: a host read (TPU703), not a fallback


def read_costs(r: Result, summary: dict) -> None:
    """The port's costs from its run report: distinct graphs, CPU fallbacks (in all, by op,
    and the median per steady training step), device-to-host transfers per steady training
    step (median) and the median steady step time. Steady: complete, past warm-up, a training
    step (not an evaluation batch)."""
    r.graphs = summary.get("distinct_graphs")
    r.fallbacks = summary.get("fallbacks")
    records = summary.get("step_records", [])
    for s in records:
        for op, n in s.get("fallbacks", {}).items():
            if op != SCALAR_READ_OP:
                r.fallback_ops[op] = r.fallback_ops.get(op, 0) + n
    steady = [s for s in records if s.get("complete") and not s.get("warmup")
              and s.get("kind", "train") == "train"]
    if steady:
        r.fallbacks_per_step = statistics.median(
            sum(n for op, n in s.get("fallbacks", {}).items() if op != SCALAR_READ_OP)
            for s in steady)
        r.host_reads_per_step = statistics.median(s.get("host_transfers", 0) for s in steady)
    r.step_time_s = summary.get("step_time_median_s")


def _finding_line(finding: dict, tree: Path) -> str:
    path = finding.get("path") or ""
    if path.startswith(str(tree) + os.sep):
        path = os.path.relpath(path, tree)
    return f"{finding.get('code')} {path}:{finding.get('line')}: {finding.get('message', '')[:160]}"


def verify_entry(r: Result, entry: dict, orig: Path, port: Path, cwd_rel: str, args: list[str],
                 work: Path, python: str, sites: list[Path], seed_dir: Path | None,
                 timeout: float) -> None:
    """`tpukit verify` of the original (its tree) against the port (the migrated tree), run
    where the port runs: each step's loss from the tensor whose backward() runs."""
    out = work / "verify.json"
    # the repository's packages from the original's tree: verify puts the port's tree's on the
    # port's side (tpukit.verify.command.port_pythonpath)
    env = base_env(entry, orig, sites, seed_dir)
    cmd = [python, "-m", "tpukit", "verify", "--json", str(out), "--port",
           str(port / entry["path"]), "--steps", str(entry.get("verify_steps", 3)),
           "--timeout", str(timeout)]
    cmd += [f"--original-arg={a}" for a in entry.get("original_args", [])]
    cmd += [str(orig / entry["path"]), "--", *args]
    code, status, _ = run_process(cmd, port / cwd_rel, env, work / "verify.log", 4 * timeout,
                                  terminal=entry.get("terminal", False))
    try:
        summary = json.loads(out.read_text())["summary"]
    except (OSError, json.JSONDecodeError, KeyError):
        r.verdict, r.verify_detail = "error", f"verify {status} (exit {code}), no report"
        return
    r.verdict = summary["verdict"]
    r.verify_steps = summary.get("steps_compared")
    r.verify_max_rel = summary.get("max_rel_diff")
    if r.verdict == "error":
        r.verify_detail = f"{summary.get('failed_side')}: {summary.get('error')}"
    elif r.verdict == "diverged":
        r.verify_detail = (f"step {summary['first_divergent_step']}: "
                           f"{(summary.get('where') or {}).get('text', '')}")
    elif summary.get("not_comparable_why"):
        r.verify_detail = summary["not_comparable_why"]


def _python_files(tree: Path, targets: list[str]) -> list[Path]:
    files = []
    for t in targets:
        p = tree / t
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return files


def load_manifest(path: Path = MANIFEST) -> list[dict]:
    return tomllib.loads(path.read_text())["script"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this script (by name; repeatable, or comma-separated)")
    parser.add_argument("--json", type=Path, help="also write every result as JSON here")
    parser.add_argument("--site", action="append", default=[], metavar="[NAME=]DIR",
                        help="a folder with the scripts' own dependencies (torchvision, pillow, "
                             "tqdm); NAME=DIR: only for the entries whose `site` is NAME, before "
                             "the others (their pins shadow the shared folder's)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter (with torch, torch_xla)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds per run (a manifest entry may say)")
    parser.add_argument("--keep", type=Path, help="keep each script's folders and logs under this folder")
    parser.add_argument("--verify-only", action="store_true",
                        help="migrate and `tpukit verify` each script; no separate runs")
    parser.add_argument("--tpukit", type=Path, default=ROOT, metavar="DIR",
                        help="the tpukit source tree the runs use (default: this checkout; a "
                             "worktree of an earlier commit gives its figures)")
    args = parser.parse_args()
    global CODE_ROOT
    CODE_ROOT = args.tpukit.resolve()
    entries = load_manifest(args.manifest)
    only = {n for x in args.only for n in x.split(",") if n}
    if only:
        unknown = only - {e["name"] for e in entries}
        if unknown:
            parser.error(f"not in the manifest: {', '.join(sorted(unknown))}")
        entries = [e for e in entries if e["name"] in only]
    shared = [Path(x) for x in args.site if "=" not in x]
    named = dict((k, Path(v)) for k, v in (x.split("=", 1) for x in args.site if "=" in x))
    results = []
    started = datetime.now(timezone.utc)
    for entry in entries:
        work = Path(tempfile.mkdtemp(prefix=f"corpus-{entry['name']}-"))
        print(f"... {entry['name']} ({entry['repo']}:{entry['path']})", file=sys.stderr, flush=True)
        try:
            if entry.get("site") and entry["site"] not in named:
                raise OSError(f"needs --site {entry['site']}=DIR (its own pins, see the manifest)")
            sites = ([named[entry["site"]]] if entry.get("site") else []) + shared
            result = run_entry(entry, args.mirrors, work, args.python, sites, args.timeout,
                               args.verify_only)
        except (OSError, subprocess.CalledProcessError) as exc:
            result = Result(name=entry["name"], repo=entry["repo"], path=entry["path"],
                            reason=f"harness: {exc}")
        results.append(result)
        print(f"    {result.reason or 'ok'} (original {result.original.wall_s}s, port "
              f"{result.migrated.wall_s}s)", file=sys.stderr, flush=True)
        if args.keep:
            shutil.copytree(work, args.keep / entry["name"], symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"# tpukit differential corpus, {started:%Y-%m-%d %H:%M} UTC, XLA:CPU (PJRT_DEVICE=CPU), "
          f"loss tolerance {LOSS_RTOL:.0%} relative")
    print(render_table(results))
    print(summary_line(results))
    if args.json:
        commit = subprocess.run(["git", "-C", str(CODE_ROOT), "rev-parse", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        args.json.write_text(json.dumps({"date": started.isoformat(), "rtol": LOSS_RTOL,
                                         "tpukit": commit,
                                         "results": [asdict(r) for r in results]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
