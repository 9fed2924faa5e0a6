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
