"""Guards over CUDA-only code: rewritten only when everything they guard is migrated.

`if torch.cuda.is_available(): return torch.cuda.Stream(device)` and `if device.type ==
"cuda": state = torch.cuda.get_rng_state(device)`: once the test is rewritten it is true on a
TPU, and the CUDA-only code it guards runs there. A rule that rewrites part of a test
(an availability call, a device-type comparison, `.is_cuda`) registers the replacement as a
guard (`MigrationContext.add_guard`); when the `if` (or conditional expression) is left, a
guard whose guarded code still holds CUDA-only code is put back as it was written (False on
a TPU: the other branch runs), and its finding says what is left.
"""

from __future__ import annotations

import re

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.catalog import cuda_catalog
from tpukit.migrate.analysis.cuda_only import (CUDA_WORD, cuda_library, cuda_package,
                                                ported_import, ported_names)
from tpukit.migrate.analysis.unported import (cuda_under_flag, flag_deciding_cuda, flag_key,
                                              flag_name)
from tpukit.migrate.context import MigrationContext, dotted, is_cuda_device_string, string_value
from tpukit.migrate.nodes import children, first, scan, walk
from tpukit.rules import engine_say


def restore_unported(ctx: MigrationContext, original: cst.CSTNode, updated: cst.If | cst.IfExp):
    """`updated` (`original` as written) with the guards of its test put back where what they
    guard is not ported."""
    found = _GuardUses(ctx.guards)
    scan(updated.test, found)
    restore = {}
    # `device.type == "cuda" and not check_cuda_p2p_ib_support()`: the rest of the test is
    # CUDA's too, and runs once the guard is true.
    # (library code only: in a program "is there CUDA" has one answer everywhere, and
    # `not cuda and not mps` is `not tpu and not mps` on a TPU host)
    vendor = _other_vendor(ctx, updated.test) if found.uses and ctx.owner_leaves(
        "guards", "other_gpu") else None
    in_test = (residual_cuda(ctx, updated.test) or vendor) if found.uses else None
    deferred = []
    bfloat16 = {}  # id of a float16 the guard picks -> torch.bfloat16
    for key, negated in found.uses.items():
        if in_test is not None:
            restore[key] = _put_back(ctx, key, in_test, "where_in_test" if in_test != vendor
                                     else "where_in_test_gpu")
            continue
        polarity = ctx.guards[key][2]
        guarded = updated.orelse if negated != polarity else updated.body
        other = updated.body if negated != polarity else updated.orelse
        # `if device.type != "cuda": throw_on_non_cuda(device)`: the other branch says the
        # test is about CUDA too (torch's Philox decompositions). (What an error message
        # says decides nothing: a branch that raises guards what follows it, below.)
        named = residual_cuda(ctx, other) if isinstance(other, cst.BaseSuite) else None
        if named is not None:
            restore[key] = _put_back(ctx, key, named, "where_other_branch")
            continue
        flag = flag_deciding_cuda(ctx, original) if isinstance(original, cst.If) else None
        if flag is not None:
            # `if pin_memory and not torch.cuda.is_available(): self.pin_memory = False`, read
            # by `if self.pin_memory: torch.cuda._pin_memory_utils.pin_memory(...)` (torch's
            # checkpoint stager): the flag the guard sets decides CUDA-only code elsewhere
            restore[key] = _put_back(ctx, key, flag[1], "where_under_flag", name=flag[0])
            continue
        if guarded is None and isinstance(updated, cst.If) and (
                ctx.target == "xla" or _exits(updated.body)):
            # `if not available: return` / `...: pin_memory = False`: the CUDA path is what
            # follows the if, in its block (TorchTPU keeps some CUDA spellings, so there only
            # a guard that leaves the block)
            deferred.append((key, None))
            continue
        moved = _only_moves(ctx, guarded) if ctx.owner_leaves("guards", "speed_moves") else None
        if moved is not None:
            # transformers' mxfp4 dequantizer: `if not blocks.is_cuda and
            # torch.cuda.is_available(): blocks = blocks.cuda()` computes on the GPU when there
            # is one; on a TPU it would start the runtime inside from_pretrained and compile
            restore[key] = _put_back(ctx, key, moved, "where_speed")
            continue
        # A value chosen by the guard that names a GPU ("-gpu" packages) is CUDA's too; in a
        # statement a string is a message ("batch did not land on the GPU").
        # float16 picked because a GPU is there: in a library it stays the GPU's choice; in
        # the program it is the accelerator's, and a TPU computes in bfloat16.
        left = residual_cuda(ctx, guarded, isinstance(updated, cst.IfExp),
                             half=ctx.owner_leaves("guards", "half")) \
            if guarded is not None else None
        if left is not None:
            restore[key] = _put_back(ctx, key, left)
        elif guarded is not None and not ctx.owner_leaves("guards", "half") and (
                halves := _halves(ctx, guarded)):
            bfloat16.update(halves)
            report = ctx.guards[key][1]
            report.message += engine_say("migrate", "guard_half", ctx.target)
        elif isinstance(updated, cst.If) and isinstance(guarded, cst.BaseSuite) \
                and (names := _bound_names(guarded)):
            # `if device.type == "cuda": gpu_devices.append(device)`, then
            # `torch.random.fork_rng(gpu_devices)` (fairscale's pipe): what the guarded code
            # fills is read after the if, in its block
            deferred.append((key, names))
    if restore:
        updated = updated.with_changes(test=updated.test.visit(_Restore(restore)))
    if bfloat16:
        updated = updated.visit(_Restore(bfloat16))
    if deferred:
        ctx.guarded_after[id(updated)] = deferred
    return updated


# The host's CUDA, asked: what a library's CUDA test reads.
_CUDA_QUERIES = {"torch.cuda.is_available", "torch.cuda.device_count", "torch.cuda.is_initialized"}


def library_cuda_choice(ctx: MigrationContext, node: cst.If | cst.IfExp | cst.Assert) -> str | None:
    """Why a statement of library code (context.library_code) is left to CUDA: its test asks
    for CUDA (`torch.cuda.is_available()`, a GPU count, a function of its own that returns one,
    `x.is_cuda`, `x.device.type == "cuda"`).
    The library's other path is the one it supports without CUDA, and what the original ran
    on a TPU host; rewritten, the test turned true there and the CUDA branch ran: accelerate's
    `default_device` returned the XLA device, transformers' generation loop started the XLA
    runtime to synchronize a CPU model, and accelerate's Megatron-LM integration passed its
    `assert torch.cuda.is_available(), "Megatron requires CUDA."`. The whole statement (its
    branches too) stays as written, with findings; None where the test asks nothing of CUDA."""
    if not ctx.owner_leaves("guards", "cuda_choice"):
        return None

    def compute() -> str | None:
        def query(n: cst.CSTNode) -> str | None:
            if isinstance(n, cst.Call) and (ctx.qualify(n.func) in _CUDA_QUERIES or (
                    K.CUDA_QUESTION in ctx.values.kinds(n))):
                # the library's own CUDA check (a function of the file that returns one)
                return ctx.short(n)
            if isinstance(n, cst.Attribute) and n.attr.value == "is_cuda":
                return ctx.short(n)
            if isinstance(n, cst.Comparison) and any(
                    is_cuda_device_string(c.comparator) for c in n.comparisons) or (
                    isinstance(n, cst.Comparison) and is_cuda_device_string(n.left)):
                return ctx.short(n)
            return None
        said = first(node.test, query)
        return engine_say("migrate", "why_cuda_test", test=said) if said else None

    return ctx.memo(("library_cuda_choice", id(node)), compute)


def scope_moves_to_cuda(ctx: MigrationContext) -> bool:
    """Whether the enclosing function of library code (or the module's top level) puts
    something on CUDA that the port puts on XLA: `x.cuda()`, a "cuda" device string. What
    library code keeps is not counted: a CUDA-or-CPU choice (library_cuda_choice: the CPU on
    a TPU host), a comparison with "cuda", a `torch.cuda.*` call (`torch.cuda.empty_cache()`,
    `torch.cuda.synchronize()` under `if device.type == "cuda"`). Where nothing is, the
    function computes on the device the library picked, the CPU on a TPU host (fairscale's
    layer profiler, ultralytics' profile_ops): a barrier or a device loader added there
    would start the XLA runtime (and claim the TPU) in a process that computes on the CPU."""
    scope = ctx.functions[-1] if ctx.functions else ctx.module

    def compute() -> bool:
        if not _NAMES_CUDA.search(ctx.scope_text()):
            return False
        return _moves(ctx, scope)

    return ctx.memo(("scope_moves_to_cuda", id(scope)), compute)


_NAMES_CUDA = re.compile(r"\bcuda\b", re.I)


def _moves(ctx: MigrationContext, scope: cst.CSTNode) -> bool:
    stack = [scope]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.If, cst.IfExp, cst.Assert)) and library_cuda_choice(ctx, node):
            continue
        if isinstance(node, cst.Comparison) or (
                isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node is not scope):
            continue  # a nested function or class is a scope of its own
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value == "cuda" and not ctx.qualify(node.func):
            return True  # `x.cuda()`, `module.cuda(device)`
        if isinstance(node, (cst.SimpleString, cst.FormattedString)) \
                and is_cuda_device_string(node):
            return True
        stack.extend(children(node))
    return False


def _only_moves(ctx: MigrationContext, guarded) -> str | None:
    """The first statement, when every statement of `guarded` moves a value to the device
    and keeps it under its own name (`x = x.cuda()`, `x = x.to(...)`), else None."""
    if not isinstance(guarded, cst.IndentedBlock) or not guarded.body:
        return None
    for stmt in guarded.body:
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return None
        small = stmt.body[0]
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1
                and isinstance(small.value, cst.Call)
                and isinstance(small.value.func, cst.Attribute)
                and (small.value.func.attr.value == "cuda" or (
                    small.value.func.attr.value == "to" and small.value.args
                    and K.DEVICE in ctx.values.kinds(small.value.args[0].value)))
                and ctx.code(small.value.func.value) == ctx.code(small.targets[0].target)):
            return None  # not a move (`x = x.to(torch.float16)` is a cast)
    return ctx.short(guarded.body[0])

# Other vendors' GPUs: `not torch.cuda.is_available() and not torch.xpu.is_available()` asks
# "is there a GPU" (transformers' AWQ kernels, which are CUDA/XPU only), not "is there an
# accelerator", so it stays False on a TPU.
# (the namespaces: rules/catalog/cuda.toml's other_gpu_namespaces)


def _other_vendor(ctx: MigrationContext, test: cst.BaseExpression) -> str | None:
    def vendor(node: cst.CSTNode) -> str | None:
        name = ctx.qualify(node) if isinstance(node, cst.Attribute) else None
        return ctx.short(node) if cuda_catalog().other_gpu(name) else None

    return first(test, vendor)


def restore_after(ctx: MigrationContext, block: cst.IndentedBlock | cst.Module):
    """`if not torch.cuda.is_available(): return skip(...)` then `torch.cuda.get_device_
    properties(0)`: a negated guard without an else guards the statements after it."""
    body = list(block.body)
    changed = False
    for i, stmt in enumerate(body):
        deferred = ctx.guarded_after.pop(id(stmt), None)
        if not deferred:
            continue
        restore = {}
        for key, names in deferred:
            if key not in ctx.guards:
                continue
            if names is None:
                left = next(filter(None, (residual_cuda(ctx, rest) for rest in body[i + 1:])), None)
                where, fields = "where_after", {}
            else:
                left, where, fields = next(filter(None, (_cuda_reader(ctx, rest, names)
                                                         for rest in body[i + 1:])), (None, "", {}))
            if left is not None:
                restore[key] = _put_back(ctx, key, left, where, **fields)
        if restore:
            body[i] = stmt.with_changes(test=stmt.test.visit(_Restore(restore)))
            changed = True
    return block.with_changes(body=body) if changed else block



# Methods that fill the object they are called on.
_FILLS = frozenset({"append", "extend", "insert", "add", "update", "setdefault"})


def _bound_names(suite: cst.BaseSuite) -> frozenset[str]:
    """The local names code binds or fills: `x = ...`, `x += ...`, `x[k] = ...`,
    `x.append(...)`."""
    names = set()
    for node in walk(suite):
        target = None
        if isinstance(node, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign)):
            target = node.target
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value in _FILLS:
            target = node.func.value
        if isinstance(target, cst.Subscript):
            target = target.value
        if isinstance(target, cst.Name):
            names.add(target.value)
    return frozenset(names)


# Calls whose device type is CUDA unless a keyword says otherwise: given devices filled under
# a CUDA guard, they ask CUDA for them (`torch.cuda.get_rng_state(xla:0)`).
_CUDA_BY_DEFAULT = {"torch.random.fork_rng": "device_type"}


def _cuda_reader(ctx: MigrationContext, node: cst.CSTNode,
                 names: frozenset[str]) -> tuple[str, str, dict] | None:
    """The first call in `node` that is given one of `names` and is CUDA's (its device type
    defaults to CUDA, or the call is CUDA-only code): (the call, the `where_` message that
    says how the name reaches it, its fields)."""
    def reader(call: cst.CSTNode):
        if not isinstance(call, cst.Call):
            return None
        given = next((arg.value.value for arg in call.args
                      if isinstance(arg.value, cst.Name) and arg.value.value in names), None)
        if given is None:
            return None
        callee = ctx.qualify(call.func) if isinstance(call.func, (cst.Attribute, cst.Name)) else None
        keyword = _CUDA_BY_DEFAULT.get(callee or "")
        if keyword is not None and not any(
                arg.keyword is not None and arg.keyword.value == keyword for arg in call.args):
            return ctx.short(call.func), "where_given_cuda_default", {"given": given,
                                                                     "keyword": keyword}
        left = residual_cuda(ctx, call)
        return (left, "where_given", {"given": given}) if left is not None else None

    return first(node, reader)


def restore_loop(ctx: MigrationContext, updated: cst.For):
    """`for i in range(torch.cuda.device_count()): torch.cuda.get_device_capability(i)`
    (deepspeed's op builder): a count that decides how often CUDA-only code runs stays CUDA's
    (0 on a TPU: the loop does not run) while its body is CUDA-only."""
    found = _GuardUses(ctx.guards)
    scan(updated.iter, found)
    if not found.uses:
        return updated
    left = residual_cuda(ctx, updated.body)
    if left is None:
        return updated
    restore = {key: _put_back(ctx, key, left, "where_in_loop", then="then_no_loop")
               for key in found.uses}
    return updated.with_changes(iter=updated.iter.visit(_Restore(restore)))


def _last_statement(body: cst.BaseSuite):
    last = body.body[-1] if body.body else None
    if isinstance(last, cst.SimpleStatementLine):
        last = last.body[-1] if last.body else None
    return last


def _exits(body: cst.BaseSuite) -> bool:
    return isinstance(_last_statement(body), (cst.Return, cst.Raise, cst.Continue, cst.Break))


def restore_flags(ctx: MigrationContext, original: cst.CSTNode, updated: cst.Assign):
    """`self.is_cuda = device.type == "cuda" and torch.cuda.is_available()`, read later by
    `if self.is_cuda: stream = torch.cuda.Stream(...)` (timm's prefetcher): a flag that guards
    CUDA-only code keeps its CUDA test, so that it stays False on a TPU."""
    if isinstance(updated.value, cst.IfExp):
        return updated  # a value chosen by a test (`device = ... if ... else ...`), not a flag
    found = _GuardUses(ctx.guards)
    scan(updated.value, found)
    if not found.uses:
        return updated
    # (the flag is known by the variable its target is in the file as written)
    for target in (original if isinstance(original, cst.Assign) else updated).targets:
        flag = flag_key(ctx, target.target)
        left = flag and cuda_under_flag(ctx, flag)
        if left:
            name = flag_name(target.target)
            restore = {key: _put_back(ctx, key, left, "where_under_flag", name=name)
                       for key in found.uses}
            return updated.with_changes(value=updated.value.visit(_Restore(restore)))
    return updated


def _put_back(ctx: MigrationContext, key: int, left: str, where: str = "",
              then: str = "then_other_branch", **fields) -> cst.CSTNode:
    """The guard `key` as written; its finding says what it guards that is left (`where`, a
    `where_` message of rules/engines/migrate.toml with its `fields`, says where that is)."""
    original, report, _, shown = ctx.guards.pop(key)
    report.applied = False
    report.fix = FixKind.NONE
    report.message = engine_say(
        "migrate", "guard_left", ctx.target, guard=ctx.short(shown), left=left,
        where=engine_say("migrate", where, ctx.target, **fields) if where else "",
        then=engine_say("migrate", then, ctx.target))
    return original

# What no rule ports (streams, events, graphs, RNG state, NVTX): a flag whose `if` leads to
# one of these is a CUDA-only guard.
# (rules/catalog/cuda.toml's cuda_only_torch)



class _GuardUses(cst.CSTVisitor):
    """The registered guards in a test, each with whether it is negated (`not ...`)."""

    def __init__(self, guards: dict) -> None:
        self.guards = guards
        self.uses: dict[int, bool] = {}
        self.negations = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) in self.guards:
            self.uses[id(node)] = self.negations % 2 == 1
            return False
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            self.negations += 1
        return True

    def on_leave(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            self.negations -= 1


class _Restore(cst.CSTTransformer):
    def __init__(self, originals: dict) -> None:
        self.originals = originals

    def on_leave(self, original, updated):
        return self.originals.get(id(original), updated)


def residual_cuda(ctx: MigrationContext, node: cst.CSTNode, strings: bool = False,
                  half: bool = False) -> str | None:
    """The first CUDA-only thing left in rewritten code (a torch.cuda name, a name or module
    that says cuda, a `.cuda()` call, a "cuda" device string, a CUDA-only library; with
    `strings`, any string that says gpu or cuda; with `half`, torch.float16, which code a
    guard decides picks because a GPU is there), or None."""
    finder = _ResidualCuda(ctx, strings, half)
    scan(node, finder)
    return finder.found


class _ResidualCuda(cst.CSTVisitor):
    def __init__(self, ctx: MigrationContext, strings: bool, half: bool = False) -> None:
        self.ctx = ctx
        self.strings = strings
        self.half = half
        self.found: str | None = None
        # strings a comparison reads (`args.dist_backend == "nccl"`): a question about a
        # value, which runs the same on a TPU; a CUDA device string compared is still CUDA's
        self.compared: set[int] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.found is not None:
            return False
        if isinstance(node, cst.Comparison):
            self.compared.update(id(o) for o in (node.left, *(c.comparator for c in
                                                                node.comparisons))
                                 if isinstance(o, cst.SimpleString)
                                 and not is_cuda_device_string(o))
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value == "cuda" and not self.ctx.qualify(node.func):
            self.found = self.ctx.short(node)  # `x.cuda()` left as written
            return False
        if isinstance(node, cst.Call) and self.ctx.target == "xla" and _pins(self.ctx, node):
            # on XLA pinned host memory is a CUDA copy aid: a value's `.pin_memory()`, torch's
            # `pin_memory=` (a flag of that name decides nothing)
            self.found = self.ctx.short(node)
            return False
        if isinstance(node, (cst.Attribute, cst.Name)):
            # what a name stands for (torch.cuda, a CUDA-only library), never how a variable
            # or attribute is spelled (`args.cuda` is a flag)
            name = self.ctx.qualify(node) or ""
            # float16 chosen because a GPU is there (transformers' AQLM quantizer: "CUDA
            # available. ... loading the model in torch.float16"): a TPU computes in bfloat16
            half = self.half and name in _HALF
            if name == "torch.cuda" or name.startswith("torch.cuda.") or half or (
                    cuda_library(name) and name not in ported_names(self.ctx)):
                self.found = self.ctx.short(node)
                return False
        elif isinstance(node, (cst.Import, cst.ImportFrom)):
            modules = ([dotted(node.module) or ""] if isinstance(node, cst.ImportFrom)
                       else [dotted(a.name) or "" for a in node.names])
            hit = next((m for m in modules if cuda_library(m)), None)
            if hit is not None and not ported_import(self.ctx, node):
                self.found = f"import {hit}"  # `import fla`, `from apex import amp`
            return False
        elif isinstance(node, cst.Assign) and _is_device_index(self.ctx, node):
            # ultralytics' exporter: `if ... torch.cuda.is_available(): self.args.device = "0"`
            # (a CUDA device index, for its select_device)
            self.found = self.ctx.code(node).strip()
            return False
        elif isinstance(node, cst.SimpleString) and id(node) not in self.compared and (
                is_cuda_device_string(node) or CUDA_WORD.match(string_value(node) or "")
                or cuda_library(string_value(node) or "")
                or (self.strings and cuda_package(string_value(node)))):
            # a CUDA-only distribution ("onnxruntime-gpu") or package by its exact name
            # (transformers' `_is_package_available("mamba_ssm")` under a CUDA test); what a
            # message says ("Launching training on one GPU.") decides nothing
            self.found = node.value
        return True


_HALF = frozenset({"torch.float16", "torch.half"})


def _pins(ctx: MigrationContext, call: cst.Call) -> bool:
    """`call` pins host memory: a value's `.pin_memory()` (a Tensor's or a batch's method), or
    one of torch's functions given `pin_memory=` (not `False`): `DataLoader(...,
    pin_memory=True)`, `torch.empty(..., pin_memory=flag)`."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "pin_memory" \
            and ctx.qualify(call.func) is None:
        return True
    if not (ctx.qualify(call.func) or "").startswith("torch."):
        return False
    return any(a.keyword is not None and a.keyword.value == "pin_memory"
               and not (isinstance(a.value, cst.Name) and a.value.value == "False")
               for a in call.args)

_INDEX = re.compile(r"[0-9]+(?:,[0-9]+)*\Z")  # "0", "0,1": CUDA device indices


def _halves(ctx: MigrationContext, node: cst.CSTNode) -> dict:
    """The float16 dtypes in `node` (by what they name), each mapped to torch.bfloat16."""
    return {id(n): ctx.expr(f"{ctx.torch_name()}.bfloat16") for n in walk(node)
            if isinstance(n, (cst.Attribute, cst.Name)) and ctx.qualify(n) in _HALF}


def _is_device_index(ctx: MigrationContext, node: cst.Assign) -> bool:
    """`device = "0"`: a bare index given to a variable the program uses as a device names
    a CUDA device."""
    value = string_value(node.value) if isinstance(node.value, cst.SimpleString) else None
    if value is None or not _INDEX.match(value):
        return False
    return any(ctx.values.used_as_device_string(t.target) for t in node.targets)
