"""What every rule's code shares while one file is rewritten, held together: name
resolution (names.py), the device facts (device_facts.py), and the edit and report sink
(sink.py), with the traversal's own position (the enclosing assignments, whether it is in an
import) and a per-file memo. The three parts' methods are bound here, so rule code writes
`ctx.qualify(...)`, `ctx.report(...)`, `ctx.device_expr()`; new code may use the parts.
"""

from __future__ import annotations

import io
import re
import tokenize

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.values import Values
from tpukit.migrate.device_facts import DeviceFacts
from tpukit.migrate.names import Names
from tpukit.migrate.ownership import Owner
from tpukit.migrate.nodes import (  # noqa: F401 - the helpers rule code imports from here
    _ShiftContinuations,
    dotted,
    find_keyword,
    import_target,
    integer_value,
    is_cpu_device,
    is_cuda_device_string,
    keyword_arg,
    plain_positional,
    string_value,
    terminal_name,
    with_commas,
    with_string,
)
from tpukit.migrate.nodes import parent_map, walk
from tpukit.migrate import policy
from tpukit.migrate.analysis.cuda_code import builds_a_package, cuda_only_module
from tpukit.migrate.sink import IMPORTS, EditSink, Report  # noqa: F401

# Every launcher's name (catalog.SPAWNS) is written where the file imports or calls it: a
# file without one of these words calls none (a sound prefilter; what decides is the name a
# call resolves to).
_LAUNCHER_NAMES = re.compile(r"spawn|launch|start_processes")


class MigrationContext:
    def __init__(
        self, module: cst.Module, target: str, unsafe_fixes: bool, source: str = "",
        path: str = "", owner: Owner = Owner.PROGRAM, received=None, module_name: str = "",
    ) -> None:
        self.module = module
        self.source = source  # the file's text, for cheap whole-file lookups (regex prepasses)
        self.path = path  # the file's path, for the local modules it imports
        self.target = target
        self.unsafe_fixes = unsafe_fixes
        self.names = names = Names(module, source)
        self.sink = sink = EditSink(target, unsafe_fixes, names, path)
        self.devices = devices = DeviceFacts(target, path, source, names, sink.need_import)
        devices.module = module
        # The facts the traversal feeds (their visit_<Node>/leave_<Node> methods, run before
        # any rule's hook): the engine knows them by this tuple only.
        self.facts = (devices,)
        devices.values = _LazyValues(self)
        self.assign_targets: list[list[cst.BaseExpression]] = []  # enclosing assignments' targets
        self.in_import = False
        self.claimed: set[str] = set()  # qualified names some active rule rewrites
        self._memo: dict = {}
        # statements a rule asked to follow (track) -> what the traversal made of them (a
        # node, a FlattenSentinel, a RemovalSentinel), for a rule that moves statements
        # within a block: their results are found in the rewritten block by identity
        self.left_as: dict[cst.CSTNode, object] = {}
        # The parts' state and methods, bound here (the same objects: no copy, no indirection).
        self.aliases, self.functions = names.aliases, names.functions
        self.qualify, self.resolve, self.reached = names.qualify, names.resolve, names.reached
        self.add_import, self.add_import_from = names.add_import, names.add_import_from
        self._local_names = names.local_names
        self.reports, self.handled = sink.reports, sink.handled
        self.imports_needed, self.side_effect_imports = sink.imports_needed, sink.side_effect_imports
        self.helpers_needed, self.cuda_only = sink.helpers_needed, sink.cuda_only
        self.guards, self.guarded_after = sink.guards, sink.guarded_after
        self.fstring_quotes = sink.fstring_quotes
        self.report, self.can_fix, self.add_guard = sink.report, sink.can_fix, sink.add_guard
        self.expr, self.statement = sink.expr, sink.statement
        self.need_import, self.torch_name = sink.need_import, sink.torch_name
        self.device_type, self.device_module = devices.device_type, devices.device_module
        self.device_object_in_code = devices.device_object_in_code
        self.package_module = devices.package_module
        # Library code: a package's module ported in library mode (ownership.py). Its own
        # choices stay as written; a package's module runs at import either way.
        self.owner = owner
        # Facts from the program's other modules (analysis/program.py), and this module's
        # dotted name among them.
        self.received = received
        self.module_name = module_name
        # (a library's build script, which calls setuptools' setup(), is run on every host
        # that installs the library: library code too, not a program to run on a TPU)
        self.library_code = owner is Owner.LIBRARY and (
            self.package_module or builds_a_package(module))
        if self.library_code and (why := cuda_only_module(module, module_name or path)):
            sink.cuda_only.append(why)  # the whole module: findings only
        self.at_import_time = devices.at_import_time
        self.import_time_reason = devices.import_time_reason

    def owner_leaves(self, rule: str, case: str) -> bool:
        """Does the policy table (rules/catalog/ownership.toml) keep `case` of `rule` (a
        code, or an engine's name) as written in this file's code? Program code: never."""
        if not self.library_code:
            return False
        return policy.action(self.owner, rule, case) != "rewrite"

    def owner_reports(self, rule: str, case: str) -> bool:
        """... and with a finding (the table's "report"; "leave" says nothing)."""
        return self.library_code and policy.action(self.owner, rule, case) == "report"

    @property
    def values(self) -> Values:
        """The kinds of this file's values by dataflow (analysis/values.py), computed once."""
        return self.memo("values", lambda: Values(
            self.module, received=self.received, module_name=self.module_name,
            is_package=self.path.endswith("__init__.py")))

    @property
    def current_top(self) -> cst.CSTNode | None:
        return self.sink.current_top

    @property
    def device_object(self) -> str:
        """The target's device, as the device rule (TPU101) maps it."""
        return self.devices.device_object

    @property
    def device_move(self) -> str:
        """What `.to()` and `device=` take when the script has no device variable."""
        return self.devices.device_move

    def device_expr(self) -> cst.BaseExpression:
        """The script's device variable when one is in scope, else the target's device."""
        name = self.devices.in_scope()
        return cst.Name(name) if name else self.expr(self.devices.device_move)

    def memo(self, key, compute):
        """`compute()` once per file, shared by every rule that asks under `key`."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def parents(self) -> dict[int, cst.CSTNode]:
        """id() of each node of the file -> its parent, built once per file (for the rules that
        look above a statement: TPU513's whole-file proof, TPU514's loops)."""
        return self.memo("parents", lambda: parent_map(self.module))

    def scope_text(self) -> str:
        """The code of the enclosing function, or the module's text at its top level (once per
        scope): what a rule's "does this function ..." checks read."""
        scope = self.functions[-1] if self.functions else None
        return self.memo(("scope_text", id(scope)),
                         lambda: self.code(scope) if scope is not None else self.source)

    def library_hands_off(self) -> bool:
        """Is the current code a function of library code (a package module) that does
        nothing with a device? What it is given is its caller's (CPU data, DeepSpeed's CPU
        Adam in a child process): a barrier or `xm.save` there would start the XLA runtime
        where the original never touched a device."""
        if not self.library_code or not self.functions:
            return False
        scope = self.functions[-1]
        return not self.memo(("device_work", id(scope)), lambda: _device_work(self, scope))

    def launch_calls(self) -> set[int]:
        """id() of the file's calls that start processes (`mp.spawn`, `xmp.spawn`,
        `torch_xla.launch`: catalog.SPAWNS), by what the called name resolves to."""
        def compute() -> set[int]:
            if not _LAUNCHER_NAMES.search(self.source):
                return set()  # no launcher's name is written: none is called (the usual case)
            return {id(call) for call, _ in self.values.calls
                    if self.values.qualified(call.func) in K.SPAWNS}

        return self.memo("launch_calls", compute)

    def in_launcher(self) -> bool:
        """Is the current code in the scope (function, or the module's top level) that calls
        `mp.spawn`/`torch_xla.launch`? There the XLA runtime must not be touched yet."""
        scope = self.functions[-1] if self.functions else None

        def compute() -> bool:
            calls = self.launch_calls()
            if not calls:
                return False
            if scope is not None:
                return any(id(n) in calls for n in walk(scope))
            return any(id(n) in calls for s in self.module.body
                       if not isinstance(s, (cst.FunctionDef, cst.ClassDef)) for n in walk(s))

        return self.memo(("launcher", id(scope)), compute)

    def with_func(self, original: cst.Call, updated: cst.Call,
                  func: cst.BaseExpression) -> cst.Call:
        """`updated` calling `func` instead. Arguments that continue on lines aligned with
        something on the call's first line, right of its parenthesis (`torch.save({...,\n
        ...})`), move with it, so `xm.save({...,` keeps them aligned; a hanging indent, or a
        call whose column is not certain, is left as it was."""
        new = updated.with_changes(func=func)
        old_func = self.code(original.func)
        delta = len(self.code(func)) - len(old_func)
        first, _, rest = self.code(original).partition("\n")
        if not delta or not rest or isinstance(original.whitespace_before_args,
                                               cst.ParenthesizedWhitespace):
            return new
        lines = [line for line in self.source.splitlines() if first in line]
        if len(lines) != 1:
            return new  # the call's line is not unique: its column is not certain
        # libcst keeps a continuation's indent relative to the enclosing block's indentation.
        line = lines[0]
        paren = line.index(first) - (len(line) - len(line.lstrip())) + len(old_func)
        continuation = rest.splitlines()[0]
        if len(continuation) - len(continuation.lstrip(" ")) <= paren:
            return new  # a hanging indent: not aligned with anything on the call's first line
        return new.with_changes(args=[a.visit(_ShiftContinuations(delta)) for a in new.args])

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def short(self, node: cst.CSTNode, limit: int = 60) -> str:
        """The code of `node` on one line, its comments left out, cut at `limit`."""
        code = self.code(node)
        if "#" in code:
            code = _without_comments(code)
        text = " ".join(code.split())
        return text if len(text) <= limit else text[: limit - 3] + "..."


def _without_comments(code: str) -> str:
    """`code` with its comments removed (a `#` inside a string stays)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code
    lines = code.splitlines(keepends=True)
    for token in reversed(tokens):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            line = lines[row - 1]
            lines[row - 1] = line[:col].rstrip() + ("\n" if line.endswith("\n") else "")
    return "".join(lines)


class _LazyValues:
    """The context's Values, built the first time a device fact reads them."""

    def __init__(self, ctx: MigrationContext) -> None:
        self._ctx = ctx

    def __getattr__(self, name):
        return getattr(self._ctx.values, name)


def _device_work(ctx: MigrationContext, scope: cst.CSTNode) -> bool:
    """Does `scope` do anything with a device: move a value (`.to(...)`, `.cuda()`), call the
    CUDA, accelerator or XLA APIs, or read a value the dataflow says is a device?"""
    for node in walk(scope):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value in ("to", "cuda") and not ctx.qualify(node.func):
            return True
        if isinstance(node, (cst.Name, cst.Attribute)):
            name = ctx.qualify(node) or ""
            if name.split(".")[0] in ("torch_xla", "torch_tpu") or name.startswith(
                    ("torch.cuda", "torch.accelerator", "torch.device")):
                return True
            if isinstance(node, cst.Name) and K.DEVICE in ctx.values.kinds(node):
                return True
    return False
