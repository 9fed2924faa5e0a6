"""Forms real training scripts are written in (issue 32's round of public scripts): each test
fails on a migrator that mishandles the form."""

from __future__ import annotations

import textwrap

import pytest

from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import select_rules

XLA = MigrateOptions(rules=select_rules([], []))
TPU = MigrateOptions(rules=select_rules([], []), target="torchtpu")


def migrate(source: str, options: MigrateOptions = XLA):
    return migrate_source(textwrap.dedent(source).lstrip("\n"), "train.py", options)


def test_a_rewritten_assert_operand_keeps_its_parentheses():
    # pix2pix's init_net: `assert(torch.cuda.is_available())`, no space after `assert`
    new = migrate("""
        import torch
        def init_net(net, gpu_ids):
            assert(torch.cuda.is_available())
            if not(torch.cuda.is_available()):
                return net
            return net.to(gpu_ids[0])
        """).new_source
    assert "assert(bool(xr.device_type()))" in new
    assert "if not(bool(xr.device_type())):" in new
    compile(new, "train.py", "exec")


def test_an_operand_made_true_drops_out_of_the_and():
    new = migrate("""
        import torch
        use_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        flag = torch.cuda.is_bf16_supported() and x
        """).new_source
    assert "use_bf16 = bool(xr.device_type())\n" in new
    assert "flag = x\n" in new


def test_an_and_with_a_value_that_is_not_a_bool_keeps_true():
    # `x and True` is True, not x, when x is truthy but not a bool
    new = migrate("""
        import torch
        n = count and torch.cuda.is_bf16_supported()
        """).new_source
    assert "n = count and True\n" in new


def test_module_compile_lowers_through_torch_xla():
    # a CIFAR-10 speed run: `model.compile(mode="max-autotune")` reached inductor on XLA
    migration = migrate("""
        import re
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            pass
        model = Net().cuda()
        model.compile(mode="max-autotune")
        pattern = re.compile("x")
        """)
    new = migration.new_source
    assert 'model.compile(backend="openxla")' in new
    assert 'pattern = re.compile("x")' in new
    assert [f.code for f in migration.findings].count("TPU408") == 1


def test_module_compile_on_torchtpu_drops_the_cuda_only_mode():
    new = migrate("""
        import torch
        model = torch.nn.Linear(2, 2).cuda()
        model.compile(mode="max-autotune", fullgraph=True)
        """, TPU).new_source
    assert "model.compile(fullgraph=True)" in new


def test_float16_chosen_for_the_accelerator_is_bfloat16_in_the_program():
    # a diffusion trainer: `torch.float16 if device.type == 'cuda' else torch.float32`
    migration = migrate("""
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.float16 if device.type == "cuda" else torch.float32
        if torch.cuda.is_available():
            weight_dtype = torch.half
        """)
    new = migration.new_source
    assert 'dtype = torch.bfloat16 if device.type == "xla" else torch.float32' in new
    assert "weight_dtype = torch.bfloat16" in new
    assert not any(not f.applied for f in migration.findings if f.code in ("TPU104", "TPU110"))


def test_float16_chosen_for_a_gpu_stays_in_library_mode(tmp_path):
    from tpukit.migrate.ownership import Owner

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    path = tmp_path / "pkg" / "loading.py"
    source = textwrap.dedent("""
        import torch
        def load(device):
            return torch.float16 if device.type == "cuda" else torch.float32
        """).lstrip("\n")
    options = MigrateOptions(rules=select_rules([], []), owner=Owner.LIBRARY)
    new = migrate_source(source, str(path), options).new_source
    assert 'torch.float16 if device.type == "cuda"' in new


def test_a_flag_from_a_dataclass_is_not_a_host_read():
    # cleanrl's ppo: `if args.norm_adv:` inside the update loop, args from a dataclass
    migration = migrate("""
        from dataclasses import dataclass
        import torch
        @dataclass
        class Args:
            norm_adv: bool = True
            clip_coef: float = 0.2
        args = Args()
        device = torch.device("cuda")
        model = torch.nn.Linear(2, 1).to(device)
        optimizer = torch.optim.Adam(model.parameters())
        for epoch in range(3):
            adv = model(torch.ones(4, 2, device=device))
            if args.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            loss = adv.sum() * args.clip_coef
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """)
    assert not [f for f in migration.findings if f.code == "TPU501"], migration.findings


def test_an_int_index_option_passed_to_a_worker_is_no_device():
    # pytorch/examples' ImageNet: `main_worker(args.gpu, ...)` and `mp.spawn(main_worker, ...)`
    # give `gpu` an index (`--gpu type=int default=None`); `.cuda(args.gpu)` uses it as one.
    # `model.cuda(device)` must move to the device, never to that index.
    new = migrate("""
        import argparse
        import torch
        import torch.multiprocessing as mp
        parser = argparse.ArgumentParser()
        parser.add_argument('--gpu', default=None, type=int)
        def main_worker(gpu, ngpus_per_node, args):
            args.gpu = gpu
            device = torch.accelerator.current_accelerator()
            if args.gpu is not None:
                torch.cuda.set_device(args.gpu)
                model.cuda(device)
            else:
                model.cuda()
            images = images.cuda(args.gpu, non_blocking=True)
        def main():
            args = parser.parse_args()
            if args.multiprocessing_distributed:
                mp.spawn(main_worker, nprocs=2, args=(2, args))
            else:
                main_worker(args.gpu, 2, args)
        """).new_source
    assert "to(gpu" not in new
    assert new.count("model.to(device)") == 2
    assert "images = images.to(device, non_blocking=True)" in new


def test_a_backend_name_compared_under_a_guard_is_no_cuda_code():
    # ImageNet: `if device.type == 'cuda': ... if ... args.dist_backend == "nccl": warn(...)`
    migration = migrate("""
        import warnings
        import torch
        device = torch.accelerator.current_accelerator()
        if device.type == 'cuda':
            n = torch.accelerator.device_count()
            if n == 1 and backend == "nccl":
                warnings.warn("one GPU")
        """)
    assert "if device.type == 'xla':" in migration.new_source
    assert all(f.applied for f in migration.findings), migration.findings


# -- SyncBatchNorm (self-supervised trainers: convert_sync_batchnorm under spawned DDP) ------
SYNC_BN_CHECK = r'''
import sys, torch
from tpukit.migrate import helpers

on_xla = sys.argv[1] == "xla"
namespace = {"torch": torch}
if on_xla:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    device = torch_xla.device()
else:
    class xm:
        REDUCE_SUM = "sum"
    class xr:
        pass
    device = torch.device("cpu")
import torch_xla.core.functions as xf

# Two processes with the same batch: what the collective gives is twice one process's
# (scaled as asked), through the real all_reduce on XLA.
real = xf.all_reduce
xf.all_reduce = lambda kind, value, scale=1.0: (
    real(kind, value, scale=1.0) if on_xla else value) * 2 * scale
xr.world_size = lambda: 2
namespace.update(xm=xm, xr=xr)
exec(helpers.SOURCES["_xla_sync_batchnorm"], namespace)

torch.manual_seed(0)
for momentum in (0.1, None):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, momentum=momentum))
    reference = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, momentum=momentum))
    reference.load_state_dict(model.state_dict())
    synced = namespace["_xla_sync_batchnorm"](model.to(device))
    x = torch.randn(5, 3, 8, 8)
    for _ in range(2):
        out = synced(x.to(device)).cpu()
        # SyncBatchNorm over two processes with this batch = BatchNorm over both batches
        expected = reference(torch.cat([x, x]))[:5]
        assert torch.allclose(out, expected, atol=1e-4), (out - expected).abs().max()
    bn, ref = synced[1], reference[1]
    assert torch.allclose(bn.running_mean.cpu(), ref.running_mean, atol=1e-5)
    assert torch.allclose(bn.running_var.cpu(), ref.running_var, atol=1e-5)
    assert int(bn.num_batches_tracked.cpu()) == 2
    synced.eval()
    assert torch.allclose(synced(x.to(device)).cpu(), reference.eval()(x), atol=1e-4)
    out.sum()  # the graph ends here
    loss = synced.train()(x.to(device)).sum()
    loss.backward()
    assert synced[0].weight.grad is not None
print("SYNCED_OK")
'''


def _run_check(where: str):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PJRT_DEVICE": "CPU",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", SYNC_BN_CHECK, where], env=env,
                          capture_output=True, text=True, timeout=600)
    assert "SYNCED_OK" in proc.stdout, proc.stderr[-3000:]


def test_synced_batchnorm_computes_what_sync_batchnorm_computes():
    _run_check("cpu")


@pytest.mark.xla
def test_synced_batchnorm_runs_on_xla_through_the_real_all_reduce():
    pytest.importorskip("torch_xla")
    _run_check("xla")


def test_convert_sync_batchnorm_becomes_the_helper():
    migration = migrate("""
        import torch
        import torch.nn as nn
        model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm2d(3)).cuda()
        """)
    new = migration.new_source
    assert "model = _xla_sync_batchnorm(nn.BatchNorm2d(3)).to(" in new
    assert "def _xla_sync_batchnorm(module, process_group=None):" in new
    assert all(f.applied for f in migration.findings)


def test_an_option_another_module_makes_a_device_is_a_device_option(tmp_path, run_cli):
    # timm's train.py: `--device default='cuda'`, read only in log lines there; the namespace
    # goes to `utils.init_distributed_device(args)` (re-exported by the package's __init__),
    # which makes `torch.device(getattr(args, 'device', 'cuda'))`
    tree = tmp_path / "repo"
    (tree / "lib" / "utils").mkdir(parents=True)
    (tree / "lib" / "__init__.py").write_text("")
    (tree / "lib" / "utils" / "__init__.py").write_text(
        "from .distributed import init_device\n")
    (tree / "lib" / "utils" / "distributed.py").write_text(textwrap.dedent("""
        import torch

        def init_device(args):
            name = getattr(args, 'device', 'cuda')
            return torch.device(name)
        """).lstrip())
    (tree / "train.py").write_text(textwrap.dedent("""
        import argparse
        import torch
        from lib import utils

        parser = argparse.ArgumentParser()
        parser.add_argument('--device', default='cuda', type=str)
        parser.add_argument('--name', default='cuda', type=str)

        def main():
            args = parser.parse_args()
            device = utils.init_device(args)
            print(f"on {args.device} as {args.name}")
            model = torch.nn.Linear(2, 2).to(device)

        if __name__ == "__main__":
            main()
        """).lstrip())
    run_cli("migrate", "train.py", cwd=tree, check_rc=0)
    new = (tree / "train.py").read_text()
    assert "parser.add_argument('--device', default='xla', type=str)" in new
    assert "parser.add_argument('--name', default='cuda', type=str)" in new  # only printed


def test_float16_held_for_an_autocast_through_partial_is_bfloat16():
    # timm's train.py: `amp_dtype = torch.float16` ... `partial(torch.autocast,
    # device_type=device.type, dtype=amp_dtype)`: on XLA the port trained in float16
    migration = migrate("""
        from contextlib import suppress
        from functools import partial
        import torch

        def main(args, model, loader):
            device = torch.device("cuda")
            amp_dtype = torch.float16
            if args.amp_dtype == 'bfloat16':
                amp_dtype = torch.bfloat16
            cast_to = torch.float16
            amp_autocast = suppress
            if args.amp:
                amp_autocast = partial(torch.autocast, device_type=device.type, dtype=amp_dtype)
            for x, y in loader:
                with amp_autocast():
                    loss = model(x.to(device)).sum()
                loss.backward()
        """)
    new = migration.new_source
    assert "    amp_dtype = torch.bfloat16\n    if args.amp_dtype" in new
    assert "cast_to = torch.float16" in new  # not an autocast's dtype


def test_a_parenthesized_guard_over_cuda_only_code_is_put_back():
    # `x if(cond)else y`: the rewritten test keeps its parentheses and stays a guard, so
    # what it guards (a CUDA stream, no TPU form) keeps the test as written
    new = migrate("""
        import torch as th
        z = 1 if(th.cuda.is_available())else 0
        s = th.cuda.Stream() if(th.cuda.is_available())else None
        """).new_source
    assert "z = 1 if(bool(xr.device_type()))else 0" in new
    assert "s = th.cuda.Stream() if(th.cuda.is_available())else None" in new
    assert migrate(new).new_source == new


def test_a_mask_write_on_a_name_some_binding_makes_a_numpy_array_stays():
    # ultralytics' YOLOE predictor: `masks = np.stack(...)` rebinds a parameter its callers
    # give tensors; `masks[masks == 0] = 1` then writes a NumPy array (no masked_fill_)
    migration = migrate("""
        import numpy as np
        import torch

        def paste(masks):
            masks = np.stack([m for m in masks])
            masks[masks == 0] = 1
            return masks

        def run():
            return paste(torch.zeros(2, 3).cuda())
        """)
    assert "masks[masks == 0] = 1" in migration.new_source
    assert "masked_fill_" not in migration.new_source
    # a mask read of a NumPy array is the host's: no data-dependent shape on the device
    read = migrate("""
        import numpy as np
        import torch

        def pick(ids):
            mm = np.zeros_like(ids)
            return mm[mm == 0], torch.zeros(3).cuda()
        """)
    assert not [f for f in read.findings if f.code == "TPU502"]


def test_a_cuda_default_nothing_uses_as_a_device_is_not_the_device_to_move_to():
    # `.cuda()` -> `.to(device)` only where `device` is ported: an unused "cuda" default stays
    # as written (TPU101 ports a default only where the parameter is used as a device), so
    # `.to(device)` there would move to CUDA
    new = migrate("""
        import torch
        def f(x, *, device="cuda"):
            return x.cuda()
        def g(x, device="cuda"):
            y = torch.zeros(2, device=device)
            return x.cuda() + y
        """).new_source
    assert 'def f(x, *, device="cuda"):\n    return x.to(torch_xla.device())' in new
    assert 'def g(x, device="xla"):' in new and "return x.to(device) + y" in new


# -- growing samplers (TPU503's port; fixtures/gpt_sampler runs them on XLA) ------------------
_SAMPLER = """
    import torch
    from torch import cat
    model = Net().cuda()
    def sample(idx, n, B):
        for _ in range(n):
            {crop}
            nxt = model(ctx)[:, -1, :].argmax(-1, keepdim=True)
            {extra}
            idx = cat({parts}, dim={dim})
        return idx
    """


def _sampler(crop="ctx = idx if idx.size(1) <= B else idx[:, -B:]", extra="", parts="(idx, nxt)",
             dim="1"):
    return migrate(_SAMPLER.format(crop=crop, extra=extra, parts=parts, dim=dim))


def test_a_sampler_is_ported_whatever_imports_its_cat():
    result = _sampler()
    new = result.new_source
    assert "_tpukit_parts.append(nxt)" in new and "idx = torch.cat(_tpukit_parts, dim=1)" in new
    assert "import torch\n" in new  # the port writes torch.cat
    [finding] = [f for f in result.findings if f.code == "TPU503"]
    assert finding.applied
    compile(new, "train.py", "exec")


@pytest.mark.parametrize("changes", [
    {"extra": "print(idx.shape)"},  # the sequence is read elsewhere in the loop
    {"dim": "0"},  # grows the batch, not the sequence
    {"crop": "ctx = idx[:, -len(idx):]"},  # a bound that reads the sequence
    {"crop": "ctx = idx[:, -B():]"},  # a bound computed each iteration
    {"parts": "(nxt, idx)"},  # prepends
    {"crop": "ctx = idx"},  # no crop: the model reads all of it
])
def test_a_growing_cat_of_another_shape_is_reported_not_ported(changes):
    result = _sampler(**changes)
    assert "_tpukit" not in result.new_source
    if changes.get("parts") != "(nxt, idx)" and changes.get("dim") != "0":
        [finding] = [f for f in result.findings if f.code == "TPU503"]
        assert not finding.applied


def test_a_ported_sampler_is_ported_once():
    new = _sampler().new_source
    assert migrate_source(new, "train.py", XLA).new_source == new


def test_the_torchtpu_target_reports_the_sampler():
    result = migrate(_SAMPLER.format(crop="ctx = idx if idx.size(1) <= B else idx[:, -B:]",
                                     extra="", parts="(idx, nxt)", dim="1"), TPU)
    assert "_tpukit" not in result.new_source
    assert [f.applied for f in result.findings if f.code == "TPU503"] == [False]


@pytest.mark.parametrize("line,sets", [
    ("eager_mode = True", False),  # the script's own variable is no mode
    ("torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE", True),
    ("with torch.tpu.set_eager_mode(torch.tpu.EagerMode.EAGER):\n    pass", True),
])
def test_the_eager_mode_is_set_unless_the_script_sets_one(line, sets):
    options = MigrateOptions(rules=select_rules([], []), target="torchtpu",
                             eager_mode="fused")
    new = migrate(f"import torch\nx = torch.zeros(1).cuda()\n{line}\n", options).new_source
    added = "torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE\n"
    assert new.count(added) == (1 if line.startswith("torch.tpu.eager_mode") else 0 if sets else 1)


def test_a_seed_where_the_script_starts_its_processes_does_not_start_the_runtime():
    """SimSiam's main(): `torch.manual_seed(args.seed)`, then `mp.spawn(...)`: a
    `torch_xla.manual_seed` there starts the XLA runtime, and torch_xla.launch refuses to run
    ("Runtime is already initialized")."""
    result = migrate("""
        import torch
        import torch.multiprocessing as mp
        def worker(index, args):
            torch.manual_seed(args.seed)
            x = torch.zeros(1).cuda()
        def main(args):
            torch.manual_seed(args.seed)
            mp.spawn(worker, nprocs=torch.cuda.device_count(), args=(args,))
        """)
    new = result.new_source
    assert new.count("torch_xla.manual_seed(args.seed)") == 1  # in the worker only
    assert new.index("torch_xla.manual_seed") < new.index("def main")
    assert [f.applied for f in result.findings if f.code == "TPU118"] == [True, False]


def _codes(migration) -> list[str]:
    return [f.code for f in migration.findings]


def test_a_data_parallel_wrapper_its_function_returns_is_kept_on_xla():
    # pix2pix's init_net returns `DataParallel(net, gpu_ids)`; another file reads
    # `getattr(self, 'net' + name).module`, which no dataflow follows
    source = """
        import torch.nn as nn
        def init_net(net, gpu_ids):
            net = nn.DataParallel(net, gpu_ids)
            return net
        def wrap(net):
            return nn.DataParallel(net)
        model = nn.DataParallel(model)
        torch.save(model.module.state_dict(), "m.pt")
        """
    migration = migrate(source)
    new = migration.new_source
    assert "net = nn.DataParallel(net, gpu_ids)\n    return net" in new
    assert "return nn.DataParallel(net)\n" in new
    assert "\nmodel = nn.DataParallel(model)\n" not in new  # not returned: removed as before
    assert "model.state_dict()" in new
    kept = [f for f in migration.findings if f.code == "TPU403" and "is kept" in f.message]
    assert [f.location.line for f in kept] == [3, 6]
    torchtpu = migrate(source, TPU).new_source
    code = "\n".join(line for line in torchtpu.splitlines() if "# tpukit:" not in line)
    assert "nn.DataParallel(" not in code and code.count("return net\n") == 2


ROLLOUT_SETUP = """
    import numpy as np
    import torch
    device = torch.device("cuda")
    net = torch.nn.Linear(4, 2).to(device)
    values = torch.zeros((8, 2)).to(device)
    x = torch.zeros((2, 4)).to(device)
"""
ROLLOUT = ROLLOUT_SETUP + """
    for step in range(8):
        with torch.no_grad():
            v = net(x)
        STORE
        a = v.cpu().numpy()
        x = torch.Tensor(np.ones((2, 4)) * a.sum()).to(device)
    """


@pytest.mark.parametrize("store, barrier", [
    ("values[step] = v.flatten()[:2]", True),  # a tensor made before the loop
    ("values[step] += v.flatten()[:2]", True),
    ("stored = [0] * 8; stored[step] = v", False),  # a list the iteration makes
    ("values = v", False),  # rebinds, no write into it
])
def test_a_loop_that_fills_a_tensor_made_before_it_gets_a_barrier(store, barrier):
    new = migrate(ROLLOUT.replace("STORE", store)).new_source
    assert ("torch_xla.sync()" in new) == barrier, new


def test_a_rollout_without_a_host_read_gets_no_barrier():
    new = migrate(ROLLOUT.replace("STORE", "values[step] = v.flatten()[:2]")
                  .replace("a = v.cpu().numpy()", "a = v").replace("a.sum()", "1.0")).new_source
    assert "torch_xla.sync()" not in new


STEP_METHOD = """
    import torch
    class Model:
        def __init__(self, net):
            self.net = net.cuda()
            self.opt = torch.optim.Adam(self.net.parameters())
        def optimize(self, x):
            self.opt.zero_grad()
            self.net(x.cuda()).sum().backward()
            self.opt.step()
            self.steps = 1
    CALLER
    """


def test_a_step_method_that_no_code_in_the_file_calls_ends_with_the_barrier():
    # pix2pix: train.py's loop calls `model.optimize_parameters()` of a class picked by a string
    migration = migrate(STEP_METHOD.replace("CALLER", ""))
    assert "        self.opt.step()\n        torch_xla.sync()\n        self.steps = 1" in \
        migration.new_source
    assert any("no code in this file calls" in f.message for f in migration.findings)


def test_a_step_method_called_by_a_loop_of_the_file_gets_one_barrier_in_that_loop():
    new = migrate(STEP_METHOD.replace("CALLER", textwrap.dedent("""
        model = Model(torch.nn.Linear(2, 2))
        for x in batches:
            model.optimize(x)
        """).replace("\n", "\n    "))).new_source
    assert new.count("torch_xla.sync()") == 1
    assert "    model.optimize(x)\n    torch_xla.sync()" in new


DECODE = """
    import torch
    class GPT(torch.nn.Module):
        pass
    device = torch.device("cuda")
    model = GPT().to(device)
    y = model.generate(x, 500, do_sample=True)[0]
    LINE
    """


@pytest.mark.parametrize("line, ported", [
    # minGPT's chargpt: one graph per position and a transfer per token on XLA
    ("completion = ''.join([itos[int(i)] for i in y])", True),
    ("total = sum(float(v) for v in y if v.item() > 0)", True),
    ("for t in y:\n        print(t.item())", True),
    ("pairs = {int(i): i.tolist() for i in y}", True),
    ("for t in y:\n        t.add_(1)", False),  # a device op on each element
    ("out = [int(i) + i for i in y]", False),  # one use stays a tensor
    ("out = [int(i) for i in y for j in range(2)]", False),  # nested: left
    ("for t in y:\n        n = int(t)\n    else:\n        pass", False),
])
def test_a_tensor_read_element_by_element_is_iterated_on_the_host(line, ported):
    migration = migrate(DECODE.replace("LINE", line))
    new = migration.new_source
    assert ("_tensor_on_host(y)" in new) == ported, new
    assert ("TPU506" in _codes(migration)) == ported
    if ported:
        assert migrate(new).new_source == new  # ported once
        compile(new, "train.py", "exec")


def test_a_list_iterated_with_int_is_not_a_tensor_read():
    new = migrate("""
        import torch
        device = torch.device("cuda")
        ids = [1, 2, 3]
        names = [itos[int(i)] for i in ids]
        """).new_source
    assert "_tensor_on_host" not in new


def test_the_host_copy_gives_the_same_values():
    namespace: dict = {}
    from tpukit.migrate import helpers

    exec("import torch\n" + helpers.SOURCES["_tensor_on_host"], namespace)
    on_host = namespace["_tensor_on_host"]
    import torch

    y = torch.tensor([3, 1, 2])
    assert [int(i) for i in on_host(y)] == [int(i) for i in y]
    assert on_host([1, 2]) == [1, 2]


LOADS = """
    import torch
    class Loader:
        def __init__(self, path):
            data = torch.load(path, map_location=torch.device("cuda"))
            self.images, self.labels, self.classes = data["images"], data["labels"], data["classes"]
    def resume(model, path):
        ckpt = torch.load(path, map_location="cuda")
        model.load_state_dict(ckpt["model"])
        return ckpt["epoch"]
    def load(path):
        return torch.load(path, map_location="cuda")
    """


@pytest.mark.parametrize("options, device", [(XLA, "torch_xla.device()"),
                                             (TPU, '"tpu"')])
def test_data_torch_load_put_on_cuda_is_moved_to_the_device_after_loading(options, device):
    # airbench's CifarLoader: the dataset's tensors loaded onto the GPU and used there
    new = migrate(LOADS, options).new_source
    assert (f'data = _tensors_to(torch.load(path, map_location="cpu"), {device})') in new
    assert 'ckpt = torch.load(path, map_location="cpu")\n' in new  # a checkpoint: the CPU
    assert 'return torch.load(path, map_location="cpu")\n' in new  # read whole: the CPU
    assert migrate(new, options).new_source == new


def test_the_moved_data_keeps_its_containers():
    from tpukit.migrate import helpers
    import torch

    namespace: dict = {}
    exec("import torch\n" + helpers.SOURCES["_tensors_to"], namespace)
    loaded = {"images": torch.ones(2, 3), "pairs": [(torch.zeros(1), "a")], "classes": ["x"]}
    moved = namespace["_tensors_to"](loaded, torch.device("meta"))
    assert moved["images"].device.type == "meta" and moved["pairs"][0][0].device.type == "meta"
    assert moved["pairs"][0][1] == "a" and moved["classes"] == ["x"]
    assert isinstance(moved["pairs"][0], tuple)


@pytest.mark.parametrize("line", [
    # timm's drop-path rates: a CPU tensor a torch function made, iterated on the host anyway
    "dpr = [x.item() for x in torch.linspace(0, 0.1, 12)]",
    "dpr = [x.item() for x in torch.linspace(0, 0.1, 12, device='cpu')]",
    "dpr = [x.tolist() for x in torch.linspace(0, 0.1, 12).split([4, 8])]",
    "rates = torch.linspace(0, 0.1, 12)\n    dpr = [x.item() for x in rates]",
])
def test_a_tensor_made_on_the_host_is_not_an_element_read(line):
    new = migrate(DECODE.replace("LINE", line)).new_source
    assert "_tensor_on_host" not in new


def test_a_tensor_made_on_the_device_is_an_element_read():
    new = migrate(DECODE.replace(
        "LINE", "dpr = [x.item() for x in torch.linspace(0, 0.1, 12, device=device)]")).new_source
    assert "_tensor_on_host(torch.linspace(0, 0.1, 12, device=device))" in new


def test_a_dunder_step_method_gets_no_barrier_of_its_own():
    # timm's NativeScaler.__call__ steps the optimizer; its caller's loop has the barrier
    new = migrate(STEP_METHOD.replace("def optimize(self, x)", "def __call__(self, x)")
                  .replace("CALLER", "")).new_source
    assert "torch_xla.sync()" not in new


def test_a_write_in_a_nested_loop_is_the_nested_loops():
    # cleanrl: the iteration loop holds the rollout loop and reads the host after it
    new = migrate(ROLLOUT_SETUP + """
    for it in range(3):
        for step in range(8):
            with torch.no_grad():
                v = net(x)
            values[step] = v.flatten()[:2]
            a = v.cpu().numpy()
        print(values.cpu().numpy())
        """).new_source
    assert new.count("torch_xla.sync()") == 1, new
    assert "        torch_xla.sync()\n        a = v.cpu().numpy()" in new


def test_a_rollout_under_no_grad_is_said_to_be_one():
    migration = migrate(ROLLOUT_SETUP + """
    with torch.no_grad():
        for step in range(8):
            v = torch.rand(2, 2, device=device)
            values[step] = v.flatten()[:2]
            a = v.cpu().numpy()
            x = torch.Tensor(np.ones((2, 4)) * a.sum()).to(device)
        """)
    said = [f.message for f in migration.findings if f.code == "TPU303"]
    assert len(said) == 1 and "a rollout's storage" in said[0], migration.new_source
