"""The runtime layer (tpukit/shim): CUDA calls in code tpukit does not rewrite (a stand-in
third-party package outside the script's tree, fixtures/shim/site/fakelib) and a device that
arrives from argv (`--device cuda`), run under `tpukit run` and `python -m tpukit.shim` on
XLA:CPU; its catalog checked against torch 2.9 itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib

import pytest
from conftest import FIXTURES, ROOT, tpukit_executable

torch = pytest.importorskip("torch")
pytest.importorskip("torch_xla")

PROG = FIXTURES / "shim" / "prog"
SITE = FIXTURES / "shim" / "site"
FAKELIB = SITE / "fakelib" / "__init__.py"
ENV = {**os.environ, "PJRT_DEVICE": "CPU", "NO_COLOR": "1", "PYTHONPATH": str(SITE),
       "OMP_NUM_THREADS": "1"}
CATALOG = tomllib.loads((ROOT / "rules" / "catalog" / "shim.toml").read_text())


def line_of(path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def tpukit_run(tmp_path, *args, options=()):
    report = tmp_path / "run.json"
    proc = subprocess.run([tpukit_executable(), "run", "--no-cuda-check", "--json", str(report),
                           *options, "train.py", *args], cwd=PROG, env=ENV, capture_output=True,
                          text=True, timeout=600)
    return proc, json.loads(report.read_text()) if report.exists() else None


def redirects(report) -> list[dict]:
    return [f for f in report["findings"] if f["code"] in ("TPU707", "TPU708")]


def at(report, path_end: str, line: int, code: str = "TPU707") -> list[dict]:
    return [f for f in report["findings"] if f["code"] == code and f["path"].endswith(path_end)
            and f["line"] == line]


# -- the catalog, against the real torch -----------------------------------------------------

@pytest.mark.parametrize("name", CATALOG["factories"])
def test_every_factory_takes_a_device(name):
    function = getattr(torch, name)
    assert "device" in (function.__doc__ or ""), name
    # and a CUDA device there is what fails without the layer (the host has no CUDA)
    if not torch.cuda.is_available() and name in ("zeros", "ones", "empty", "full", "tensor",
                                                   "arange", "randn"):
        args = {"full": ((2,), 1.0), "tensor": ([1.0],), "arange": (3,)}.get(name, (2,))
        with pytest.raises(RuntimeError):
            function(*args, device="cuda")


def test_tensor_factories_and_refused_names_exist_in_torch():
    base = torch.ones(2)
    for name in CATALOG["tensor_factories"]:
        args = {"new_full": ((2,), 1.0), "new_tensor": ([1.0],)}.get(name, ((2,),))
        assert getattr(base, name)(*args, device="cpu").device.type == "cpu", name
    for name in CATALOG["refused"]:
        assert hasattr(torch.cuda, name), name


def test_install_and_uninstall_leave_torch_as_found():
    import tpukit.shim

    before = (torch.zeros, torch.Tensor.to, torch.Tensor.cuda, torch.nn.Module.to,
              torch.cuda.synchronize, torch.cuda.Event, torch.autocast.__init__, torch.load,
              torch.cuda.nvtx.range_push, torch.cuda.get_device_capability)
    shim = tpukit.shim.install(PROG)
    try:
        assert torch.zeros(2, device="cuda").device.type == "xla"
        assert torch.zeros(2).to(0).device.type == "xla"  # an index is a CUDA device
        assert torch.cuda.is_available() is False  # the host's answer, unchanged
        assert torch.zeros(2).to("cpu").device.type == "cpu"
    finally:
        shim.uninstall()
    after = (torch.zeros, torch.Tensor.to, torch.Tensor.cuda, torch.nn.Module.to,
             torch.cuda.synchronize, torch.cuda.Event, torch.autocast.__init__, torch.load,
             torch.cuda.nvtx.range_push, torch.cuda.get_device_capability)
    assert all(a is b for a, b in zip(before, after))


def _zeros_plus_ones(n: int):
    return torch.zeros(n) + torch.ones(n)


def test_torchscript_still_compiles_torch_factories():
    """A library that scripts a function calling torch.zeros at import (timm does) still
    compiles under the layer: the wrapper is TorchScript's aten op too."""
    import tpukit.shim

    shim = tpukit.shim.install(PROG)
    try:
        scripted = torch.jit.script(_zeros_plus_ones)
        assert scripted(3).tolist() == [1.0, 1.0, 1.0]
    finally:
        shim.uninstall()


def test_checkpoint_saved_on_cuda_loads_on_the_cpu(tmp_path, monkeypatch):
    """torch.load without map_location of a checkpoint whose storages say 'cuda:0' (saved on a
    GPU): CUDA's error without the layer, CPU tensors with it."""
    import torch.serialization
    import tpukit.shim

    path = tmp_path / "gpu.pt"
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save({"w": torch.ones(2)}, path)
    with pytest.raises(RuntimeError):
        torch.load(path)
    shim = tpukit.shim.install(PROG)
    try:
        loaded = torch.load(path)
        assert loaded["w"].device.type == "cpu" and loaded["w"].tolist() == [1.0, 1.0]
        (record,) = [r for r in shim.records() if r.api == "torch.load"]
        assert record.path == __file__
    finally:
        shim.uninstall()


def test_a_whole_xla_model_saved_and_loaded_under_the_layer(tmp_path):
    """A word-language model saves its best model whole (`xm.save(model, f)` after the port:
    XLA tensors pickled as they are) and loads it at the end with no map_location: the
    layer's CUDA-to-CPU mapping must not stop torch rebuilding them ("Callable map_location
    not supported with _rebuild_wrapper_subclass" when the mapping was a function)."""
    code = textwrap.dedent("""
        import torch, torch_xla
        import torch_xla.core.xla_model as xm
        import tpukit.shim
        model = torch.nn.LSTM(4, 4).to(torch_xla.device())
        with open(PATH, "wb") as f:
            xm.save(model, f)
        shim = tpukit.shim.install(PROG)
        try:
            with open(PATH, "rb") as f:
                loaded = torch.load(f, weights_only=False)
        finally:
            shim.uninstall()
        print(next(loaded.parameters()).device.type)
    """)
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", f"PATH = {str(tmp_path / 'm.pt')!r}\n"
                           f"PROG = {str(PROG)!r}\n" + code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "xla"


# -- tpukit run: a package's CUDA and argv's device --------------------------------------------

@pytest.fixture(scope="module")
def library_run(tmp_path_factory):
    return tpukit_run(tmp_path_factory.mktemp("shim"), "--device", "cuda", "--library-calls")


def test_run_redirects_the_package_and_the_argv_device(library_run):
    proc, report = library_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["summary"]["outcome"] == "ok"
    # the package's is_available() fast path was not taken (it raises if it is)
    assert "CUDA-only kernel path" not in proc.stderr
    # the package's default device='cuda' (timm 0.4 Mixup's idiom), reached from the program
    (one_hot,) = at(report, "fakelib/__init__.py", line_of(FAKELIB, "torch.full("))
    assert one_hot["extra"]["in_program"] is False
    assert one_hot["extra"]["program_path"] == "train.py"
    assert one_hot["extra"]["program_line"] in (line_of(PROG / "train.py", "one_hot(y, 4, device"),
                                                line_of(PROG / "train.py", "one_hot(y, 4)  #"))
    assert one_hot["extra"]["count"] == 4  # 3 steps + once more, one site
    assert "code tpukit does not rewrite" in one_hot["message"]
    # events, synchronize, streams, AMP, nvtx, memory: each once per site, with what was done
    apis = {f["extra"]["api"] for f in redirects(report)}
    assert {"torch.cuda.Event", "torch.cuda.synchronize", "torch.cuda.Stream",
            "torch.cuda.stream", "torch.cuda.current_stream", "Tensor.cuda()",
            "torch.autocast('cuda')", "GradScaler('cuda')", "torch.cuda.nvtx.range_push",
            "torch.cuda.max_memory_allocated"} <= apis
    # the program's own device came from argv: said so, with the fix
    (model,) = at(report, "train.py", line_of(PROG / "train.py", "model = torch.nn.Linear"))
    assert model["extra"]["in_program"] and not model["extra"]["literal"]
    assert model["explanation"]["fix"].startswith("pass the XLA device (e.g. `--device xla`)")
    assert model["message"].endswith(f"Fix: {model['explanation']['fix']}")
    assert one_hot["explanation"]["fix"] == ""  # code tpukit does not rewrite: the layer covers it
    # two calls on one line are two sites, told apart by column
    moves = at(report, "train.py", line_of(PROG / "train.py", "x, y = x.to(device)"))
    assert sorted(f["col"] for f in moves) == [12, 26] and all(f["extra"]["count"] == 3
                                                              for f in moves)


def test_run_timings_and_amp_are_honest(library_run):
    proc, _ = library_run
    out = proc.stdout
    timed = float(out.split("timed ")[1].split(" ms")[0])
    assert timed > 0  # host-timed around a graph cut: the forward ran between the records
    assert "amp torch.bfloat16 scaler False" in out  # fp16 autocast -> bf16, scaler disabled


def test_no_shim_fails_where_the_layer_redirects(tmp_path):
    proc, report = tpukit_run(tmp_path, "--device", "cuda", "--steps", "1", options=("--no-shim",))
    assert proc.returncode == 1
    assert report is not None and not redirects(report)
    assert "NVIDIA" in proc.stderr  # CUDA's own error, at the program's first .to(device)


def test_refused_call_names_the_call_and_the_lines(tmp_path):
    proc, report = tpukit_run(tmp_path, "--device", "xla", "--steps", "1", "--capability")
    assert proc.returncode == 1
    (refused,) = [f for f in report["findings"] if f["code"] == "TPU708"]
    assert refused["line"] == line_of(FAKELIB, "get_device_capability()")
    assert refused["extra"]["program_line"] == line_of(PROG / "train.py", "fakelib.capability()")
    assert refused["severity"] == "error"
    assert "torch.cuda.is_available()" in refused["explanation"]["fix"]
    assert "torch.cuda.get_device_capability has no TPU meaning" in proc.stderr
    assert f"reached from train.py:{refused['extra']['program_line']}" in proc.stderr


def test_program_line_naming_cuda_says_migrate_ports_it(tmp_path):
    script = tmp_path / "literal.py"
    script.write_text("import torch\nx = torch.ones(2).cuda()\ny = torch.zeros(2, device='cuda:0')\n"
                      "print((x + y).sum().item())\n")
    report_path = tmp_path / "r.json"
    proc = subprocess.run([tpukit_executable(), "run", "--no-cuda-check", "--json",
                           str(report_path), str(script)], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(report_path.read_text())
    found = {f["line"]: f for f in redirects(report)}
    assert set(found) == {2, 3}
    for finding in found.values():
        assert finding["extra"]["in_program"] and finding["extra"]["literal"]
        assert finding["explanation"]["fix"] == "run `tpukit migrate literal.py`: it ports this line"
        assert "covered for the port" in finding["explanation"]["cause"]


def test_plain_python_run_with_the_module_form(tmp_path):
    """`python -m tpukit.shim train.py ARGS`: the same redirects, said on stderr at exit."""
    proc = subprocess.run([sys.executable, "-m", "tpukit.shim", "train.py", "--device", "cuda",
                           "--steps", "2"], cwd=PROG, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 1 loss" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("tpukit shim: ")]
    assert any("fakelib/__init__.py" not in line and "Module.to(device)" in line for line in lines)
    assert any("torch.full(device=...)" in line and "(2x)" in line for line in lines)
    usage = subprocess.run([sys.executable, "-m", "tpukit.shim"], env=ENV, capture_output=True,
                           text=True, timeout=60)
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_to_cpu_runs_the_original_as_the_reference(tmp_path):
    """`--to cpu`: the CUDA program runs on a host without CUDA and computes exactly what it
    computes when told `--device cpu` (the corpus harness's and verify's original side)."""
    def losses(*command):
        proc = subprocess.run([sys.executable, *command], cwd=PROG, env=ENV,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [line for line in proc.stdout.splitlines() if line.startswith("step ")], proc

    plain, _ = losses("train.py", "--device", "cpu")
    redirected, proc = losses("-m", "tpukit.shim", "--to", "cpu", "train.py", "--device", "cuda",
                              "--library-calls")
    assert plain == redirected and len(plain) == 3
    assert "amp torch.float32 scaler" in proc.stdout  # CUDA autocast as written: fp32 on the CPU
    assert "put on the CPU device instead of 'cuda'" in proc.stderr


def test_a_program_call_the_migrate_rules_port_is_named_with_the_rule(tmp_path):
    """With the run's check of the script (TPU704's), a redirected call on a line the migrate
    rules would change says which rule ports it; the process group's NCCL and DDP's CUDA
    device_ids go to XLA's at run time meanwhile."""
    script = tmp_path / "ddp.py"
    script.write_text(
        "import os\nimport torch\nfrom torch.distributed import init_process_group\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ.get('MASTER_PORT', "
        "'29541'), RANK='0', WORLD_SIZE='1')\n"
        "init_process_group(backend='nccl')\n"
        "model = DDP(torch.nn.Linear(2, 2).to(0), device_ids=[0])\n"
        "print(next(model.parameters()).device, torch.distributed.get_backend())\n")
    report_path = tmp_path / "r.json"
    proc = subprocess.run([tpukit_executable(), "run", "--json", str(report_path), str(script)],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "xla:0 xla" in proc.stdout
    report = json.loads(report_path.read_text())
    found = {f["line"]: f for f in redirects(report)}
    assert found[6]["extra"]["ported_by"] == "TPU401"
    assert "ports this line (TPU401)" in found[6]["explanation"]["cause"]
    assert found[7]["extra"]["ported_by"] in ("TPU101", "TPU102", "TPU402")


def test_sync_batchnorm_in_one_process_is_batchnorm_on_the_cpu(tmp_path):
    """DINO's original under `--to cpu`: convert_sync_batchnorm then DDP, which refuses
    SyncBatchNorm on any device but CUDA; in one process the conversion leaves BatchNorm (what
    SyncBatchNorm computes there)."""
    script = tmp_path / "sbn.py"
    script.write_text(
        "import os\nimport torch\nimport torch.distributed as dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='29547')\n"
        "dist.init_process_group('nccl', rank=0, world_size=1)\n"
        "net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).cuda()\n"
        "net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)\n"
        "ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[0])\n"
        "ddp(torch.randn(2, 3, 8, 8).cuda()).sum().backward()\n"
        "print(type(net[1]).__name__, next(ddp.parameters()).device)\n")
    proc = subprocess.run([sys.executable, "-m", "tpukit.shim", "--to", "cpu", str(script)],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1].split() == ["BatchNorm2d", "cpu"]
    assert "SyncBatchNorm's kernels are CUDA's" in proc.stderr
    assert torch.nn.SyncBatchNorm.convert_sync_batchnorm.__func__.__name__ == "convert_sync_batchnorm"
