"""What real library code taught us (issue 17: 13 packages, 3.5M lines) that a rule's example
cannot hold: crashes, files and processes, packages laid out on disk, import side effects."""

from __future__ import annotations

import os
import stat
import textwrap
import time

import pytest

from tpukit.migrate.engine import MigrateOptions, MigrationBug, migrate_source
from tpukit.migrate.ownership import Owner
from tpukit.rules import select_rules

# library mode (--library-mode): a package module is library code; a script is still a program
ALL = MigrateOptions(rules=select_rules([], []), owner=Owner.LIBRARY)
# the user's program: every package module of it ported whole
PROGRAM = MigrateOptions(rules=select_rules([], []))


def migrate(source: str, options: MigrateOptions = ALL):
    return migrate_source(textwrap.dedent(source).lstrip("\n"), "lib.py", options)


def out(source: str) -> str:
    return migrate(source).new_source


def fixed_point(source: str) -> str:
    new = out(source)
    assert migrate_source(new, "lib.py", ALL).new_source == new
    return new


# A case whose whole check is one source, what the migration writes and its findings is an
# example in its rule's file instead (rules/TPUnnn-*.toml, `[[examples]]`, run by
# tests/test_rules.py).


# -- crashes ------------------------------------------------------------------------------
@pytest.mark.parametrize("literal,value", [("0xFF", 255), ("0o17", 15), ("0b1000000", 64),
                                           ("1_024", 1024)])
def test_integer_literals_of_every_base_are_read(literal, value):
    new = out(f"import torch\nx = torch.randn(2).cuda()\nmask = {literal}\nhead_dim = {literal}\n")
    assert f"mask = {literal}\n" in new and ".cuda()" not in new
    head_dims = [f.extra.get("head_dim") for f in migrate(
        f"import torch\nx = torch.randn(2).cuda()\nwidth = {literal}\n"
        "q = x.view(1, 1, 1, width)\n"
        "y = torch.nn.functional.scaled_dot_product_attention(q, q, q)\n").findings
        if f.code == "TPU504"]
    assert head_dims == ([value] if value % 128 else [])


def test_a_rule_that_raises_is_reported_at_its_statement(monkeypatch):
    from tpukit.migrate.transforms.devices import cuda_method as devices

    def broken(self, original, updated):
        raise ValueError("boom")

    monkeypatch.setattr(devices.CudaMethod, "leave_Call", broken)
    with pytest.raises(MigrationBug) as info:
        migrate("import torch\n\n\nx = 1\ny = torch.randn(2).cuda()\n")
    assert info.value.line == 5 and "ValueError: boom" in str(info.value)


def test_a_symlink_loop_on_the_command_line_is_one_error(tmp_path, run_cli):
    (tmp_path / "loop.py").symlink_to(tmp_path / "loop.py")
    (tmp_path / "ok.py").write_text("import torch\nx = torch.zeros(2).cuda()\n")
    proc = run_cli("migrate", "loop.py", "ok.py", cwd=tmp_path, check_rc=2)
    assert "loop.py:1:1: error: cannot read:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert ".cuda()" not in (tmp_path / "ok.py").read_text()


# Splats a rule cannot see, CUDA-only code under availability guards, per-rank saves, devices
# that are None, indices or not devices at all, and the findings that name them are examples
# of their rules (their `findings` say a finding's line, state and what it names).


# -- files and processes ------------------------------------------------------------------
CUDA_FILE = "import torch\nx = torch.zeros(2).cuda()\n"


def test_a_pep263_file_is_read_and_written_in_its_encoding(tmp_path, run_cli):
    path = tmp_path / "legacy.py"
    path.write_bytes(b'# -*- coding: latin-1 -*-\nimport torch\nname = "caf\xe9"\n'
                     b"x = torch.zeros(2).cuda()\n")
    run_cli("migrate", "legacy.py", cwd=tmp_path, check_rc=0)
    data = path.read_bytes()
    assert b'name = "caf\xe9"\n' in data and b".cuda()" not in data
    compile(data, "legacy.py", "exec")  # Python reads it in the encoding it declares


def test_a_killed_runs_temporary_files_are_removed_by_the_next_run(tmp_path, run_cli):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(CUDA_FILE)
    stale = tmp_path / "pkg" / ".train.py.k3x_9qz1.tpukit"
    stale.write_text("half")
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    keep = tmp_path / "pkg" / ".notes.tpukit"  # not of our naming
    keep.write_text("mine")
    live = tmp_path / "pkg" / ".run.json.a1b2c3d4.tpukit"  # another tpukit writing right now
    live.write_text("{")
    run_cli("migrate", "pkg", cwd=tmp_path, check_rc=0)
    assert not stale.exists() and keep.exists() and live.exists()
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == [
        ".notes.tpukit", ".run.json.a1b2c3d4.tpukit", "train.py"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_rewritten_file_keeps_its_owner_and_mode(tmp_path, run_cli):
    path = tmp_path / "train.py"
    path.write_text(CUDA_FILE)
    os.chown(path, 4321, 4322)
    path.chmod(0o640)
    run_cli("migrate", "train.py", cwd=tmp_path, check_rc=0)
    info = path.stat()
    assert ".cuda()" not in path.read_text()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (4321, 4322, 0o640)


def test_fixes_of_a_file_that_was_not_written_are_not_counted(tmp_path, run_cli):
    path = tmp_path / "train.py"
    path.write_text(CUDA_FILE)
    path.chmod(0o444)
    proc = run_cli("migrate", "train.py", cwd=tmp_path, check_rc=2)
    assert "read-only" in proc.stderr
    assert "(0 fixes applied)" in proc.stdout, proc.stdout


# -- import side effects: what a package module runs when imported --------------------------
PACKAGE_MODULE = """
import torch

FIRST_CUDA_DEVICE = torch.device("cuda", index=0)
if torch.cuda.device_count() > 1:
    pass

def load(x, device: torch.device = torch.device("cuda"), index=torch.cuda.current_device()):
    return x.to(torch.device("cuda")), torch.cuda.device_count()
"""


def test_a_package_module_does_not_start_the_runtime_when_imported(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    module = tmp_path / "functional.py"
    # the user's own package module (named, or imported by a named script): ported, but
    # nothing it runs at import starts the runtime (library code keeps its CUDA queries)
    result = migrate_source(textwrap.dedent(PACKAGE_MODULE).lstrip("\n"), str(module), PROGRAM)
    new = result.new_source
    assert 'FIRST_CUDA_DEVICE = torch.device("xla")\n' in new
    assert "if _xla_launch_process_count() > 1:" in new
    assert 'device: torch.device = torch.device("xla"), index=torch.cuda.current_device()' in new
    # In the function body, at call time, the runtime may start.
    assert "return x.to(torch_xla.device()), torch_xla.device_count()\n" in new
    assert [f.code for f in result.findings if not f.applied] == ["TPU110"]
    assert migrate_source(new, str(module), PROGRAM).new_source == new
    library = migrate_source(textwrap.dedent(PACKAGE_MODULE).lstrip("\n"), str(module), ALL)
    assert "torch.cuda.device_count()" in library.new_source.split("def load")[1]


def test_a_scripts_top_level_is_its_program():
    new = out(PACKAGE_MODULE)
    assert "FIRST_CUDA_DEVICE = torch_xla.device()\n" in new
    assert "if torch_xla.device_count() > 1:" in new


def test_a_package_module_imports_torch_xla_where_only_functions_use_it(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    module = str(tmp_path / "ops.py")
    source = 'import torch\n\n\ndef move(x):\n    """Doc."""\n    return x.cuda()\n'
    # the user's own package module: torch_xla imported in the function that uses it
    new = migrate_source(source, module, PROGRAM).new_source
    assert new == ('import torch\n\n\ndef move(x):\n    """Doc."""\n    import torch_xla\n'
                   "    return x.to(torch_xla.device())\n")
    assert migrate_source(new, module, PROGRAM).new_source == new
    # library mode: in the branch that runs once the program has imported torch_xla
    new = migrate_source(source, module, ALL).new_source
    assert ('    if _tpukit_on_xla():\n        import torch_xla\n'
            "        return x.to(torch_xla.device())\n    else:\n        return x.cuda()\n") in new
    assert migrate_source(new, module, ALL).new_source == new
    compile(new, module, "exec")


def test_a_flag_a_guard_sets_keeps_the_guard_where_it_decides_unported_cuda():
    # torch's checkpoint stager: the flag the guard turns off decides a CUDA-only call
    # (torch.cuda._pin_memory_utils, which no rule ports) in another method
    stager = ("import torch\nimport torch.cuda._pin_memory_utils as pin_utils\n\nclass Stager:\n"
              "    def __init__(self, {flag}=False):\n"
              "        if {flag} and not torch.cuda.is_available():\n"
              "            self.{flag} = False\n        else:\n            self.{flag} = {flag}\n\n"
              "    def stage(self, storage):\n        if self.{flag}:\n"
              "            pin_utils.pin_memory(storage.data_ptr(), storage.nbytes())\n")
    for flag in ("pin_memory", "keep"):  # what the flag is called decides nothing
        assert "and not torch.cuda.is_available():" in fixed_point(stager.format(flag=flag))
    # a flag that decides only what a rule ports (TPU301 drops `.pin_memory()` on XLA): the
    # guard is ported, whatever the flag is called
    for flag in ("pin_memory", "flag"):
        new = fixed_point(f"import torch\n\ndef stage({flag}):\n"
                          f"    if {flag} and not torch.cuda.is_available():\n"
                          f"        {flag} = False\n"
                          f"    return tensor.pin_memory() if {flag} else tensor\n")
        assert "torch.cuda" not in new and f"return tensor if {flag} else tensor" in new


def test_a_library_module_that_imports_a_cuda_only_library_is_not_rewritten(tmp_path):
    # bitsandbytes' triton kernels: the module imports triton; its name says nothing
    package = tmp_path / "lib" / "ops"
    package.mkdir(parents=True)
    (tmp_path / "lib" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    source = "import torch\nimport triton\nx = torch.zeros(2).cuda()\n"
    result = migrate_source(source, str(package / "quant.py"), ALL)
    assert result.new_source == source
    moves = [f for f in result.findings if f.code == "TPU102"]
    assert [f.applied for f in moves] == [False] and "CUDA's own code" in moves[0].message
    # a module called after CUDA that imports no CUDA-only library is ported (confined)
    plain = "import torch\nx = torch.zeros(2).cuda()\n"
    (tmp_path / "lib" / "triton_ops").mkdir()
    (tmp_path / "lib" / "triton_ops" / "__init__.py").write_text("")
    named = migrate_source(plain, str(tmp_path / "lib" / "triton_ops" / "cuda_quant.py"), ALL)
    assert "if _tpukit_on_xla():" in named.new_source
    # the user's own package module is ported whole, whatever it imports
    program = migrate_source(source, str(package / "quant.py"), PROGRAM)
    assert ".cuda()" not in program.new_source


# -- the second sample's harmful classes (accelerate, deepspeed, transformers, torch) ------
def test_pytorchs_own_package_in_a_walked_folder_is_left_out(tmp_path, run_cli):
    """torch/fx/experimental/const_fold.py, imported by torch/__init__, gained `import
    torch_xla` (which imports torch): `import torch` broke. A named folder is still taken."""
    package = tmp_path / "vendor" / "torch"
    (package / "fx").mkdir(parents=True)
    for init in (package / "__init__.py", package / "fx" / "__init__.py"):
        init.write_text("")
    cuda = "import torch\nx = torch.randn(2).cuda()\n"
    (package / "fx" / "const_fold.py").write_text(cuda)
    (tmp_path / "vendor" / "train.py").write_text(cuda)
    proc = run_cli("migrate", "--format", "json", "vendor", cwd=tmp_path, check_rc=0)
    import json

    summary = json.loads(proc.stdout)["summary"]
    assert summary["framework_packages_skipped"] == ["vendor/torch"]
    assert (package / "fx" / "const_fold.py").read_text() == cuda
    assert ".cuda()" not in (tmp_path / "vendor" / "train.py").read_text()
    text = run_cli("migrate", "--check", "vendor", cwd=tmp_path).stdout
    assert "Left out PyTorch's own package vendor/torch" in text
    run_cli("migrate", "vendor/torch", cwd=tmp_path, check_rc=0)  # named: migrated
    assert ".cuda()" not in (package / "fx" / "const_fold.py").read_text()


def test_a_function_the_module_calls_at_import_does_not_start_the_runtime(tmp_path):
    """accelerate's test utils: `torch_device, device_count = get_backend()` at module level,
    and `require_multi_gpu(test_case)` decorators: both run when the module is imported."""
    (tmp_path / "__init__.py").write_text("")
    module = str(tmp_path / "testing.py")
    source = textwrap.dedent("""
    import unittest
    import torch
    def get_backend():
        return "cuda", torch.cuda.device_count()
    def require_multi_gpu(test_case):
        return unittest.skipUnless(torch.cuda.device_count() > 1, "needs GPUs")(test_case)
    def later():
        return torch.cuda.device_count()
    torch_device, device_count = get_backend()
    if __name__ == "__main__":
        print(later())
    """).lstrip("\n")
    result = migrate_source(source, module, PROGRAM)
    new = result.new_source
    assert 'return "cuda", _xla_launch_process_count()\n' in new
    # a function's name says nothing: the decorator's count is ported like any other
    assert "unittest.skipUnless(_xla_launch_process_count() > 1" in new  # run at import
    assert "return torch_xla.device_count()\n" in new  # called only by the program
    assert migrate_source(new, module, PROGRAM).new_source == new


def _try_extension(tmp_path, setup: str):
    """fairscale's FusedAdam lives in `try: from fairscale import fused_adam_cuda`; whether
    that module is a CUDA extension is what the package's build script says."""
    (tmp_path / "setup.py").write_text(setup)
    (tmp_path / "fairscale").mkdir()
    path = tmp_path / "fairscale" / "adam.py"
    source = textwrap.dedent("""
    import torch
    try:
        from fairscale import fused_adam_cuda
        class FusedAdam:
            def step(self, p):
                assert p.is_cuda
                buf = torch.cuda.IntTensor([0])
    except ImportError:
        pass
    x = torch.zeros(2).cuda()
    """).lstrip("\n")
    return migrate_source(source, str(path), ALL)


def test_a_try_block_around_a_cuda_extension_is_findings_only(tmp_path):
    """The build script builds `fairscale.fused_adam_cuda` with torch's CUDAExtension: it
    exists only where CUDA does, and its `.is_cuda` asserts feed CUDA kernels."""
    result = _try_extension(tmp_path, textwrap.dedent("""
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension as Ext
    setup(name="fairscale", ext_modules=[Ext(name="fairscale.fused_adam_cuda", sources=["a.cu"])],
          cmdclass={"build_ext": BuildExtension})
    """))
    assert "assert p.is_cuda\n" in result.new_source and "torch.cuda.IntTensor([0])" in result.new_source
    assert "x = torch.zeros(2).to(" in result.new_source  # outside the try: ported
    left = [f for f in result.findings if not f.applied]
    assert {f.code for f in left} == {"TPU103", "TPU121"}
    assert all("imports fairscale.fused_adam_cuda, which needs CUDA" in f.message for f in left)


def test_a_try_block_around_a_module_the_build_script_does_not_build_with_cuda_is_ported(tmp_path):
    """The same module built as a C++ extension (no CUDA): a name that says cuda is no CUDA."""
    result = _try_extension(tmp_path, textwrap.dedent("""
    from setuptools import setup
    from torch.utils.cpp_extension import CppExtension
    setup(name="fairscale", ext_modules=[CppExtension("fairscale.fused_adam_cuda", ["a.cpp"])])
    """))
    assert "assert p.is_cuda\n" not in result.new_source
    assert "torch.cuda.IntTensor([0])" not in result.new_source


# -- the third sample's harmful classes ----------------------------------------------------
CONFIG_CLASS = """\
from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist


@dataclass
class InitProcessGroupKwargs:
    backend: Optional[str] = "nccl"
    timeout: Optional[int] = None

    def to_kwargs(self):
        default = self.__class__().__dict__
        return {k: v for k, v in self.__dict__.items() if default[k] != v}


class Settings:
    dist_backend = "nccl"
"""


def test_a_backend_default_of_a_library_class_field_is_left(tmp_path):
    # accelerate's InitProcessGroupKwargs: `to_kwargs` sends only what differs from the
    # defaults, so after `backend = "xla"` a caller's own backend="nccl" reached
    # init_process_group on a TPU (ValueError: nccl is not available)
    (tmp_path / "__init__.py").write_text("")
    result = migrate_source(CONFIG_CLASS, str(tmp_path / "dataclasses.py"), ALL)
    assert result.new_source == CONFIG_CLASS
    left = [f for f in result.findings if f.code == "TPU401"]
    assert [f.location.line for f in left] == [9, 18] and not any(f.applied for f in left)
    assert "a field of `InitProcessGroupKwargs` in library code" in left[0].message
    # a script's own config class is its program's setting: ported
    assert 'backend: Optional[str] = "xla"' in out(CONFIG_CLASS)


def _package(tmp_path, source: str, name: str = "lib.py"):
    (tmp_path / "__init__.py").write_text("")
    return migrate_source(textwrap.dedent(source).lstrip("\n"), str(tmp_path / name), ALL)


def test_a_library_function_saving_what_it_was_given_keeps_torch_save(tmp_path):
    # timm's repghost_model_convert: xm.save would start the runtime (a later torch_xla.launch
    # fails) and write on the master only; torch.save writes XLA tensors too
    source = """
        import copy
        import torch

        def model_convert(model, save_path=None):
            model = copy.deepcopy(model)
            if save_path is not None:
                torch.save(model.state_dict(), save_path)
            return model

        def save_on_device(model, path):
            model.cuda()
            torch.save(model.state_dict(), path)
        """
    result = _package(tmp_path, source)
    assert "        torch.save(model.state_dict(), save_path)\n" in result.new_source
    # a library that moves to the device saves with torch.save too (peft's save_pretrained
    # decides itself which process writes; jukebox saved its alignments with xm.save, which
    # started the runtime for a model on the CPU)
    assert "    torch.save(model.state_dict(), path)\n" in result.new_source
    left = [f for f in result.findings if f.code == "TPU304" and not f.applied]
    assert [f.location.line for f in left] == [7, 12]
    assert all(f.severity.value == "info" for f in left)
    assert "which decides itself which process writes" in left[0].message
    # a script's helper is its program's: ported
    assert "xm.save(model.state_dict(), save_path)" in out(source)


def test_a_library_guard_that_only_moves_tensors_to_the_gpu_stays_cudas(tmp_path):
    # transformers' mxfp4 dequantizer: computing on the GPU when there is one; on a TPU the
    # move would start the runtime inside from_pretrained
    source = """
        import torch

        def dequantize(blocks, scales):
            if torch.cuda.is_available():
                blocks = blocks.cuda()
                scales = scales.cuda()
            return blocks * scales

        def on_device(x):
            if torch.cuda.is_available():
                x = x.cuda()
                x = x * 2
            return x
        """
    result = _package(tmp_path, source)
    first, second = result.new_source.split("def on_device")
    assert "    if torch.cuda.is_available():\n" in first
    # a library's test of the host's CUDA stays, whatever it guards (it computes there too)
    assert "    if torch.cuda.is_available():\n        x = x.cuda()\n" in second
    left = [f for f in result.findings if f.code == "TPU110" and not f.applied]
    assert [f.location.line for f in left] == [4, 10]
    assert "picks CUDA's path in library code" in left[0].message
    assert "if torch.cuda.is_available():" not in out(source)  # a script's move is the port


def test_a_library_guard_that_casts_is_not_a_move(tmp_path):
    source = """
        import torch

        def prepare(x):
            if torch.cuda.is_available():
                x = x.to(torch.float16)
            return x
        """
    result = _package(tmp_path, source)
    assert not [f for f in result.findings if "only to compute faster" in f.message]


def test_no_barrier_in_a_library_function_that_does_nothing_with_a_device(tmp_path):
    # DeepSpeed's superoffload step and ZenFlow's CPU-Adam child process: the barrier started
    # the XLA runtime (and claimed the TPU) where no XLA tensor ever is
    source = """
        import torch

        def optimizer_process(pipe, optimizer):
            while True:
                msg = pipe.recv()
                optimizer.step()
                pipe.send("done")

        def train(model, optimizer, batches):
            model.cuda()
            for x in batches:
                model(x.cuda()).sum().backward()
                optimizer.step()
        """
    result = _package(tmp_path, source)
    first, second = result.new_source.split("def train")
    # `optimizer` is a parameter nothing here gives an optimizer, and that loop runs no
    # backward: no training step to cut (and no finding); the second loop trains
    assert "sync()" not in first and "torch_xla.sync()" in second
    assert not [f for f in result.findings if f.code == "TPU303" and f.location.line < 9]
    script = out(source)  # a script's: its loop over host batches is fed by the device loader
    assert "sync()" not in script.split("def train")[0]
    assert "pl.MpDeviceLoader(batches, torch_xla.device())" in script


def test_no_barrier_where_a_library_function_keeps_all_its_cuda(tmp_path):
    # fairscale's layer profiler (`if device.type == "cuda": torch.cuda.synchronize(device)`
    # around each step) and ultralytics' profile_ops (`torch.cuda.empty_cache()`): what names
    # CUDA stays in library code, so the loop runs on the device the caller gave (the CPU on a
    # TPU host), where a barrier started the XLA runtime
    source = """
        import torch

        def profile_times(layers, batch, device):
            for layer in layers:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                y = layer(batch)
                y.sum().backward()
                optimizer.step()

        def profile_ops(model, x, device):
            torch.cuda.empty_cache()
            for _ in range(3):
                model(x.to(device)).sum().backward()
                optimizer.step()
        """
    result = _package(tmp_path, source)
    assert "torch_xla" not in result.new_source
    left = [f for f in result.findings if f.code == "TPU303"]
    # (`optimizer` is a global no code here sets: each loop is a training step by its backward)
    assert [f.location.line for f in left] == [5, 14] and not any(f.applied for f in left)
    assert all("picks itself" in f.message for f in left)
    # a script's loops are its program's
    assert out(source).count("optimizer.step()\n        torch_xla.sync()\n") == 2


def test_no_device_loader_where_a_library_keeps_its_cuda_or_cpu_choice(tmp_path):
    # fairscale's pipe benchmark: `device = cuda if available else cpu` stays (the CPU on a
    # TPU host), and MpDeviceLoader(loader, device) started the runtime for CPU batches
    source = """
        import torch

        def train(model, dataset, optimizer):
            device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
            loader = torch.utils.data.DataLoader(dataset)
            for batch in loader:
                model(batch.to(device)).sum().backward()
                optimizer.step()

        def train_on_gpu(model, dataset, optimizer):
            model.cuda()
            loader = torch.utils.data.DataLoader(dataset)
            for batch in loader:
                model(batch.cuda()).sum().backward()
                optimizer.step()
        """
    result = _package(tmp_path, source)
    first, second = result.new_source.split("def train_on_gpu")
    assert "MpDeviceLoader" not in first and "pl.MpDeviceLoader(loader" in second
    (left,) = [f for f in result.findings if f.code == "TPU301" and not f.applied]
    assert left.location.line == 6 and "CUDA-or-CPU choice stays" in left.message
    assert "MpDeviceLoader" in out(source).split("def train_on_gpu")[0]


def test_a_library_gloo_group_stays_and_its_nccl_group_is_ported(tmp_path):
    # fairscale's single-process pipe benchmark: a gloo group over tcp:// runs on a TPU host
    # as written; "xla://" wanted a launcher and XLA tensors
    source = """
        import torch.distributed as dist

        def cpu_group():
            dist.init_process_group(backend="gloo", rank=0, world_size=1,
                                    init_method="tcp://localhost:29500")

        def default_group():
            dist.init_process_group()

        def gpu_group():
            dist.init_process_group(backend="nccl" if dist.is_nccl_available() else "gloo")
        """
    result = _package(tmp_path, source)
    assert 'backend="gloo", rank=0' in result.new_source
    assert "    dist.init_process_group()\n" in result.new_source
    assert result.new_source.count('"xla"') == 1 and 'init_method="xla://"' in result.new_source
    left = sorted(f.location.line for f in result.findings if f.code == "TPU401"
                  and "names no NCCL" in f.message)
    assert left == [4, 8]
    assert out(source).count('init_process_group("xla"') == 3


def test_library_code_keeps_its_cuda_seeds(tmp_path):
    # ultralytics' init_seeds (run for CPU predictions too): torch_xla.manual_seed started the
    # XLA runtime, where torch.cuda.manual_seed only queues the seed without CUDA
    source = """
        import torch

        def init_seeds(seed):
            torch.manual_seed(seed)
            torch.cuda.manual_seed(seed)
            torch.cuda.manual_seed_all(seed)
        """
    (tmp_path / "__init__.py").write_text("")
    for target in ("xla", "torchtpu"):
        result = migrate_source(textwrap.dedent(source).lstrip("\n"), str(tmp_path / "lib.py"),
                                MigrateOptions(rules=ALL.rules, target=target, owner=Owner.LIBRARY))
        assert result.new_source == textwrap.dedent(source).lstrip("\n")
        left = [f for f in result.findings if f.code == "TPU113"]
        assert len(left) == 2 and all("queues the seed" in f.message for f in left)
    assert out(source).count("torch_xla.manual_seed(seed)") == 2


def test_a_library_spawn_keeps_its_process_count(tmp_path):
    # fairscale's spawn_for_all_world_sizes: `world_size` CPU processes over gloo on a TPU
    # host; torch_xla.launch started one per TPU device and the group waited for the rest
    source = """
        import torch
        import torch.multiprocessing as mp

        def test_runner(rank, world_size):
            torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)

        def spawn_for_all_world_sizes(world_size):
            mp.spawn(test_runner, args=(world_size,), nprocs=world_size, join=True)
        """
    for target in ("xla", "torchtpu"):
        (tmp_path / "__init__.py").write_text("")
        result = migrate_source(textwrap.dedent(source).lstrip("\n"), str(tmp_path / "lib.py"),
                                MigrateOptions(rules=ALL.rules, target=target, owner=Owner.LIBRARY))
        assert "mp.spawn(test_runner, args=(world_size,), nprocs=world_size" in result.new_source
        assert "xr.world_size()" not in result.new_source
        assert "set_tpu_launch_env" not in result.new_source
        (left,) = [f for f in result.findings if f.code == "TPU404"]
        assert left.location.line == 8 and not left.applied and "in library code" in left.message
    assert "torch_xla.launch(test_runner" in out(source)


def test_no_barrier_in_a_library_autograd_backward(tmp_path):
    # fairscale's OffloadFunction.backward: a barrier inside the backward of an autograd
    # Function cuts the graph of every step that runs it; the caller's step barrier cuts it
    source = """
        import torch

        class OffloadFunction(torch.autograd.Function):
            @staticmethod
            def backward(ctx, *grads):
                for shard in ctx.shards:
                    out = shard(ctx.inputs.cuda())
                    torch.autograd.backward(out, grads)
                    shard.weight.data.add_(shard.weight.grad, alpha=-0.1)
                return grads
        """
    result = _package(tmp_path, source)
    assert "torch_xla.sync()" not in result.new_source
    (left,) = [f for f in result.findings if f.code == "TPU303"]
    assert "inside `backward`" in left.message and not left.applied


@pytest.mark.parametrize("module", ["bitsandbytes/nn/modules.py", "quantizers/quantizer_bnb_4bit.py",
                                    "utils/bnb.py"])
def test_a_cuda_only_librarys_own_code_and_integration_are_not_rewritten(tmp_path, module):
    # bitsandbytes' own package and its integrations (transformers, diffusers, accelerate):
    # flipped, their CUDA checks put 4-bit models on XLA, where bitsandbytes has no kernels
    path = tmp_path / module
    path.parent.mkdir(parents=True)
    for folder in [path.parent, *path.parent.parents]:
        if folder == tmp_path:
            break
        (folder / "__init__.py").write_text("")
    # (what makes it bitsandbytes' code is that it imports bitsandbytes, not its path)
    source = ('import torch\nimport bitsandbytes as bnb\n\ndef update_device_map(device_map):\n'
              '    if torch.cuda.is_available():\n'
              '        device_map = {"": torch.cuda.current_device()}\n    return device_map\n')
    result = migrate_source(source, str(path), ALL)
    assert result.new_source == source
    assert result.findings and all(not f.applied for f in result.findings)
    assert any("bitsandbytes, a CUDA-only library" in f.message for f in result.findings)


def test_a_cuda_check_in_library_code_is_left(tmp_path):
    # transformers' generate: `valid_hardware = self.device.type == "cuda"` turns on
    # torch.compile with inductor, which raised KeyError: 'xla' on XLA (torch 2.9, XLA:CPU)
    source = """
        import torch

        def _valid_auto_compile_criteria(self):
            valid_hardware = self.device.type == "cuda" or self.compile_all
            return valid_hardware and not self.weight.is_cuda
        """
    result = _package(tmp_path, source)
    assert result.new_source == textwrap.dedent(source).lstrip("\n")
    left = [f for f in result.findings if f.code in ("TPU103", "TPU104")]
    assert sorted(f.code for f in left) == ["TPU103", "TPU104"]
    assert all(not f.applied and f.severity.value == "warning" for f in left)
    assert "in library code picks the library's CUDA path" in left[0].message
    assert 'self.device.type == "xla"' in out(source)  # a script's check is its program's


# A sampler: each iteration's result feeds the next (a script's gets a barrier per iteration).
SAMPLER = """
    @torch.no_grad()
    def {name}(self, idx, steps):
        for _ in range(steps):
            logits = self.head(idx.cuda())
            nxt = torch.multinomial(logits.softmax(-1), 1)
            idx = torch.cat((idx, nxt), 1)
        return idx
"""


@pytest.mark.parametrize("header,name,said", [
    # diffusers' pipelines import torch_xla themselves and call `xm.mark_step()` where they
    # want their graphs cut: a sync in a guidance loop, or around long-video chunks, is one
    # barrier too many
    ("import torch\ntry:\n    import torch_xla.core.xla_model as xm\nexcept ImportError:\n"
     "    xm = None\n\nclass Pipeline:", "generate", "imports torch_xla itself"),
    # transformers' xLSTM: a chunked inference loop in forward that carries its state
    ("import torch\n\nclass Model(torch.nn.Module):", "forward", "inside `forward`"),
])
def test_no_barrier_in_library_code_that_cuts_its_own_graphs_or_in_a_forward(tmp_path, header,
                                                                                name, said):
    source = header + textwrap.indent(SAMPLER.format(name=name), "    ")
    result = _package(tmp_path, source)
    assert "torch_xla.sync()" not in result.new_source
    (left,) = [f for f in result.findings if f.code == "TPU303"]
    assert not left.applied and said in left.message
    assert "torch_xla.sync()" in out(source)  # a script's loops are its program's


def test_a_backend_a_library_function_is_given_is_its_callers(tmp_path):
    # lightning's _init_dist_connection(cluster, torch_distributed_backend): CPU DDP passes
    # gloo, which runs on a TPU host too; "xla" in its place broke it
    source = """
        import torch

        def init_dist(global_rank, world_size, torch_distributed_backend="nccl", **kwargs):
            torch.distributed.init_process_group(torch_distributed_backend, rank=global_rank,
                                                 world_size=world_size, **kwargs)
        """
    result = _package(tmp_path, source)
    assert "init_process_group(torch_distributed_backend, rank=global_rank" in result.new_source
    (left,) = [f for f in result.findings if f.code == "TPU401"]
    assert not left.applied and "its caller passes" in left.message and "`init_dist`" in left.message
    assert 'init_process_group("xla"' in out(source)  # a script's group is its program's


def test_no_device_loader_in_a_library_loop_that_does_nothing_with_a_device(tmp_path):
    # mmengine's EpochBasedTrainLoop.run_epoch: the runner trains where mmengine's
    # get_device() says (the CPU on a TPU host); MpDeviceLoader started the runtime there
    source = """
        import torch

        class Loop:
            def __init__(self, dataset):
                self.dataloader = torch.utils.data.DataLoader(dataset)

            def run_epoch(self):
                self.runner.model.train()
                for idx, data_batch in enumerate(self.dataloader):
                    self.run_iter(idx, data_batch)

            def run_on(self, model):
                model.cuda()
                for batch in self.dataloader:
                    model(batch)
        """
    result = _package(tmp_path, source)
    first, second = result.new_source.split("def run_on")
    assert "enumerate(self.dataloader)" in first and "MpDeviceLoader" in second
    (left,) = [f for f in result.findings if f.code == "TPU301" and not f.applied]
    assert left.location.line == 9 and left.severity.value == "info"
    assert "MpDeviceLoader" in out(source).split("def run_on")[0]  # a script's loop: wrapped


def test_an_xla_string_the_port_writes_asks_for_torch_xla_in_its_function(tmp_path):
    source = """
        import torch

        def run(model, x):
            device_type = "cuda"
            with torch.autocast(device_type=device_type):
                return model(x)
        """
    # library mode: the "xla" string is in the branch that runs once torch_xla is imported
    # (its import registered the device), so nothing imports it again
    new = _package(tmp_path, source).new_source
    assert '    if _tpukit_on_xla():\n        device_type = "xla"\n' in new
    assert "import torch_xla" not in new
    # the user's own package module imports it in the function
    program = migrate_source(textwrap.dedent(source).lstrip("\n"), str(tmp_path / "lib.py"),
                             PROGRAM).new_source
    assert 'device_type = "xla"' in program and "    import torch_xla\n" in program


def test_a_library_s_tests_for_the_gpu_stay_with_what_they_choose(tmp_path):
    # accelerate's Megatron-LM integration: `assert torch.cuda.is_available(), "Megatron
    # requires CUDA."` became a test of the XLA runtime, true on a TPU; transformers'
    # continuous batching: `if torch.cuda.is_available(): torch.cuda.synchronize()` started the
    # runtime to synchronize a CPU model; accelerate's default_device returned the XLA device
    source = """
        import torch

        def initialize(args):
            assert torch.cuda.is_available(), "This integration requires CUDA."
            return args

        def step(model, batch):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            return model(batch).cuda()
        """
    result = _package(tmp_path, source)
    kept = textwrap.dedent(source).lstrip("\n")
    assert result.new_source.endswith(kept.replace(
        "    return model(batch).cuda()\n",
        "    if _tpukit_on_xla():\n        import torch_xla\n"
        "        return model(batch).to(torch_xla.device())\n"
        "    else:\n        return model(batch).cuda()\n").split("import torch\n", 1)[1])
    left = [f for f in result.findings if not f.applied]
    assert {f.location.line for f in left} == {4, 8, 9}
    assert "picks CUDA's path in library code" in left[0].message
    # a script asks for the accelerator it is ported to
    assert 'assert bool(xr.device_type()), "This integration requires CUDA."' in out(source)


def test_library_code_that_picks_among_vendors_is_left_to_the_library(tmp_path):
    # DeepSpeed's get_accelerator: `torch.cuda.device_count() == 0` before it looks for an XPU
    # became a count of XLA devices, which started the runtime in the launcher; accelerate's
    # default_device returned the XLA device where it returns the CPU on a TPU host
    source = """
        import torch

        def get_accelerator():
            name = "cpu"
            if hasattr(torch, "xpu"):
                if torch.cuda.device_count() == 0:
                    if torch.xpu.is_available():
                        name = "xpu"
            return name

        def default_device():
            if torch.cuda.is_available():
                return torch.device("cuda")
            elif is_npu_available():
                return torch.device("npu")
            return torch.device("cpu")

        def move(x):
            return x.cuda()
        """
    result = _package(tmp_path, source)
    dispatch, move = result.new_source.split("def move")
    assert dispatch.endswith(textwrap.dedent(source).lstrip("\n").split("def move")[0].split(
        "import torch\n", 1)[1])
    assert "x.to(torch_xla.device())" in move
    left = [f for f in result.findings if not f.applied]
    assert {f.location.line for f in left} >= {6, 13} and "picks among vendors" in left[0].message
    assert "torch_xla.device_count() == 0" in out(source)  # a script's: ported


def test_another_vendor_s_module_of_a_library_is_that_vendor_s_code(tmp_path):
    # DeepSpeed's accelerator/npu_accelerator.py: its pin_memory is the NPU's
    # (it imports torch_npu: that is what makes it the NPU's, not its file name)
    body = "class Accelerator:\n    def move(self, tensor):\n        return tensor.cuda()\n"
    source = "import torch_npu\n\n\n" + body
    result = _package(tmp_path, source, name="accelerator.py")
    assert result.new_source == source
    assert any("another vendor's code (it imports torch_npu)" in f.message
               for f in result.findings)
    assert _package(tmp_path, body, name="npu_accelerator.py").changed
    # ... or it uses another vendor's torch namespace and nothing of CUDA's
    uses = ("import torch\n\n\nclass Accelerator:\n    def sync(self):\n"
            "        torch.npu.synchronize()\n\n    def move(self, tensor):\n"
            "        return tensor.cuda()\n")
    assert not _package(tmp_path, uses, name="accelerator.py").changed
    assert _package(tmp_path, uses.replace("torch.npu.synchronize()", "torch.cuda.synchronize()"),
                    name="accelerator.py").changed


def test_a_library_loop_on_the_library_s_own_device_gets_no_barrier(tmp_path):
    # DeepSpeed's Ulysses sp_fwd_loss_bwd: batches go to `self.device` (the CPU on a TPU
    # host); `torch_xla.sync()` after its backward started the runtime in every process
    source = """
        import torch

        class Trainer:
            def __init__(self, model):
                self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

            def steps(self, batches):
                for batch in batches:
                    loss = self.model(batch.to(self.device))
                    loss.backward()
                    self.optimizer.step()

            def moved_steps(self, batches):
                for batch in batches:
                    loss = self.model(batch.cuda())
                    loss.backward()
                    self.optimizer.step()
        """
    result = _package(tmp_path, source)
    own, cuda = result.new_source.split("def moved_steps")
    assert "torch_xla.sync()" not in own and "torch_xla.sync()" in cuda
    (left,) = [f for f in result.findings if f.code == "TPU303" and not f.applied]
    assert left.location.line == 11 and "the library picks itself" in left.message


def test_every_package_module_the_user_names_is_the_program(tmp_path, run_cli):
    # minGPT's `tpukit migrate .`: the repository's own package is the user's program, ported
    # whole (its trainer's `'cuda' if torch.cuda.is_available() else 'cpu'` stayed, and the
    # port trained on the CPU on a TPU host); only --library-mode keeps a package's CUDA tests
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text("")
    util = ("import torch\n\n\ndef pick():\n    if torch.cuda.is_available():\n"
            "        return torch.device('cuda')\n    return torch.device('cpu')\n")
    (tmp_path / "proj" / "util.py").write_text(util)
    (tmp_path / "train.py").write_text("from proj.util import pick\nprint(pick())\n")
    for named in ("proj", ".", "train.py", "proj/util.py"):
        proc = run_cli("migrate", "--diff", named, cwd=tmp_path)
        assert "+    if bool(xr.device_type()):\n" in proc.stdout, named
    library = run_cli("migrate", "--diff", "--library-mode", "proj", cwd=tmp_path)
    assert "+++" not in library.stdout
    assert "picks CUDA's path in library code" in library.stdout + library.stderr


def test_a_folder_marked_as_a_library_is_never_rewritten(tmp_path, run_cli):
    (tmp_path / "vendor" / "lib").mkdir(parents=True)
    (tmp_path / "vendor" / "lib" / "__init__.py").write_text("")
    cuda = "import torch\nx = torch.zeros(2).cuda()\n"
    (tmp_path / "vendor" / "lib" / "ops.py").write_text(cuda)
    (tmp_path / "train.py").write_text("import torch\nfrom vendor.lib import ops\ny = torch.ones(2).cuda()\n")
    proc = run_cli("migrate", "--library", "vendor", ".", cwd=tmp_path, check_rc=0)
    assert (tmp_path / "vendor" / "lib" / "ops.py").read_text() == cuda
    assert ".cuda()" not in (tmp_path / "train.py").read_text()
    assert "Left 2 files of someone else's code" in proc.stdout
    # the same from [tool.tpukit] library, as JSON
    (tmp_path / "train.py").write_text("import torch\nfrom vendor.lib import ops\ny = torch.ones(2).cuda()\n")
    (tmp_path / "pyproject.toml").write_text('[tool.tpukit]\nlibrary = ["vendor"]\n')
    proc = run_cli("migrate", "--check", "--format", "json", ".", cwd=tmp_path, check_rc=1)
    import json
    left = json.loads(proc.stdout)["summary"]["library_files_left"]
    assert sorted(entry["path"] for entry in left) == ["vendor/lib/__init__.py", "vendor/lib/ops.py"]
    assert all("library folder" in entry["why"] for entry in left)


def test_a_file_of_an_installed_package_is_someone_else_s(tmp_path, run_cli):
    # named explicitly or not: a file pip installed (under site-packages, or listed in a
    # dist-info RECORD beside it, as `pip install --target` leaves it) is not the user's
    site = tmp_path / "deps"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("")
    cuda = "import torch\nx = torch.zeros(2).cuda()\n"
    (site / "pkg" / "ops.py").write_text(cuda)
    (site / "pkg-1.0.dist-info").mkdir()
    (site / "pkg-1.0.dist-info" / "RECORD").write_text("pkg/__init__.py,,\npkg/ops.py,,\n")
    proc = run_cli("migrate", "deps/pkg/ops.py", cwd=tmp_path)
    assert (site / "pkg" / "ops.py").read_text() == cuda
    assert "part of an installed package" in proc.stdout
    run_cli("migrate", "--library-mode", "deps/pkg/ops.py", cwd=tmp_path)
    assert ('if _tpukit_on_xla():\n    x = torch.zeros(2).to(torch.device("xla"))\nelse:\n'
            "    x = torch.zeros(2).cuda()\n") in (site / "pkg" / "ops.py").read_text()
