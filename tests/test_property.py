"""Property tests: on generated programs the engine never crashes, its output compiles, code
it does not change comes back byte-identical, and a second run is a no-op."""

from __future__ import annotations

import ast
import re
import warnings

import hypothesmith
import libcst as cst
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tpukit.migrate.engine import MigrateOptions, migrate_source
from tpukit.rules import select_rules

ALL = MigrateOptions(rules=select_rules([], []))
# hypothesmith compiles odd programs ("[] ()"): their SyntaxWarnings are noise here.
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
# Passes the text prefilter, so the generated program is parsed and traversed for real.
HEADER = "import torch  # cuda\n"


def compiles(source: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # generated code is odd, not wrong
        try:
            compile(source, "<generated>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        except (SyntaxError, ValueError):
            return False
    return True


@SETTINGS
@given(hypothesmith.from_grammar())
def test_arbitrary_programs_never_crash_and_stay_python(body):
    source = HEADER + body
    assume(compiles(source))
    try:
        migration = migrate_source(source, "g.py", ALL)
    except cst.ParserSyntaxError:
        assume(False)  # grammar corners libcst does not parse: not ours to judge
        return
    assert compiles(migration.new_source)
    if not any(f.applied for f in migration.findings):
        assert migration.new_source == source
    assert migrate_source(migration.new_source, "g.py", ALL).new_source == migration.new_source


# -- programs made of CUDA idioms mixed with plain code ----------------------------------
ALIASES = {"torch": "import torch", "th": "import torch as th"}
CUDA_LINES = [
    "{t}.cuda.synchronize()",
    "{t}.cuda.empty_cache()",
    "{t}.cuda.manual_seed({n})",
    "{t}.cuda.set_device({n})",
    "dev = {t}.device('cuda')",
    "dev = {t}.device(\"cuda\" if {t}.cuda.is_available() else \"cpu\")",
    "x = {t}.zeros({n}, device='cuda')",
    "x = {t}.ones({n}).cuda()",
    "x = y.cuda(non_blocking=True)",
    "print(f\"mem {{{t}.cuda.memory_allocated()}}\")",
    "ok = x.is_cuda and dev.type == 'cuda'",
    "{t}.backends.cudnn.benchmark = True",
    "n = {t}.cuda.device_count() + {n}",
    "s = {t}.cuda.Stream()",
    "with {t}.cuda.nvtx.range('r{n}'):\n{i}    pass",
    # splats a rule cannot see into, guards over migrated and CUDA-only code, literals of
    # every base (library code has all three)
    "m = {t}.nn.parallel.DistributedDataParallel(y, **kw{n})",
    "m = {t}.nn.parallel.DistributedDataParallel(y, *args{n}, **kw{n})",
    "f = {t}.compile(y, **kw{n})",
    "{t}.distributed.init_process_group(backend='nccl', **kw{n})",
    "s = {t}.utils.data.distributed.DistributedSampler(y, **kw{n})",
    "x = y.cuda(**kw{n})",
    "if {t}.cuda.is_available():\n{i}    s = {t}.cuda.Stream()",
    "if {t}.cuda.is_available() and a{n}:\n{i}    {t}.cuda.synchronize()",
    # keywords right against a parenthesized operand (pix2pix's `assert(torch.cuda.
    # is_available())`): a rewritten operand keeps its parentheses
    "assert({t}.cuda.is_available())",
    "ok = not({t}.cuda.is_available())",
    "z = 1 if({t}.cuda.is_available())else 0",
    "mask = 0x{n}F | 0o1{n} | 0b10 | 1_00{n}",
    "head_dim = 0x{n}0",
]
SYNCHRONIZE = re.compile(r"\b(?:%s)\.cuda\.synchronize\b" % "|".join(ALIASES))
PLAIN_LINES = [
    "a{n} = [{n}, 'cuda kernels', {{'k': {n}}}]  # keep me",
    "print('plain', {n})",
    "b{n} = a{n} if a{n} else None",
    "c{n} = {n}  # just a comment",
]


@st.composite
def cuda_programs(draw):
    alias = draw(st.sampled_from(sorted(ALIASES)))
    lines = [ALIASES[alias], "y = None", "a0 = 0", "a1 = 1", "a2 = 2", "a3 = 3", "dev = None"]
    plain_indices = []
    for _ in range(draw(st.integers(1, 12))):
        depth = draw(st.integers(0, 2))
        indent = "    " * depth
        opener = ["if a0 is not None:", "def f():", "for _ in range(1):"]
        prefix = []
        for level in range(depth):
            prefix.append("    " * level + draw(st.sampled_from(opener)))
        n = draw(st.integers(0, 3))
        if draw(st.booleans()):
            body = draw(st.sampled_from(CUDA_LINES)).format(t=alias, n=n, i=indent)
        else:
            body = draw(st.sampled_from(PLAIN_LINES)).format(n=n)
            plain_indices.append(len(lines) + len(prefix))
        lines.extend(prefix)
        lines.append(indent + body)
    source = "\n".join(lines) + "\n"
    return source, [lines[i] for i in plain_indices]


def migrate_cleanly(program, options: MigrateOptions) -> str:
    """The migrated program compiles, keeps every line tpukit did not touch (byte for byte, in
    order), and is a fixed point."""
    source, plain = program
    assert compiles(source)
    migration = migrate_source(source, "g.py", options)
    assert compiles(migration.new_source), migration.new_source
    out_lines = iter(migration.new_source.splitlines())
    for line in plain:
        assert any(candidate == line for candidate in out_lines), line
    assert migrate_source(migration.new_source, "g.py", options).new_source == migration.new_source
    return migration.new_source


@SETTINGS
@given(cuda_programs())
def test_cuda_programs_migrate_to_valid_idempotent_code(program):
    new = migrate_cleanly(program, ALL)
    # under either alias (`th.cuda.synchronize` is half the programs)
    assert not SYNCHRONIZE.search(new), new
    for splat in ("*args", "**kw"):  # never dropped
        assert new.count(splat) == program[0].count(splat)


@pytest.mark.parametrize("name", ["cuda", "cuda_flag"])
def test_no_cuda_idiom_is_byte_identical_even_when_parsed(name):
    source = f"import torch  # cuda\n{name} = 1\nprint('{name}', {name})\n"
    assert migrate_source(source, "g.py", ALL).new_source == source


TORCHTPU = MigrateOptions(rules=ALL.rules, target="torchtpu", eager_mode="fused")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuda_programs())
def test_cuda_programs_migrate_for_torchtpu_to_valid_idempotent_code(program):
    new = migrate_cleanly(program, TORCHTPU)
    assert "torch_xla" not in new and not SYNCHRONIZE.search(new)
    assert new.count("eager_mode = ") <= 1 and "set_eager_mode(" not in new
