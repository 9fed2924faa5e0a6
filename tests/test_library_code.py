"""What real library code taught us (issue 17: 13 packages, 3.5M lines): crashes, splats the
rules cannot see, CUDA-only code under availability guards, per-rank saves, and the files."""

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


# A case whose whole check is what the migration writes (and its codes) is an example in its
# rule's file instead (rules/TPUnnn-*.toml, `[[examples]]`, run by tests/test_rules.py).


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


# -- splats: an argument a rule cannot see is never dropped, a keyword never collides -------
SPLAT_HEADER = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler
scaler = torch.cuda.amp.GradScaler()
"""


@pytest.mark.parametrize("call,expected", [
    ("DDP(model, **kwargs)", "DDP(model, **kwargs)"),
    ("DDP(module, *args, **kwargs)", "DDP(module, *args, **kwargs)"),
    ("DDP(model, device_ids=[rank], **kw)", "DDP(model, **kw)"),
    ("DistributedSampler(ds, **kw)", "DistributedSampler(ds, **kw)"),
    ("dist.init_process_group(backend='nccl', **kw)", "dist.init_process_group(backend='xla', **kw)"),
    ("dist.init_process_group(**kw)", "dist.init_process_group(**kw)"),
    ("scaler.step(opt, **kw)", "opt.step(**kw)"),
    ("scaler.step(opt, *args)", "opt.step(*args)"),
    ("torch.compile(fn, **cfg)", "torch.compile(fn, **cfg)"),
    ("torch.autocast('cuda', **kw)", "torch.autocast('cuda', **kw)"),
    ("torch.utils.data.DataLoader(ds, **kw)", "torch.utils.data.DataLoader(ds, **kw)"),
    ("x.cuda(**kw)", "x.cuda(**kw)"),
    ("torch.cuda.manual_seed(*seeds)", "torch.cuda.manual_seed(*seeds)"),
])
def test_splats_are_kept_and_keywords_never_collide_with_them(call, expected):
    new = fixed_point(SPLAT_HEADER + f"result = {call}\n")
    assert f"result = {expected}\n" in new


def test_a_splat_the_rewrite_would_lose_is_a_finding_for_a_person():
    found = {f.code: f for f in migrate(SPLAT_HEADER + "f = torch.compile(fn, **cfg)\n"
                                        "m = DDP(model, **kwargs)\n").findings}
    assert not found["TPU408"].applied and "`backend=` may be in `**cfg`" in found["TPU408"].message
    assert not found["TPU402"].applied and "**kwargs" in found["TPU402"].message


def test_sampler_positional_arguments_keep_their_places():
    # in a script that starts its processes and makes no process group (xmp.spawn after the
    # port), None (the default) asks a group that does not exist: the runtime's numbers
    spawned = "import torch.multiprocessing as mp\nmp.spawn(main, nprocs=2)\n"
    new = out(SPLAT_HEADER + "s = DistributedSampler(ds, None, None, False)\n" + spawned)
    assert "DistributedSampler(ds, xr.world_size(), xr.global_ordinal(), False)" in new
    new = out(SPLAT_HEADER + "s = DistributedSampler(ds, torch.cuda.device_count(), r, False)\n")
    assert "DistributedSampler(ds, xr.world_size(), r, False)" in new
    # a library's sampler asks the default group, which the ported script makes
    new = out(SPLAT_HEADER + "s = DistributedSampler(ds, None, None, False)\n")
    assert "DistributedSampler(ds, None, None, False)" in new


# -- availability guards over CUDA-only code ----------------------------------------------
def test_a_guard_over_a_cuda_stream_stays_false_on_xla():
    source = """
    import torch

    def stream(device):
        if torch.cuda.is_available():
            return torch.cuda.Stream(device)
        return None
    """
    result = migrate(source)
    assert result.new_source == textwrap.dedent(source).lstrip("\n")
    guard = next(f for f in result.findings if f.code == "TPU110")
    assert not guard.applied and "torch.cuda.Stream" in guard.message


# (the other guarded calls are examples of their rules: TPU110, TPU112, TPU907, TPU102,
# TPU911, TPU910)
@pytest.mark.parametrize("guarded,rewritten", [
    ("e = torch.cuda.Event()", True),  # a host timer on XLA (TPU115)
])
def test_a_guard_is_rewritten_only_when_what_it_guards_is_migrated(guarded, rewritten):
    new = fixed_point(f"import torch\nif torch.cuda.is_available() and x:\n    {guarded}\n")
    assert ("torch.cuda.is_available() and x" not in new) is rewritten


@pytest.mark.parametrize("after,rewritten", [
    # fairscale's pipe: fork_rng asks torch.cuda for every device in the list by default
    ("with torch.random.fork_rng(gpu_devices):\n        yield", False),
    ("with fork_rng(gpu_devices):\n        yield", False),
    ("with torch.random.fork_rng(gpu_devices, device_type=device.type):\n        yield", True),
    ("torch.cuda.comm.broadcast(t, gpu_devices)", False),
    ("print(len(gpu_devices))", True),
    ("with torch.random.fork_rng(other):\n        yield", True),
])
def test_what_a_guard_fills_is_followed_to_the_calls_after_it(after, rewritten):
    source = ("import torch\nfrom torch.random import fork_rng\n\n"
              "def restore(device, t, other):\n    gpu_devices = []\n"
              "    if device.type == \"cuda\":\n        gpu_devices.append(device)\n"
              f"    {after}\n")
    result = migrate(source)
    assert ('if device.type == "xla":' in result.new_source) is rewritten
    if not rewritten:
        guard = next(f for f in result.findings if f.code == "TPU104")
        assert not guard.applied and "gpu_devices" in guard.message and guard.location.line == 6


# -- per-rank saves -----------------------------------------------------------------------
@pytest.mark.parametrize("save", [
    'rank = torch.distributed.get_rank()\ntorch.save({"rng": state}, f"rng_state_{rank}.pth")',
    'torch.save([rng], os.path.join(output_dir, f"rng_{torch.distributed.get_rank()}.pth"))',
    'process_index = int(os.environ["RANK"])\n'
    'output_rng_file = output_dir.joinpath(f"{RNG_STATE_NAME}_{process_index}.pkl")\n'
    'torch.save(model.state_dict(), output_rng_file)',
])
def test_a_file_per_rank_is_still_written_by_every_rank(save):
    # the path is built from the rank (by dataflow, whatever the names)
    new = fixed_point(f"import os\nimport torch\nx = torch.zeros(1).cuda()\n{save}\n")
    assert "master_only=False)" in new and "torch.save(" not in new


def test_one_checkpoint_for_all_ranks_is_written_by_the_master():
    new = out('import torch\nx = torch.zeros(1).cuda()\ntorch.save(model.state_dict(), "m.pt")\n')
    assert 'xm.save(model.state_dict(), "m.pt")\n' in new


# -- devices that are None, indices or not devices at all ----------------------------------
def test_cuda_with_a_none_default_device_moves_to_the_xla_device():
    new = fixed_point("import torch\ndef move(x, device=None):\n    return x.cuda(device)\n")
    assert "return x.to(torch_xla.device())\n" in new


def test_current_device_used_as_a_device_is_the_device_not_its_index():
    new = fixed_point("""
    import torch
    n = torch.cuda.current_device()
    model.to(torch.cuda.current_device())
    m = load(device_map={"": torch.cuda.current_device()})
    """)
    assert "n = torch_xla.device().index\n" in new
    assert "model.to(torch_xla.device())\n" in new
    assert 'device_map={"": torch_xla.device()}' in new


def test_device_strings_built_from_a_choice_still_become_xla():
    new = fixed_point("import torch\nd = f\"{'cuda' if c else 'cpu'}:{rank}\"\n")
    assert "d = f\"{'xla' if c else 'cpu'}:{rank}\"\n" in new


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


def test_current_device_sent_to_a_device_helper_is_the_device():
    new = fixed_point("import torch\nfrom accelerate.utils import send_to_device\n"
                      "data = send_to_device(data, torch.cuda.current_device())\n")
    assert "send_to_device(data, torch_xla.device())" in new


def test_a_loader_accelerate_prepared_is_not_wrapped_again():
    new = fixed_point("""
    import torch
    from accelerate import Accelerator
    accelerator = Accelerator()
    train_dl, model, optimizer = accelerator.prepare(train_dl, model, optimizer)
    for batch in train_dl:
        out = model(batch.cuda())
    """)
    assert "for batch in train_dl:\n" in new and "MpDeviceLoader" not in new
    stepped = fixed_point("""
    import torch
    from accelerate import Accelerator
    accelerator = Accelerator()
    dl, model, opt = accelerator.prepare(dl, model, opt)
    for batch in dl:
        loss = model(batch.cuda())
        opt.step()
    """)
    assert "torch_xla.sync()" not in stepped  # accelerate's loader cuts the graph per batch


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


def test_a_process_group_with_a_splat_keeps_its_rendezvous_and_is_a_fixed_point():
    new = fixed_point("""
    import os
    import torch.distributed as dist
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group(backend="nccl", world_size=int(os.environ["WORLD_SIZE"]), **kwargs)
    """)
    assert 'os.environ["MASTER_PORT"] = "29500"\n' in new  # env:// still needs it
    assert 'backend="xla", world_size=xr.world_size(), **kwargs)' in new


def test_a_rank_given_as_a_device_index_is_the_device():
    new = fixed_point("import os\nimport torch\nbackend = 'nccl'\n"
                      "args = dict(module=model, device_id=int(os.environ['LOCAL_RANK']))\n"
                      "rank = int(os.environ['LOCAL_RANK'])\n")
    assert "device_id=torch_xla.device())" in new and "rank = xr.local_ordinal()" in new


def test_what_a_chosen_message_says_decides_nothing():
    """A label the guard picks ("GPU"): a string's words are no CUDA; the guard is ported."""
    new = fixed_point('import torch\nwhere = "GPU" if torch.cuda.is_available() else "CPU"\n'
                      "x = torch.zeros(1).cuda()\n")
    assert "torch.cuda.is_available()" not in new


def test_a_negated_guard_that_returns_guards_what_follows():  # diffusers' testing_utils
    source = """
    import torch

    def require_big_gpu(test_case):
        if not torch.cuda.is_available():
            return unittest.skip("test requires PyTorch CUDA")(test_case)
        device_properties = torch.cuda.get_device_properties(0)
        return test_case

    def sync():
        if not torch.cuda.is_available():
            return
        torch.cuda.synchronize()
    """
    new = fixed_point(source)
    assert new.count("if not torch.cuda.is_available():") == 1  # the first; the second is ported
    assert "if not bool(xr.device_type()):\n        return\n    torch_xla.sync()" in new


@pytest.mark.parametrize("function", [
    "def calibrate(im):\n    import tensorrt as trt\n    return im.to('cuda')\n",
])
def test_cuda_only_functions_are_not_rewritten(function):
    result = migrate("import torch\n" + function)
    assert result.new_source == "import torch\n" + function
    assert result.findings and not any(f.applied for f in result.findings)
    assert all("not rewritten" in f.message for f in result.findings if f.code in ("TPU101", "TPU102"))


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


def test_a_per_rank_path_built_in_two_steps_is_still_per_rank():  # accelerate's checkpointing
    new = fixed_point('import torch\nx = torch.zeros(1).cuda()\n'
                      'process_index = torch.distributed.get_rank()\nstates = {}\n'
                      'states_name = f"{RNG_STATE_NAME}_{process_index}.pkl"\n'
                      "output_states_file = output_dir.joinpath(states_name)\n"
                      "torch.save(states, output_states_file)\n")
    assert "xm.save(states, output_states_file, master_only=False)" in new


def test_current_device_returned_by_a_get_device_function_is_the_device():
    # what a function returns is a device where its callers use it as one
    new = fixed_point("import torch\ndef get_device(model):\n    return torch.cuda.current_device()\n"
                      "def device_index():\n    return torch.cuda.current_device()\n"
                      "x = torch.zeros(1).to(get_device(m))\n")
    assert "def get_device(model):\n    return torch_xla.device()\n" in new
    assert "def device_index():\n    return torch_xla.device().index\n" in new


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


def test_numpy_arrays_get_no_tensor_rewrites():
    # transformers' processors and deepspeed's data analyzer: a masked write and a slice at an
    # offset on NumPy arrays (masked_fill_/index_select would raise AttributeError)
    from tpukit.migrate.engine import MigrateOptions, migrate_source
    from tpukit.rules import select_rules

    source = (
        "import numpy as np\nimport torch\n\nDEVICE = torch.device('cuda')\n\n"
        "def types(ids, k):\n"
        "    array_ids = np.array(ids)\n"
        "    mm = np.zeros_like(ids)\n"
        "    mm[array_ids == k] = 1\n"
        "    return mm\n\n"
        "def write(buff, offsets, device):\n"
        "    buff = buff.to(device)\n"
        "    buff = buff.cpu().detach().numpy()\n"
        "    out = []\n"
        "    for i in range(len(offsets) - 1):\n"
        "        out.append(buff[offsets[i]:offsets[i + 1]])\n"
        "    return out\n\n"
        "def top_k(logits, v):\n"
        "    logits = torch.softmax(logits, -1)\n"
        "    logits[logits < v] = 0.0\n"
        "    return logits\n")
    out = migrate_source(source, "p.py", MigrateOptions(rules=select_rules([], []))).new_source
    assert "mm[array_ids == k] = 1" in out and "buff[offsets[i]:offsets[i + 1]]" in out
    assert "logits.masked_fill_(logits < v, 0.0)" in out   # a tensor still gets it


def test_an_is_cuda_check_that_picks_a_kernel_by_name_is_left_with_an_info():
    # torch._numpy's lstsq: `driver = "gels" if a.is_cuda else "gelsd"` chose gels on XLA (wrong
    # answers for rank-deficient input); a device choice beside it is still ported
    from tpukit.findings import Severity
    from tpukit.migrate.engine import MigrateOptions, migrate_source
    from tpukit.rules import TARGETS, select_rules

    source = ('import torch\n\ndef lstsq(a, b):\n'
              '    driver = "gels" if a.is_cuda or b.is_cuda else "gelsd"\n'
              '    dev = "cuda" if a.is_cuda else "cpu"\n'
              '    return torch.linalg.lstsq(a, b, driver=driver), dev\n')
    for target in TARGETS:
        done = migrate_source(source, "l.py", MigrateOptions(rules=select_rules([], []), target=target))
        assert 'driver = "gels" if a.is_cuda or b.is_cuda else "gelsd"' in done.new_source
        assert 'dev = "cuda" if' not in done.new_source
        kept = [f for f in done.findings if f.code == "TPU103" and f.location.line == 4]
        assert len(kept) == 2 and all(f.severity is Severity.INFO and not f.needs_person for f in kept)
    # a CUDA device string on one side is a device choice, ported (its other side names no device)
    picked = migrate_source('import torch\ndef f(a):\n    return "cuda:0" if a.is_cuda else "nccl"\n', "l.py",
                            MigrateOptions(rules=select_rules([], [])))
    assert "a.is_cuda" not in picked.new_source


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


def test_a_negated_flag_that_picks_a_cuda_build_stays_cuda():
    """deepspeed's op builder: `build_for_cpu = not torch.cuda.is_available()` then `if not
    self.build_for_cpu: nvcc_args.append(...)`: rewritten, a TPU host tried an nvcc build."""
    # (what the flag guards is CUDA's by what it calls: cpp_extension's CUDA flags)
    result = migrate("""
    import torch
    from torch.utils.cpp_extension import load
    class Builder:
        def jit_load(self):
            self.build_for_cpu = not torch.cuda.is_available()
            args = []
            if not self.build_for_cpu and self.enable_bf16:
                return load(sources, extra_cuda_cflags=args)
            return None
    """)
    assert "self.build_for_cpu = not torch.cuda.is_available()\n" in result.new_source
    left = [f for f in result.findings if f.code == "TPU110"]
    assert len(left) == 1 and not left[0].applied and "extra_cuda_cflags" in left[0].message


def test_a_flag_whose_branches_are_ported_is_still_rewritten():
    """pytorch/examples' mnist: `use_cuda` guards a `cuda_kwargs` dict: a local's name says
    nothing, and the flag must become true on a TPU."""
    new = fixed_point("""
    import torch
    def main(args):
        use_cuda = not args.no_cuda and torch.cuda.is_available()
        if use_cuda:
            cuda_kwargs = {"num_workers": 1, "pin_memory": True}
            train_kwargs.update(cuda_kwargs)
        device = torch.device("cuda" if use_cuda else "cpu")
    """)
    assert "use_cuda = not args.no_cuda and bool(xr.device_type())\n" in new


def test_a_device_count_that_runs_a_cuda_only_loop_stays_cuda():
    result = migrate("""
    import torch
    def archs():
        ccs = []
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            ccs.append(f"{major}.{minor}")
        for i in range(torch.cuda.device_count()):
            print(i)
        return ccs
    """)
    new = result.new_source
    assert "for i in range(torch.cuda.device_count()):\n        major" in new
    assert "for i in range(torch_xla.device_count()):\n        print(i)" in new
    count = next(f for f in result.findings if f.location.line == 4)
    assert not count.applied and "0 on a TPU, so the loop does not run" in count.message


def test_a_test_that_asks_for_another_vendors_gpu_stays_false_on_a_tpu(tmp_path):
    """transformers' AWQ quantizer: `not cuda and not xpu` picks the CPU (IPEX) kernels and
    `(cuda or xpu)` casts bf16 to fp16 for the GPU kernels: a TPU has neither kernel."""
    source = """
    import torch
    def validate(version):
        if version == "gemm" and not torch.cuda.is_available() and not torch.xpu.is_available():
            version = "ipex"
        if dtype == torch.bfloat16 and (torch.cuda.is_available() or torch.xpu.is_available()):
            dtype = torch.float16
        return version
    """
    # library mode; in a program "is there CUDA" has one answer everywhere: ported
    result = _package(tmp_path, source)
    assert result.new_source == textwrap.dedent(source).lstrip("\n")
    assert result.findings and not any(f.applied for f in result.findings)
    first = source.split("        if dtype")[0] + "        return version\n"
    assert 'if version == "gemm" and not bool(xr.device_type()) and not torch.xpu' in out(first)


def test_an_accelerators_type_is_its_name_and_starts_nothing():
    """accelerate's notebook launcher reads `current_accelerator().type` in the parent right
    before a fork: `torch_xla.device().type` would start the runtime the children inherit."""
    new = fixed_point("""
    import torch
    def notebook_launcher(fn):
        device_type = torch.accelerator.current_accelerator().type if hasattr(torch, "accelerator") else "cuda"
        start_processes(fn, start_method="fork")
    """)
    assert 'device_type = "xla" if hasattr(torch, "accelerator") else "cuda"\n' in new
    assert "torch_xla" not in new


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


def test_a_process_group_with_its_own_store_is_left_with_its_environment():
    """accelerate's debug launcher: gloo over a FileStore in processes it forked itself."""
    source = """
    import os
    import torch
    def __call__(self, index):
        world_size = int(os.environ.get("WORLD_SIZE"))
        torch.distributed.init_process_group(
            "gloo", rank=index, store=torch.distributed.FileStore(rdv, world_size),
            world_size=world_size)
    """
    result = migrate(source)
    assert result.new_source == textwrap.dedent(source).lstrip("\n")
    [finding] = result.findings
    assert finding.code == "TPU401" and "its own `store=`" in finding.message


def test_a_loop_that_rebinds_its_own_target_feeds_nothing_forward():
    """diffusers' adapter pipeline: `for one_image in image: one_image = preprocess(one_image)`
    under no_grad got a sync per image, as if it were a sampler."""
    source = """
    import torch
    @torch.no_grad()
    def __call__(self, image, device):
        adapter_input = []
        for one_image in image:
            one_image = preprocess(one_image)
            one_image = one_image.cuda()
            adapter_input.append(one_image)
        return adapter_input
    """
    assert "sync" not in out(source)
    sampler = out("""
    import torch
    @torch.no_grad()
    def sample(model, idx, n):
        idx = idx.cuda()
        for _ in range(n):
            logits = model(idx)
            idx = torch.cat((idx, logits.argmax(-1)), dim=1)
        return idx
    """)
    assert "torch_xla.sync()" in sampler


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
def test_a_guard_that_picks_a_cuda_index_or_a_gpu_package_stays():
    """ultralytics' exporter: `if imx and device is None and torch.cuda.is_available():
    device = "0"`, and `cuda = torch.cuda.is_available()` choosing "onnxruntime-gpu"."""
    source = """
    import torch
    def export(self, imx):
        cuda = torch.cuda.is_available()
        check_requirements("onnxruntime-gpu" if cuda else "onnxruntime")
    """
    result = migrate(source)
    assert result.new_source == textwrap.dedent(source).lstrip("\n")
    assert [f.applied for f in result.findings] == [False]


def test_a_scaler_made_only_for_an_fp16_chosen_elsewhere_stays():
    """deepspeed's ZeRO: `if get_autocast_dtype() == torch.float16: self.scaler =
    GradScaler(...)` in a file that enters no autocast: fp16 stays, and so must its scaler
    (removed, fp16 training lost its loss scaling and its inf/NaN step skipping)."""
    source = """
    import torch
    class Optimizer:
        def __init__(self):
            if get_autocast_dtype() == torch.float16:
                self.scaler = torch.amp.GradScaler(device=get_accelerator().device_name())
        def backward(self, loss):
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
    """
    result = migrate(source)
    assert result.new_source == textwrap.dedent(source).lstrip("\n")
    [finding] = [f for f in result.findings if f.code == "TPU203"]
    assert not finding.applied and "chosen elsewhere and stays fp16" in finding.message
    entered = out(source.replace("self.scaler.scale(loss).backward()", (
        'with torch.autocast("cuda", dtype=torch.float16):\n'
        "                loss = loss * 1\n            self.scaler.scale(loss).backward()")))
    code = [line.split("#")[0] for line in entered.splitlines()]
    assert not any("GradScaler" in line for line in code)  # paired with a bf16 autocast: removed


def test_a_loop_that_yields_its_batches_is_a_loader_not_a_consumer():
    """lightning's _FabricDataLoader: the non-XLA branch's `for item in self._dataloader:
    yield move_data_to_device(item, self._device)` got an MpDeviceLoader."""
    new = out("""
    import torch
    from torch.utils.data import DataLoader
    class Wrapper:
        def __init__(self, ds):
            self._dataloader = DataLoader(ds, batch_size=4)
        def __iter__(self):
            for item in self._dataloader:
                yield move_data_to_device(item, self._device)
    def train(model, ds):
        loader = DataLoader(ds, batch_size=4)
        for x in loader:
            model(x.cuda())
    """)
    assert "for item in self._dataloader:\n" in new
    assert "for x in pl.MpDeviceLoader(loader" in new


def test_a_masked_write_through_another_tensors_mask_is_a_finding():
    """ultralytics' SAM: `point_embedding[labels == -1] = 0.0` with a B x N mask of a
    B x N x C tensor: masked_fill_ broadcasts from the right and raised."""
    result = migrate("""
    import torch
    def embed(pe, labels, logits, v):
        pe = pe.cuda()
        pe[labels == -1] = 0.0
        logits[logits < v[:, [-1]]] = -float("Inf")
    """)
    new = result.new_source
    assert "pe[labels == -1] = 0.0\n" in new
    assert 'logits.masked_fill_(logits < v[:, [-1]], -float("Inf"))' in new
    left = [f for f in result.findings if f.code == "TPU502" and not f.applied]
    assert len(left) == 1 and "made from another tensor" in left[0].message


def test_a_name_from_a_numpy_helper_gets_no_tensor_method():
    """transformers' mobilenet_v2 image processor: `label = to_numpy_array(label)` then
    `label[label == 0] = 255`: an ndarray has no masked_fill_."""
    new = out("""
    import numpy as np
    import torch
    def reduce_label(label):
        x = torch.zeros(2).cuda()
        label = np.asarray(label)
        label[label == 0] = 255
        return label
    """)
    assert "label[label == 0] = 255\n" in new and "masked_fill_" not in new


def test_a_gpu_count_is_not_the_xla_device_count():
    """transformers' SageMaker args: `self._n_gpu = torch.cuda.device_count()` became every
    chip of the host in one TPU process: the batch times 4-8 and a DataParallel on one chip.
    Next to a launch (`ngpus_per_node`, the ImageNet example) it is still the launch's count."""
    result = migrate("""
    import torch
    class Args:
        def _setup_devices(self):
            self._n_gpu = torch.cuda.device_count()
        def train_batch_size(self):
            return self.per_device_batch_size * max(1, self._n_gpu)
    """)
    [finding] = result.findings
    assert not finding.applied and "not the XLA device count" in finding.message
    launch = out("""
    import torch
    import torch.multiprocessing as mp
    def main():
        ngpus_per_node = torch.cuda.device_count()
        mp.spawn(main_worker, nprocs=ngpus_per_node)
    """)
    assert "ngpus_per_node = _xla_launch_process_count()" in launch


def test_an_import_of_torch_cuda_that_binds_torch_stays_an_import_of_torch():
    # ultralytics' utils/benchmarks.py: its only import of torch is `import torch.cuda`
    source = ("import torch.cuda\n\ndef f(device):\n    torch.cuda.synchronize()\n"
              "    return isinstance(device, torch.device)\n")
    new = out(source)
    assert new.startswith("import torch\n") and "torch.device" in new
    compile(new, "t.py", "exec")
    # with another import of torch it goes, as before
    new = out("import torch\nimport torch.cuda\n\ntorch.cuda.synchronize()\nx = torch.ones(1)\n")
    assert "import torch.cuda" not in new and new.count("import torch\n") == 1


def test_a_seed_inside_fork_rng_does_not_seed_the_xla_device_for_good():
    # peft's incremental PCA seeds torch inside fork_rng, which restores torch's generators only
    source = ("import torch\n\ndef svd(x, seed):\n    with torch.random.fork_rng(enabled=True):\n"
              "        torch.manual_seed(seed)\n        return torch.svd_lowrank(x)\n\n"
              "torch.manual_seed(0)\nx = torch.ones(2).cuda()\n")
    result = migrate(source)
    assert result.new_source.count("torch_xla.manual_seed") == 1  # the top-level one only
    assert "    torch_xla.manual_seed" not in result.new_source
    kept = [f for f in result.findings if f.code == "TPU118" and not f.applied]
    assert len(kept) == 1 and "fork_rng" in kept[0].message and kept[0].location.line == 5


def test_a_count_of_processes_to_start_leaves_the_runtime_unstarted():
    # accelerate's `accelerate launch`: the count goes to a launcher in another module, which
    # calls xmp.spawn; torch_xla.device_count() would start the runtime in the parent first
    # (a count given to a function that starts that many processes, whatever the names)
    new = out("import torch\nimport torch.multiprocessing as mp\n\ndef launch(fn):\n"
              "    count = torch.cuda.device_count()\n    start(fn, count)\n\n"
              "def start(fn, n):\n    mp.spawn(fn, nprocs=n)\n")
    assert "count = _xla_launch_process_count()" in new
    assert "torch_xla.device_count()" not in new
    assert "n = torch_xla.device_count()" in out("import torch\nn = torch.cuda.device_count()\n")


def test_what_a_cuda_only_call_is_given_stays_cudas():
    # transformers' is_torch_tf32_available: an XLA index given to get_device_properties
    # would name CUDA device 0, and the call stays CUDA's anyway
    source = ("import torch\n\ndef tf32():\n"
              "    return torch.cuda.get_device_properties(torch.cuda.current_device()).major\n"
              "\nn = torch.cuda.device_count()\n")
    result = migrate(source)
    assert "get_device_properties(torch.cuda.current_device())" in result.new_source
    assert "n = torch_xla.device_count()" in result.new_source
    assert any(f.code == "TPU110" and "get_device_properties" in f.message and not f.applied
               for f in result.findings)


def test_accelerate_prepared_loaders_and_models_are_left_to_accelerate():
    # accelerate's test_script: prepare_data_loader gives an MpDeviceLoaderWrapper on XLA
    # (wrapping it again syncs in the outer loader's thread: no batches), and
    # Accelerator.prepare points the optimizer at the moved parameters itself on XLA
    # (accelerator.py: "On TPUs, putting the model on the XLA device will create new
    # parameters..."); a model it is not given is a CPU baseline
    source = ("import torch\nfrom torch.utils.data import DataLoader\n"
              "from accelerate import Accelerator\nfrom accelerate.data_loader import prepare_data_loader\n\n"
              "def check(state):\n    dl = DataLoader(range(8), batch_size=2)\n"
              "    dl = prepare_data_loader(dl, state.device, put_on_device=True)\n"
              "    for batch in dl:\n        print(batch)\n\n"
              "def baseline():\n    model = RegressionModel()\n"
              "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    return model\n\n"
              "def trained(accelerator: Accelerator):\n    model = RegressionModel()\n"
              "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              "    model, optimizer = accelerator.prepare(model, optimizer)\n"
              "    x = torch.ones(1).cuda()\n")
    new = out(source)
    assert "MpDeviceLoader" not in new and "RegressionModel().to(" not in new
    # without accelerate the optimizer-before-device fix still applies
    plain = out(source.replace("    model, optimizer = accelerator.prepare(model, optimizer)\n", "")
                .replace("    dl = prepare_data_loader(dl, state.device, put_on_device=True)\n", ""))
    assert "model = RegressionModel().to(torch_xla.device())" in plain
    assert "pl.MpDeviceLoader(dl, torch_xla.device())" in plain


def test_a_backend_the_code_picks_for_its_device_is_left_with_its_ranks():
    # transformers' tensor parallelism: gloo on the CPU mesh it builds on a TPU host too
    source = ("import os\nimport torch\n\ndef init_tp(device_type):\n"
              "    rank = int(os.environ[\"RANK\"])\n    world_size = int(os.environ[\"WORLD_SIZE\"])\n"
              "    backend_map = {\"cuda\": \"nccl\", \"cpu\": \"gloo\", \"xpu\": \"xccl\"}\n"
              "    backend = backend_map.get(device_type)\n"
              "    torch.distributed.init_process_group(backend=backend, rank=rank, world_size=world_size)\n"
              "    x = torch.ones(1).cuda()\n")
    result = migrate(source)
    assert "init_process_group(backend=backend, rank=rank, world_size=world_size)" in result.new_source
    assert 'int(os.environ["RANK"])' in result.new_source
    left = next(f for f in result.findings if f.code == "TPU401")
    assert not left.applied and "picks for the device" in left.message
    # a backend from the command line (pytorch/examples' --dist-backend) is still ported
    new = out(source.replace("    backend_map = {\"cuda\": \"nccl\", \"cpu\": \"gloo\", \"xpu\": \"xccl\"}\n"
                             "    backend = backend_map.get(device_type)\n", "")
              .replace("backend=backend", "backend=args.dist_backend"))
    assert 'init_process_group("xla", init_method="xla://")' in new


def test_a_save_of_python_or_numpy_rng_state_stays_torch_save():
    # accelerate's save_accelerator_state; xm.save would write random.getstate()'s tuple as a
    # list and random.setstate() refuses it on load
    source = ("import random\nimport numpy as np\nimport torch\n\ndef save_rng(path):\n"
              "    states = {\"random_state\": random.getstate(),\n"
              "              \"numpy_random_seed\": np.random.get_state()}\n"
              "    torch.save(states, path)\n\nx = torch.ones(1).cuda()\n")
    result = migrate(source)
    assert "    torch.save(states, path)\n" in result.new_source
    left = next(f for f in result.findings if f.code == "TPU304")
    assert not left.applied and "random.setstate" in left.message
    assert "xm.save(states, path)" in out(source.replace("random.getstate()", "0").replace(
        "np.random.get_state()", "1"))


def test_cuda_of_a_class_from_another_package_is_left():
    # transformers' PreTrainedModel.to(): `module.cuda(device)` on hqq's HQQLinear, whose own
    # `.cuda(device)` moves to any device (CPU too); `.to(torch_xla.device())` would ignore it
    source = ("import torch\n\ndef to(self, device):\n    from hqq.core.quantize import HQQLinear\n"
              "    import optimum.quanto as oq\n    for module in self.modules():\n"
              "        if isinstance(module, HQQLinear):\n            module.cuda(device)\n"
              "        if isinstance(layer, (torch.nn.Linear, oq.nn.QLinear)):\n"
              "            layer.cuda(device)\n"
              "        if isinstance(block, (torch.nn.Linear, Block)):\n"
              "            block.cuda(device)\n    return self\n")
    result = migrate(source)
    assert "module.cuda(device)" in result.new_source and "layer.cuda(device)" in result.new_source
    assert "block.to(device)" in result.new_source  # torch's class, or this file's
    left = {f.location.line: f for f in result.findings if f.code == "TPU102" and not f.applied}
    assert "`HQQLinear` of hqq.core.quantize" in left[8].message
    assert "`oq.nn.QLinear` of optimum.quanto" in left[10].message
    assert 12 not in left


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


def test_module_of_a_data_parallel_name_in_another_library_method_is_left(tmp_path):
    # transformers' Trainer: `model = nn.DataParallel(model)` in _wrap_model made every
    # `model.module` of the file lose a `.module`, _save_tpu's `model.module.module` (XLA
    # FSDP's wrapper around the model) too: save_pretrained was skipped on TPU
    source = """
        import torch
        from torch import nn

        class Trainer:
            def _wrap_model(self, model):
                if self.args.n_gpu > 1:
                    model = nn.DataParallel(model)
                return model.module

            def _save_tpu(self):
                model = self.model
                model = model.module.module
                return model
        """
    new = _package(tmp_path, source).new_source
    assert "        model = model.module.module\n" in new
    assert "        return model\n" in new.split("def _save_tpu")[0]  # the wrapping scope's
    script = out(source)
    # a script's: what DataParallel wrapped is unwrapped; `self.model` (set nowhere here) is
    # no variable DataParallel wrapped, whatever it is called
    assert "        return model\n" in script.split("def _save_tpu")[0]
    assert "model = model.module.module\n" in script


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


def test_a_library_barrier_waits_on_its_callers_process_group(tmp_path):
    # lightning's DDPStrategy.barrier: its gloo branch is CPU DDP on a TPU host (XLAStrategy
    # has its own barrier); as xm.rendezvous it held no rank back there
    source = """
        import torch

        def barrier(self):
            if torch.distributed.get_backend() == "nccl":
                torch.distributed.barrier(device_ids=self.device_ids())
            else:
                torch.distributed.barrier()
        """
    result = _package(tmp_path, source)
    assert ('        xm.rendezvous("barrier") if torch.distributed.get_backend() == "xla"'
            ' else torch.distributed.barrier()\n') in result.new_source
    # a script that makes its own NCCL group is its program: its barrier is the rendezvous
    script = out(source.replace("def barrier(self):", "def barrier(self):\n"
                                "            torch.distributed.init_process_group('nccl')"))
    assert '        xm.rendezvous("barrier")\n' in script


def test_a_gpu_count_that_scales_a_batch_is_left_whatever_it_is_called():
    # transformers' `self._n_gpu` scaled the train batch: as torch_xla.device_count() it
    # counted every chip of the host in one TPU process. What decides is what the count
    # does (it multiplies a batch size), not what it or its function is called.
    for names in (("n_gpu", "get_gpu_count"), ("v1", "f2")):
        result = migrate("""
            import torch

            def {1}():
                return torch.cuda.device_count()

            {0} = torch.cuda.device_count()
            batch_size = 32 * max(1, {0})
            world = {1}()
            """.format(*names))
        (left,) = [f for f in result.findings if not f.applied]
        assert left.code == "TPU110" and left.location.line == 6
        assert "not the XLA device count" in left.message
        assert "    return torch_xla.device_count()\n" in result.new_source


def test_a_device_test_whose_other_branch_refuses_for_cuda_stays():
    # fairscale's pipe balance profile_sizes: CUDA memory around each layer's forward (0 on a
    # lazy XLA forward), so it refuses every device but CUDA
    source = """
        import torch

        def profile_sizes(module, device):
            if device.type != "cuda":
                raise ValueError("size profiler supports only CUDA device")
            total = torch.cuda.get_device_properties(device).total_memory
            return module(torch.zeros(2).to(device)), total

        def profile(module, device):
            if device.type != "cuda":
                raise ValueError("bad device")
            return module(torch.zeros(2).to(device))

        def timed(module, device):
            if device.type != "cuda":
                raise ValueError(f"{module} needs a GPU")
            return module(torch.zeros(2).to(device))
        """
    result = migrate(source)
    first, second = result.new_source.split("def profile(")
    assert '    if device.type != "cuda":\n' in first
    second, third = second.split("def timed(")
    # what follows the check decides (CUDA memory in the first), never what a message says
    assert '    if device.type != "xla":\n' in second
    assert '    if device.type != "xla":\n' in third
    left = [f for f in result.findings if f.code == "TPU104" and not f.applied]
    assert [f.location.line for f in left] == [4] and "get_device_properties" in left[0].message


def test_a_device_map_dict_assigned_to_a_name_holds_the_device_not_its_index():
    # transformers' quantizers: `device_map = {"": torch.cuda.current_device()}`; an index in a
    # device_map is CUDA device 0 to accelerate
    new = out("""
        import torch

        def update_device_map(device_map):
            if device_map is None:
                device_map = {"": torch.cuda.current_device()}
            index = torch.cuda.current_device()
            model = AutoModel.from_pretrained("m", device_map=device_map)
            return device_map, index
        """)
    assert 'device_map = {"": torch_xla.device()}' in new
    assert "index = torch_xla.device().index" in new


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


def test_a_path_built_from_the_rank_over_several_lines_keeps_every_ranks_file():
    # accelerate's fsdp_utils: LOCAL_STATE_DICT, one file per rank, its name assigned in
    # parentheses over three lines; xm.save on the master only lost every other rank's file
    new = out("""
        import os
        import torch

        def save(model, accelerator, output_dir):
            state_dict = model.cuda().state_dict()
            weights_name = (
                f"model_rank{torch.distributed.get_rank()}.bin"
            )
            output_model_file = os.path.join(output_dir, weights_name)
            torch.save(state_dict, output_model_file)
        """)
    assert "xm.save(state_dict, output_model_file, master_only=False)" in new


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


def test_a_library_function_that_compares_with_xla_gets_no_torch_xla_import(tmp_path):
    # fairscale's ShardedGradScaler: `device.type == "xla"` was there before any port; an
    # `import torch_xla` in its __init__ only made it fail where torch_xla is not installed
    source = """
        import torch

        class Scaler:
            def __init__(self, master):
                assert master.device.type in ("xla", "cpu")
                self.master = master

            def move(self, v):
                return v.cuda()
        """
    new = _package(tmp_path, source).new_source
    init, move = new.split("def move")
    assert "import torch_xla" not in init and "import torch_xla" in move


def test_a_library_function_whose_own_xla_string_was_written_gets_no_import(tmp_path):
    # accelerate's `_prepare_backend`: `backend = "xla"` where torch_xla is importable was
    # there before any port; it gained an `import torch_xla` because another method of the
    # module needed one. A string the port writes still asks for it.
    source = """
        import torch

        class State:
            def prepare(self, found):
                backend = None
                if found:
                    backend = "xla"
                return backend

            def default(self):
                return torch.device("cuda")
        """
    new = _package(tmp_path, source).new_source
    prepare, default = new.split("def default")
    assert "import torch_xla" not in prepare and 'backend = "xla"' in prepare
    assert "import torch_xla" in default and "return torch_xla.device()" in default


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


def test_a_cuda_method_with_arguments_torch_s_does_not_take_is_not_torch_s():
    # transformers' HQQ quantized cache: `.cuda(qtensor, meta=meta, device=...)` lost qtensor
    result = migrate("""
        import torch
        def dequantize(self, qtensor, meta):
            self.quantizer.cuda(qtensor, meta=meta, device=self.keys.device)
            return qtensor.cuda(0, non_blocking=True), qtensor.cuda(device=1), qtensor.cuda(**kw)
        """)
    assert "self.quantizer.cuda(qtensor, meta=meta, device=self.keys.device)" in result.new_source
    assert "qtensor.to(torch_xla.device(), non_blocking=True)" in result.new_source
    left = [f for f in result.findings if f.code == "TPU102" and not f.applied]
    assert [f.location.line for f in left] == [3, 4]  # and the splat's (its own finding)
    assert "another class's own method" in left[0].message


def test_library_code_keeps_what_does_nothing_without_cuda_and_its_compile(tmp_path):
    # transformers' enable_full_determinism (cuDNN determinism on CUDA), Trainer's
    # empty_cache, bitnet's `@torch.compile` kernels (openxla started the XLA runtime for a
    # model on the CPU) and flex attention's `mode="max-autotune-no-cudagraphs"`
    source = """
        import torch

        def determinism():
            torch.backends.cudnn.deterministic = True
            torch.cuda.empty_cache()

        @torch.compile
        def kernel(x):
            return x * 2

        def compiled(f):
            return torch.compile(f, mode="max-autotune-no-cudagraphs")
        """
    result = _package(tmp_path, source)
    assert result.new_source == textwrap.dedent(source).lstrip("\n")
    assert {f.code for f in result.findings} == {"TPU120", "TPU114", "TPU408"}
    assert not any(f.applied for f in result.findings)
    script = out(source)  # a script's: ported
    assert "    torch.backends.cudnn.deterministic = True\n" not in script
    assert '@torch.compile(backend="openxla")' in script


def test_a_library_loop_whose_docstring_says_cuda_gets_no_barrier(tmp_path):
    # diffusers' spectrogram pipeline: its docstring's example says `pipe.to("cuda")`; the
    # pipeline runs on the device the caller moved it to
    source = '''
        import torch

        class Pipeline:
            def __call__(self, batches):
                """>>> pipe = pipe.to("cuda")"""
                for batch in batches:
                    loss = self.model(batch.to(self.device))
                    loss.backward()
                    self.optimizer.step()

            def noise(self):
                return torch.zeros(2).cuda()
        '''
    result = _package(tmp_path, source)
    assert "torch_xla.sync()" not in result.new_source
    assert "torch.zeros(2).to(torch_xla.device())" in result.new_source


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


def test_a_library_s_grad_scaler_stays_with_its_fp16(tmp_path):
    # lightning's MixedPrecision plugin: `self.scaler.scale(tensor)`, `scaler.step(optimizer)`
    # and `scaler.update()` were removed while its fp16 autocast (on the device lightning
    # picks) stayed fp16: "16-mixed" trained unscaled on the CPU
    source = """
        import torch

        class MixedPrecision:
            def __init__(self, device):
                self.device = device
                self.scaler = torch.cuda.amp.GradScaler()

            def pre_backward(self, tensor):
                return self.scaler.scale(tensor)

            def step(self, optimizer):
                out = self.scaler.step(optimizer)
                self.scaler.update()
                return out
        """
    result = _package(tmp_path, source)
    assert "self.scaler.scale(tensor)" in result.new_source
    assert "self.scaler.step(optimizer)" in result.new_source
    assert "self.scaler.update()" in result.new_source
    assert "        self.scaler.update()\n" not in out(source)  # a script's goes with its fp16
