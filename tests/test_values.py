"""The value analysis (tpukit/migrate/analysis): what an expression is, by where its value
comes from and where it goes, in one file and across the program's modules."""

from __future__ import annotations

import textwrap

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.program import program_facts
from tpukit.migrate.analysis.values import Values


def analyse(source: str) -> tuple[cst.Module, Values]:
    module = cst.parse_module(textwrap.dedent(source).lstrip("\n"))
    return module, Values(module)


def kinds_of(source: str, code: str) -> frozenset[str]:
    """The kinds of the first Name or Attribute whose code is `code`."""
    module, values = analyse(source)
    found = []

    class Find(cst.CSTVisitor):
        def on_visit(self, node) -> bool:
            if isinstance(node, (cst.Name, cst.Attribute)) and module.code_for_node(node) == code:
                found.append(node)
            return not found

    module.visit(Find())
    assert found, code
    return values.kinds(found[0])


def test_a_loader_is_one_through_assignments_parameters_attributes_and_returns():
    source = """
        import torch
        from torch.utils.data import DataLoader as DL

        def make(ds):
            return DL(ds, batch_size=2)

        class Trainer:
            def __init__(self, data):
                self.data = data

            def fit(self):
                for batch in self.data:
                    pass

        def run(it):
            for b in it:
                pass

        q = make([1, 2])
        Trainer(q).fit()
        run(q)
        """
    assert K.LOADER in kinds_of(source, "q")
    assert K.LOADER in kinds_of(source, "self.data")
    assert K.LOADER in kinds_of(source, "it")
    assert K.BATCH in kinds_of(source, "b")


def test_a_device_by_its_source_an_argparse_default_or_a_conditional():
    source = """
        import argparse
        import torch
        p = argparse.ArgumentParser()
        p.add_argument("--where", default="cuda")
        a = p.parse_args()
        d = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        s = a.where
        q = torch.cuda.is_available() and d.type == "cuda"
        """
    assert {K.DEVICE, K.CUDA} <= kinds_of(source, "d")
    assert {K.DEVICE, K.CUDA} <= kinds_of(source, "s")
    assert K.CUDA_QUESTION in kinds_of(source, "q")


def test_what_a_value_is_used_as_says_what_it_is():
    source = """
        import torch
        import torch.distributed as dist

        def setup(b):
            dist.init_process_group(b)

        def step(o, s, x):
            x.backward()
            o.step()
            o.zero_grad()
            s.step(o)

        w = "nccl"
        setup(w)
        """
    assert K.BACKEND in kinds_of(source, "b")
    assert K.OPTIMIZER in kinds_of(source, "o")
    assert K.TENSOR in kinds_of(source, "x")
    module, values = analyse(source)
    target = module.body[-2].body[0].targets[0].target
    assert values.uses_of(K.BACKEND, target)  # flowed back from the parameter


def test_a_rank_is_a_device_index_not_a_device():
    source = """
        import os
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main(r, model):
            model.to(r)
            DDP(model, device_ids=[r])

        local = int(os.environ["LOCAL_RANK"])
        main(local, None)
        """
    assert K.RANK in kinds_of(source, "r") and K.DEVICE not in kinds_of(source, "r")


def test_a_cycle_or_an_unknown_name_knows_nothing():
    assert kinds_of("x = f(x)\n", "x") == frozenset()
    assert kinds_of("y = undefined_thing\n", "y") == frozenset()


def test_a_global_statement_at_the_top_level_changes_nothing():
    """`global x` at a module's top level is legal and changes nothing (torch's
    distributed/c10d_logger.py): looking `x` up ends at the module (it looped for ever)."""
    import subprocess
    import sys

    code = ("import libcst as cst\nfrom tpukit.migrate.analysis import catalog as K\n"
            "from tpukit.migrate.analysis.values import Values\n"
            "module = cst.parse_module('import torch\\nglobal d\\nd = torch.device(\"cuda\")\\n"
            "def f():\\n    global d\\n    return d\\n')\n"
            "values = Values(module)\n"
            "ret = module.body[3].body.body[1].body[0].value\n"
            "print(K.DEVICE in values.kinds(ret))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr


def test_names_decide_nothing():
    """The same program under other names has the same kinds."""
    one = """
        import torch
        from torch.utils.data import DataLoader
        train_loader = DataLoader([1])
        device = torch.device("cuda")
        """
    two = one.replace("train_loader", "a").replace("device =", "b =")
    assert kinds_of(one, "train_loader") == kinds_of(two, "a") == {K.LOADER}
    assert kinds_of(one, "device") == kinds_of(two, "b")


def test_the_program_s_modules_tell_each_other_what_they_give_and_do(tmp_path):
    (tmp_path / "evaluate.py").write_text(
        "def evaluate(net, dataloader, device):\n    for batch in dataloader:\n"
        "        net(batch.to(device))\n")
    (tmp_path / "model.py").write_text(
        "import torch\n\nclass Net(torch.nn.Module):\n"
        "    def configure(self, device_type):\n        return device_type == 'cuda'\n")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\nfrom evaluate import evaluate\n"
        "from model import Net\n\nkind = 'cuda'\nmodel = Net().cuda()\nmodel.configure(kind)\n"
        "evaluate(model, DataLoader([1]), torch.device('cuda'))\n")
    received = program_facts([tmp_path / n for n in ("train.py", "evaluate.py", "model.py")],
                             [tmp_path])
    evaluate = received[tmp_path / "evaluate.py"].param_kinds["evaluate"]
    assert K.LOADER in evaluate["dataloader"] and K.DEVICE in evaluate["device"]
    assert K.MODULE in evaluate["net"]  # Net is an nn.Module, by its base
    train = received[tmp_path / "train.py"]
    assert K.STRING_USE in train.external_uses[("", "kind")]  # compared as a string there
    assert train.imported_kinds["model.Net"] == {K.MODULE}
