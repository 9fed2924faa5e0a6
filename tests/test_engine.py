"""Engine behaviours: name resolution, byte-identity, imports, helpers, statement edits."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from conftest import FIXTURES
from tpukit.findings import Message
from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import select_rules

ALL = MigrateOptions(rules=select_rules([], []))


def migrate(source: str, options: MigrateOptions = ALL):
    return migrate_source(textwrap.dedent(source).lstrip("\n"), "t.py", options)


def out(source: str) -> str:
    return migrate(source).new_source


def codes(source: str) -> list[str]:
    return [f.code for f in migrate(source).findings]


# -- name resolution -------------------------------------------------------------------
@pytest.mark.parametrize(
    "source",
    [
        "import torch as th\nth.cuda.synchronize()\n",
        "from torch import cuda\ncuda.synchronize()\n",
        "import torch.cuda\ntorch.cuda.synchronize()\n",
        "import torch.cuda as tc\ntc.synchronize()\n",
        "from torch.cuda import synchronize as sync_gpu\nsync_gpu()\n",
    ],
)
def test_aliases_resolve_to_the_same_rewrite(source):
    result = out(source)
    assert "torch_xla.sync()\nxm.wait_device_ops()\n" in result
    assert "synchronize" not in result and "sync_gpu" not in result


def test_aliased_autocast_import_is_resolved_and_its_import_removed():
    result = out("import torch\nfrom torch.cuda.amp import autocast as ac\nwith ac():\n    pass\n")
    assert result == 'import torch\nwith torch.autocast("xla", dtype=torch.bfloat16):\n    pass\n'


def test_unmapped_cuda_name_through_a_from_import_is_reported():
    found = migrate("from torch.cuda import get_arch_list as arches\nx = arches()\n")
    assert [f.code for f in found.findings] == ["TPU117"]
    assert "torch.cuda.get_arch_list" in found.findings[0].message


def test_a_typed_tensor_through_a_from_import_is_rewritten():
    found = migrate("from torch.cuda import FloatTensor as FT\nx = FT(3)\n")
    assert [f.code for f in found.findings] == ["TPU121"]
    assert "x = _XlaTensorType(torch.float32)(3)" in found.new_source
    assert "from torch.cuda import" not in found.new_source  # the import went with its use
    compile(found.new_source, "t.py", "exec")


def test_local_named_cuda_is_left_alone():
    source = """
    from torch import cuda

    def run(cuda=True):
        if cuda:
            return cuda.real
        return None

    def other():
        cuda = "flag"
        return cuda.upper()
    """
    assert out(source) == textwrap.dedent(source).lstrip("\n")


def test_unimported_cuda_name_is_not_torch():
    source = "cuda = load_config()\ncuda.synchronize()\n"
    assert out(source) == source
    assert codes(source) == []


@pytest.mark.parametrize("rebinding", [
    "cuda = mylib.FakeCuda()",
    "cuda: FakeCuda = mylib.FakeCuda()",
    "cuda, other = mylib.fakes()",
    "def cuda():\n    return mylib.FakeCuda()",
    "class cuda:\n    synchronize = staticmethod(print)",
])
def test_a_module_level_rebinding_ends_the_import_for_the_code_after_it(rebinding):
    before = "import mylib\nfrom torch import cuda\ncuda.synchronize()\n"
    after = f"{rebinding}\ncuda.synchronize()\ndef f():\n    cuda.synchronize()\n"
    result = out(before + after)
    assert result.count("torch_xla.sync()") == 1 and result.endswith(after)


def test_a_rebinding_inside_a_block_is_conditional_and_an_import_after_it_counts_again():
    guarded = "try:\n    from torch import cuda\nexcept ImportError:\n    cuda = None\ncuda.synchronize()\n"
    assert "torch_xla.sync()" in out(guarded)
    again = "from torch import cuda\ncuda = 1\nfrom torch import cuda\ncuda.synchronize()\n"
    assert "torch_xla.sync()" in out(again)


@pytest.mark.parametrize(
    "source",
    [
        'print("training on cuda")\n',
        'config = {"backend": "cuda"}\n',
        'parser.add_argument("--backend", default="cuda")\n',
        'name = "cuda"\n',
    ],
)
def test_unrelated_cuda_strings_are_left_alone(source):
    assert out("import torch\n" + source) == "import torch\n" + source


# -- byte identity -------------------------------------------------------------------
def test_everything_outside_changed_nodes_is_byte_identical():
    source = (
        "#!/usr/bin/env python\n"
        "# -*- coding: utf-8 -*-\n"
        '"""Doc string with "cuda" in it."""\n'
        "import torch   # the framework\n"
        "\n"
        "\n"
        "x = {'a':1,   \"b\" : 2}  # odd spacing stays\n"
        "dev = torch.device( 'cuda' )\n"
        "y = [\n"
        "    1,  # one\n"
        "    2,\n"
        "]\n"
    )
    result = out(source)
    assert result == source.replace("import torch   # the framework\n",
                                     "import torch   # the framework\nimport torch_xla\n").replace(
        "torch.device( 'cuda' )", "torch_xla.device()")


def test_crlf_line_endings_are_kept():
    source = "import torch\r\nx = torch.zeros(2).cuda()\r\ny = 1\r\n"
    result = out(source)
    assert "\r\n" in result and "\n" not in result.replace("\r\n", "")
    assert "x = torch.zeros(2).to(torch_xla.device())\r\n" in result


def test_file_without_cuda_is_returned_unparsed_and_identical():
    source = "import torch\nx = torch.zeros(3)\n"
    migration = migrate(source)
    assert migration.new_source == source and not migration.findings


# -- imports ---------------------------------------------------------------------------
def test_imports_are_added_once_and_existing_ones_reused():
    source = """
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch.cuda.synchronize()
    x = torch.device("cuda")
    """
    result = out(source)
    assert result.count("import torch_xla\n") == 1
    assert result.count("import torch_xla.core.xla_model as xm") == 1


def test_imports_left_unused_by_the_rewrite_are_removed():
    source = """
    import torch
    import torch.backends.cudnn as cudnn
    from torch import cuda
    from torch.cuda import empty_cache, Stream

    cudnn.benchmark = True
    cuda.synchronize()
    empty_cache()
    s = Stream()
    """
    result = out(source)
    assert "import torch.backends.cudnn" not in result
    assert "from torch import cuda" not in result
    # Stream is still used (a finding for a person), so its import stays.
    assert "from torch.cuda import Stream\n" in result


def test_import_still_used_elsewhere_is_kept():
    source = """
    from torch import cuda
    cuda.synchronize()
    print(cuda.get_rng_state())
    """
    assert "from torch import cuda" in out(source)


def test_dotted_import_is_removed_only_when_no_torch_cuda_is_left():
    assert "import torch.cuda" not in out("import torch\nimport torch.cuda\ntorch.cuda.synchronize()\n")
    kept = out("import torch\nimport torch.cuda\ntorch.cuda.synchronize()\ng = torch.cuda.CUDAGraph()\n")
    assert "import torch.cuda\n" in kept


def test_helper_is_inserted_once_after_the_imports():
    source = """
    import torch

    def a():
        return torch.cuda.memory_allocated()

    def b():
        return torch.cuda.max_memory_allocated()
    """
    result = out(source)
    assert result.count("def _xla_memory_stat(key):") == 1
    tree = ast.parse(result)
    names = [getattr(node, "name", None) for node in tree.body]
    assert names.index("_xla_memory_stat") < names.index("a")
    assert out(result) == result


def test_memory_helper_does_not_crash_on_xla_cpu_semantics():
    # The helper swallows RuntimeError (UNIMPLEMENTED on XLA:CPU) and returns 0.
    result = out("import torch\nm = torch.cuda.max_memory_allocated()\n")
    namespace: dict = {}
    helper = result[result.index("def _xla_memory_stat"):result.index("m = ")]

    class FakeXm:
        @staticmethod
        def get_memory_info(device):
            raise RuntimeError("UNIMPLEMENTED: GetAllocatorStats is not supported")

    class FakeTorchXla:
        @staticmethod
        def device():
            return "xla:0"

    exec(helper, {"xm": FakeXm, "torch_xla": FakeTorchXla}, namespace)
    assert namespace["_xla_memory_stat"]("peak_bytes_used") == 0


# -- statement edits ---------------------------------------------------------------------
def test_removed_statement_leaves_a_comment_and_keeps_its_own():
    source = """
    import torch
    torch.backends.cudnn.benchmark = True  # speed
    x = 1
    """
    result = out(source)
    assert result.splitlines()[1].startswith('# tpukit: removed "torch.backends.cudnn.benchmark')
    assert result.splitlines()[1].endswith("# speed")
    assert "x = 1" in result


def test_block_emptied_by_removal_gets_pass():
    source = """
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    """
    result = out(source)
    assert "    pass  # tpukit: removed" in result
    ast.parse(result)


def test_one_line_suite_and_semicolons_stay_valid():
    source = "import torch\nif flag: torch.cuda.synchronize(); torch.cuda.empty_cache()\nx = 1; torch.cuda.set_device(0)\n"
    result = out(source)
    ast.parse(result)
    assert "if flag: torch_xla.sync(); xm.wait_device_ops()\n" in result
    assert "x = 1\n" in result


def test_synchronize_as_a_value_uses_the_waiting_sync():
    result = out("import torch\nok = torch.cuda.synchronize() or True\n")
    assert "ok = torch_xla.sync(wait=True) or True" in result


def test_replacement_inside_f_string_uses_the_other_quote():
    result = out('import torch\nprint(f"mem {torch.cuda.memory_allocated()} MiB")\n')
    assert "f\"mem {_xla_memory_stat('bytes_used')} MiB\"" in result
    compile(result, "t.py", "exec")


def test_cuda_method_uses_device_variable_in_scope():
    source = """
    import torch

    def train(model, batch, where):
        return model(batch.cuda())

    def evaluate(model, batch):
        return model(batch.cuda())

    dev = torch.device("cuda")
    y = torch.zeros(1).cuda()
    train(m, y, dev)
    """
    result = out(source)
    assert "model(batch.to(where))" in result  # its caller gives it a device
    assert "model(batch.to(torch_xla.device()))" in result
    assert "y = torch.zeros(1).to(dev)" in result


def test_is_available_device_choice_collapses_but_user_condition_stays():
    source = """
    import torch
    a = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    b = torch.device("cuda" if use_gpu else "cpu")
    """
    result = out(source)
    assert "a = torch_xla.device()" in result
    assert 'b = torch.device("xla" if use_gpu else "cpu")' in result


# -- options ---------------------------------------------------------------------------
def test_selected_rules_only():
    only_seed = MigrateOptions(rules=select_rules(["TPU113"], []))
    source = "import torch\ntorch.cuda.manual_seed(1)\ntorch.cuda.synchronize()\n"
    migration = migrate(source, only_seed)
    assert "torch_xla.manual_seed(1)" in migration.new_source
    assert "torch.cuda.synchronize()" in migration.new_source
    assert [f.code for f in migration.findings] == ["TPU113"]


def test_findings_have_positions_and_fix_state():
    migration = migrate("import torch\n\nx = torch.cuda.get_device_properties(0)\ny = 1 .cuda()\n")
    by_code = {f.code: f for f in migration.findings}
    props = by_code["TPU110"]
    assert (props.location.line, props.location.col) == (3, 5)
    assert props.applied is False and props.fix.value == "none" and props.needs_person
    cuda = by_code["TPU102"]
    assert (cuda.location.line, cuda.location.col) == (4, 5) and cuda.applied


def test_syntax_error_raises_parser_error():
    with pytest.raises(cst.ParserSyntaxError):
        migrate_source("import torch\ndef f(:\n  torch.cuda.synchronize()\n", "t.py", ALL)


# -- pruning and positions -----------------------------------------------------------------
def test_names_bound_to_cuda_apis_are_found_inside_functions_and_methods():
    filler = "".join(f"def unrelated_{i}(x):\n    return x + {i}\n\n" for i in range(30))
    source = (
        "import torch\nfrom torch.cuda import synchronize as sync_gpu\n"
        "from torch.utils.cpp_extension import (\n    load,\n)\n\n"
        + filler
        + "class Trainer:\n    def step(self):\n        sync_gpu()\n\n"
        + "def build():\n    return load(name='k', sources=['k.cu'])\n"
    )
    migration = migrate_source(source, "t.py", ALL)
    assert "        torch_xla.sync()\n        xm.wait_device_ops()\n" in migration.new_source
    assert {(f.code, f.location.line) for f in migration.findings} == {
        ("TPU112", 99), ("TPU906", 102)
    }


@pytest.mark.parametrize("fixture", sorted(p.parent.name for p in FIXTURES.glob("*/cuda.py")))
def test_statement_positions_equal_whole_module_positions(fixture, monkeypatch):
    source = (FIXTURES / fixture / "cuda.py").read_text()
    fast = migrate_source(source, "cuda.py", ALL).findings
    from tpukit.migrate import engine

    original_init = engine.Layout.__init__

    def without_lines(self, *args):
        original_init(self, *args)
        self.first_line.clear()  # forces positions from the whole module

    monkeypatch.setattr(engine.Layout, "__init__", without_lines)
    slow = migrate_source(source, "cuda.py", ALL).findings
    assert [f.location for f in fast] == [f.location for f in slow]
    assert len(fast) > 0


def test_imports_inside_try_blocks_are_seen_even_when_pruning():
    source = (
        "try:\n    import torch\n    HAVE_TORCH = True\nexcept ImportError:\n    HAVE_TORCH = False\n\n"
        "def info():\n    return torch.cuda.get_device_name(0)\n"
    )
    migration = migrate_source(source, "t.py", ALL)
    assert "xm.xla_device_hw(torch_xla.device())" in migration.new_source


def test_pruning_changes_no_result_on_real_torch_sources(monkeypatch):
    """Skipping trigger-free statements is only a speed-up: on torch's own CUDA-heavy files
    (real code nobody here wrote) the findings are the same with and without it."""
    import importlib.util
    from pathlib import Path

    from tpukit.migrate import engine

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torch is not installed")
    root = Path(list(spec.submodule_search_locations)[0])
    sources = [p.read_text() for p in sorted((root / "cuda").glob("*.py"))]
    sources += [(root / "utils" / "collect_env.py").read_text()]
    sources = [s for s in sources if "cuda" in s][:20]
    check = MigrateOptions(rules=ALL.rules, render_source=False)

    def findings():
        return [[(f.location, f.code, f.applied) for f in migrate_source(s, "t.py", check).findings]
                for s in sources]

    pruned = findings()
    original = engine.Layout.__init__

    def no_pruning(self, *args):
        original(self, *args)
        self.skip.clear()

    monkeypatch.setattr(engine.Layout, "__init__", no_pruning)
    assert findings() == pruned
    assert sum(map(len, pruned)) > 50


# -- unsafe fixes ------------------------------------------------------------------------
UNSAFE = MigrateOptions(rules=select_rules([], []), unsafe_fixes=True)


def test_unsafe_fixes_apply_only_when_asked():
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "model = build().half()\nloader = DataLoader(ds, batch_size=8)\n"
        "for x, y in loader:\n    loss = model(x, y)\n    loss.backward()\n    optimizer.step()\n"
        "    print(f'loss {loss.item():.3f}')\n"
        "dev = torch.device('cuda')\n"
    )
    safe = migrate_source(source, "t.py", ALL)
    # a training script: .half() becomes bfloat16 as fp16 AMP does (TPU202 is safe there)
    assert ".bfloat16()" in safe.new_source and "drop_last" not in safe.new_source
    assert {f.code for f in safe.findings if not f.applied} >= {"TPU302", "TPU501"}
    unsafe = migrate_source(source, "t.py", UNSAFE).new_source
    assert "model = build().bfloat16()" in unsafe
    assert "DataLoader(ds, batch_size=8, drop_last=True)" in unsafe
    assert "    xm.add_step_closure(lambda: print(f'loss {loss.item():.3f}'))" in unsafe
    compile(unsafe, "t.py", "exec")
    assert migrate_source(unsafe, "t.py", UNSAFE).new_source == unsafe


def test_half_outside_a_training_script_is_an_unsafe_fix():
    # No `.backward()`: an export or serving script, whose float16 may be the format it writes.
    source = "import torch\nmodel = build().half().cuda()\ntorch.save(model.state_dict(), 'm.pt')\n"
    safe = migrate_source(source, "export.py", ALL)
    assert ".half()" in safe.new_source
    (finding,) = [f for f in safe.findings if f.code == "TPU202"]
    assert not finding.applied and "--unsafe-fixes" in finding.message
    assert ".bfloat16()" in migrate_source(source, "export.py", UNSAFE).new_source
    training = source + "loss = model(x).sum()\nloss.backward()\n"
    assert ".bfloat16()" in migrate_source(training, "train.py", ALL).new_source


def test_tied_weights_are_retied_after_a_chained_move():
    source = (
        "import torch\nimport torch.nn as nn\n\n\nclass LM(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.emb = nn.Embedding(10, 4)\n        self.head = nn.Linear(4, 10)\n"
        "        self.emb.weight = self.head.weight\n\n\n"
        "device = torch.device('cuda')\nlm = LM().to(device)\n"
    )
    result = out(source)
    assert result.endswith("lm = LM().to(device)\nlm.emb.weight = lm.head.weight\n")


TIED_LM = (
    "import torch.nn as nn\n\n\nclass GPT(nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n"
    "        self.wte = nn.Embedding(10, 4)\n        self.lm_head = nn.Linear(4, 10)\n"
    "        self.wte.weight = self.lm_head.weight\n\n"
    "    @classmethod\n    def from_pretrained(cls, name):\n        return cls()\n"
)


@pytest.mark.parametrize("layout, script, importer", [
    # nanoGPT: train.py imports the model from model.py beside it
    ("model.py", "train.py", "from model import GPT\n"),
    ("pkg/model.py", "pkg/train.py", "from .model import GPT\n"),
    ("pkg/model.py", "pkg/train.py", "from pkg.model import GPT\n"),  # python -m pkg.train
    ("lm/model.py", "train.py", "import lm.model as lm_model\nGPT = lm_model.GPT\n"),
])
def test_a_model_imported_from_a_local_module_is_retied(tmp_path, layout, script, importer):
    for package in {p for p in (tmp_path / layout).relative_to(tmp_path).parents if str(p) != "."}:
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").touch()
    (tmp_path / layout).write_text(TIED_LM)
    source = (f"import torch\n{importer}\ndevice = 'cuda'\nif scratch:\n    model = GPT()\n"
              "else:\n    model = GPT.from_pretrained('gpt2')\nmodel.to(device)\n")
    if importer.startswith("import lm.model"):  # through the module: lm_model.GPT(...)
        source = source.replace("GPT()", "lm_model.GPT()")
    new = migrate_source(source, str(tmp_path / script), ALL).new_source
    assert new.endswith("model.to(device)\nmodel.wte.weight = model.lm_head.weight\n"), new
    # no such module beside the script: nothing to tie, nothing invented
    elsewhere = migrate_source(source, str(tmp_path / "other" / "train.py"), ALL).new_source
    assert "weight =" not in elsewhere


# -- torchtpu: the eager mode set at start-up -------------------------------------------------
def torchtpu(eager_mode: str | None = "fused") -> MigrateOptions:
    return MigrateOptions(rules=ALL.rules, target="torchtpu", eager_mode=eager_mode)


def test_eager_mode_is_set_once_right_after_the_imports():
    source = 'import os\nimport torch as th\n\n# the model\nmodel = Net().cuda()\n'
    new = migrate_source(source, "t.py", torchtpu("strict")).new_source
    assert new == ('import os\nimport torch as th\nimport torch_tpu\n\n'
                   'th.tpu.eager_mode = th.tpu.EagerMode.DEFER_NEVER\n\n'
                   '# the model\nmodel = Net().to("tpu")\n')
    assert migrate_source(new, "t.py", torchtpu("strict")).new_source == new


def test_eager_mode_is_not_set_twice_even_with_another_mode():
    source = ('import torch\nimport torch_tpu\n\ntorch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_NEVER\n'
              'x = torch.zeros(2).cuda()\n')
    new = migrate_source(source, "t.py", torchtpu("fused")).new_source
    assert new.count("eager_mode") == 1 and '.to("tpu")' in new


def test_a_bare_set_eager_mode_call_becomes_the_property_and_no_second_mode_is_set():
    # set_eager_mode is a context manager (torch-tpu 0.2.0): as a statement it set nothing.
    source = ('import torch\nimport torch_tpu\n\ntorch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)\n'
              'x = torch.zeros(2).cuda()\n')
    new = migrate_source(source, "t.py", torchtpu("fused")).new_source
    assert "torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_NEVER\n" in new
    assert "set_eager_mode" not in new and "DEFER_AND_FUSE" not in new


def test_a_name_or_comparison_that_says_eager_mode_does_not_stop_the_start_up_setting():
    source = ('import torch\n# eager_mode: see the docs\nif args.eager_mode == "x":\n    pass\n'
              'x = torch.zeros(2).cuda()\n')
    new = migrate_source(source, "t.py", torchtpu("fused")).new_source
    assert new.count("torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE\n") == 1


def test_eager_mode_needs_a_file_that_uses_the_tpu():
    source = "import torch\ntorch.backends.cudnn.benchmark = True\n"
    new = migrate_source(source, "t.py", torchtpu()).new_source
    assert "torch_tpu" not in new and "set_eager_mode" not in new


def test_eager_mode_brings_torch_when_the_file_has_only_a_device_string():
    new = migrate_source("device = 'cuda'\nprint(device == 'cuda')\n", "t.py", torchtpu()).new_source
    assert new.startswith(("import torch_tpu\nimport torch\n", "import torch\nimport torch_tpu\n"))
    assert "torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE\n" in new
    assert new.rstrip().endswith("device = 'tpu'\nprint(device == 'tpu')")
    ast.parse(new)


def test_no_eager_mode_without_the_option():
    new = migrate_source("import torch\nx = torch.zeros(2).cuda()\n", "t.py", torchtpu(None)).new_source
    assert "set_eager_mode" not in new and "import torch_tpu" in new


def test_a_typed_tensor_alias_inside_a_function_is_rewritten_with_its_casts():
    found = migrate("import torch\n\n\ndef train(imgs, cuda):\n"
                    "    Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor\n"
                    "    return imgs.type(Tensor)\n")
    assert "    Tensor = _XlaTensorType(torch.float32)\n" in found.new_source
    assert "imgs.to(Tensor.device, Tensor.dtype)" in found.new_source  # not .type(<helper>)
    compile(found.new_source, "t.py", "exec")


def test_two_rules_planning_one_node_is_a_conflict_not_a_matter_of_order(monkeypatch):
    """Which of two rules' replacements of one node wins must not depend on their order:
    the file is left unchanged and both rules are named."""
    from tpukit.migrate import engine
    from tpukit.migrate.transforms.base import Transform

    class Plans(Transform):
        def visit_Call(self, node):
            if self.ctx.qualify(node.func) == "torch.cuda.synchronize":
                self.ctx.report(self.rule, node, Message("mine", fix="theirs"), applied=True)
                return cst.parse_expression(f"mine_{self.rule.code}()")
            return None

    monkeypatch.setattr(engine, "transform_for", lambda rule: Plans)
    rules = [r for r in select_rules([], []) if r.code in ("TPU101", "TPU102")]
    source = "import torch\n\ntorch.cuda.synchronize()\n"
    with pytest.raises(engine.MigrationBug, match=r"rules TPU101 and TPU102 both rewrite "
                       r"`torch.cuda.synchronize\(\)`") as raised:
        migrate_source(source, "t.py", MigrateOptions(rules=rules))
    assert raised.value.line == 3
    alone = migrate_source(source, "t.py", MigrateOptions(rules=rules[:1]))
    assert alone.new_source.endswith("mine_TPU101()\n")


@pytest.mark.parametrize("second,conflict", [
    ("original.with_changes(args=[cst.Arg(cst.Name('b'))])", True),  # built from the original
    ("updated.with_changes(func=cst.Name('mine'))", True),  # replaces the same part
    ("updated.with_changes(args=[cst.Arg(cst.Name('b'))])", False),  # edits another part
    ("cst.Call(func=cst.Name('wrap'), args=[cst.Arg(updated.func)])", False),  # keeps it, moved
])
def test_a_leave_hook_that_undoes_another_rules_edit_is_a_conflict(monkeypatch, second, conflict):
    """Leave hooks chain on one node (each gets the last one's result): a later rule that drops
    an earlier one's edit would make the outcome a matter of order, so it is a conflict."""
    from tpukit.migrate import engine
    from tpukit.migrate.transforms.base import Transform

    class Renames(Transform):
        def leave_Call(self, original, updated):
            if self.ctx.qualify(original.func) != "torch.cuda.synchronize":
                return None
            self.ctx.report(self.rule, original, Message("mine", fix="theirs"), applied=True)
            if self.rule.code == "TPU101":
                return updated.with_changes(func=cst.parse_expression("xm.sync"))
            return eval(second)

    monkeypatch.setattr(engine, "transform_for", lambda rule: Renames)
    rules = [r for r in select_rules([], []) if r.code in ("TPU101", "TPU102")]
    source = "import torch\n\ntorch.cuda.synchronize(a)\n"
    if conflict:
        with pytest.raises(engine.MigrationBug, match=r"rules TPU101 and TPU102 both rewrite "
                           r"`torch.cuda.synchronize\(a\)`") as raised:
            migrate_source(source, "t.py", MigrateOptions(rules=rules))
        assert raised.value.line == 3
    else:
        assert "xm.sync" in migrate_source(source, "t.py", MigrateOptions(rules=rules)).new_source


def test_a_later_removal_or_a_statement_list_that_keeps_the_edit_is_not_a_conflict():
    from tpukit.migrate import rewriter

    edit = cst.parse_statement("x = xm.sync()\n")
    assert not rewriter._lost([edit], cst.RemovalSentinel.REMOVE)  # same outcome in either order
    assert not rewriter._lost([edit], cst.FlattenSentinel([edit, cst.parse_statement("y = 1\n")]))
    assert rewriter._lost([edit], cst.FlattenSentinel([cst.parse_statement("x = 2\n")]))


def _every_node(node: cst.CSTNode):
    yield node
    for child in node.children:
        yield from _every_node(child)


def test_children_reads_the_same_nodes_as_libcst_on_the_fixtures_and_torch():
    import torch

    from tpukit.migrate import nodes

    torch_root = Path(torch.__file__).parent
    # every fixture, and torch's nn.modules (the 629 files of the throughput benchmark's
    # corpus were compared once, 1.15M nodes, with no difference)
    files = sorted(FIXTURES.rglob("*.py")) + sorted((torch_root / "nn" / "modules").rglob("*.py"))
    compared = 0
    for path in files:
        try:
            module = cst.parse_module(path.read_bytes())
        except cst.ParserSyntaxError:
            continue
        for node in _every_node(module):
            expected = node.children
            found = nodes.children(node)
            assert len(found) == len(expected) and all(
                a is b for a, b in zip(found, expected)
            ), f"{path}: {type(node).__name__}"
            compared += 1
    assert compared > 100_000
