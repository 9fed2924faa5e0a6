"""What every rule's code shares while one file is rewritten: name resolution, scopes,
reporting, and the imports and helpers the rewritten code needs.

Names are resolved from the file's own import statements, in source order, instead of
libcst's QualifiedNameProvider: scope analysis costs ~6x the parse on large trees, and
import-based resolution already makes `import torch as th`, `from torch import cuda` and
`from torch.cuda.amp import autocast as ac` resolve, while a local `cuda` does not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.names import ModuleRebindings
from tpukit.rules import Rule, load_rules

# Alias -> how to import it. Replacement templates use these names and nothing else.
IMPORTS: dict[str, tuple[str, str | None]] = {
    "torch_xla": ("torch_xla", None),
    "xm": ("torch_xla.core.xla_model", "xm"),
    "xr": ("torch_xla.runtime", "xr"),
    "xp": ("torch_xla.debug.profiler", "xp"),
    "pl": ("torch_xla.distributed.parallel_loader", "pl"),
    "torch": ("torch", None),
    "torch_tpu": ("torch_tpu", None),
}
_ALIAS_USE = re.compile(r"\b(" + "|".join(IMPORTS) + r")\.")

_CUDA_DEVICE = re.compile(r"^cuda(:\d+)?$")
_TORCH_PREFIX = re.compile(r"(?<![\w.])torch\.")
_LAUNCH_CALL = re.compile(r"\b(?:mp|multiprocessing|torch_xla)\.(?:spawn|launch)\(|\bspawn\(")

# A name the file uses as a string: compared with a literal (`device == "cuda"`, `device in
# ("cuda", "mps")`), searched (`"cuda" in device`), a str method called on it, or concatenated
# with a literal, or passed as a device type (`torch.autocast(device_type=device)`);
# `cfg["device"] == "cuda"` names its key. `str(device) == "cuda"` and
# `device.type == "cuda"` say nothing about `device` (`.type` names the attribute `type`).
_STR = r"""[rRbBuUfF]{0,2}(?:'[^'\n]*'|"[^"\n]*")"""
_NAME = r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)"
_NOT_CALLED = r"\b(?!\s*[(.\[])"
_STRING_USES = [re.compile(pattern) for pattern in (
    rf"{_NAME}\s*[!=]=\s*{_STR}",
    rf"{_STR}\s*[!=]=\s*{_NAME}{_NOT_CALLED}",
    rf"{_STR}\s+(?:not\s+)?in\s+{_NAME}{_NOT_CALLED}",
    rf"{_NAME}\s+(?:not\s+)?in\s*[\[({{]\s*{_STR}",
    rf"{_NAME}\.(?:startswith|endswith|split|rsplit|partition|lower|upper|strip|replace)\(",
    rf"{_NAME}\s*\+\s*{_STR}",
    rf"""\[\s*['"](\w+)['"]\s*\]\s*[!=]=\s*{_STR}""",
    # torch.autocast and torch.amp.GradScaler take a device *type*, a str (not a torch.device)
    rf"\bdevice_type\s*=\s*{_NAME}\s*[,)]",
    rf"\b(?:autocast|GradScaler)\(\s*{_NAME}\s*[,)]",
)]


def dotted(expr: cst.BaseExpression | None) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        base = dotted(expr.value)
        return None if base is None else f"{base}.{expr.attr.value}"
    return None


def import_target(node: cst.BaseExpression) -> str:
    return dotted(node) or ""


def string_value(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.SimpleString):
        try:
            value = expr.evaluated_value
        except Exception:  # noqa: BLE001 - odd prefixes; not a device string then
            return None
        return value if isinstance(value, str) else None
    return None


def integer_value(expr: cst.BaseExpression) -> int | None:
    """The value of an integer literal in any base (`0xFF`, `0o17`, `1_000`), else None."""
    return expr.evaluated_value if isinstance(expr, cst.Integer) else None


def is_cuda_device_string(expr: cst.BaseExpression) -> bool:
    """"cuda", "cuda:0", f"cuda:{rank}", "cuda:%d" % r, "cuda:{}".format(r), "cuda:" + str(r)."""
    value = string_value(expr)
    if value is not None:
        return bool(_CUDA_DEVICE.match(value))
    if isinstance(expr, cst.FormattedString):
        first = expr.parts[0] if expr.parts else None
        return isinstance(first, cst.FormattedStringText) and first.value in ("cuda:", "cuda")
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Modulo, cst.Add)):
        left = string_value(expr.left)
        return left is not None and left.startswith("cuda:")
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        left = string_value(expr.func.value)
        return expr.func.attr.value == "format" and left is not None and left.startswith("cuda:")
    return False


def is_cpu_device(expr: cst.BaseExpression) -> bool:
    value = string_value(expr)
    if value is not None:
        return value == "cpu"
    if isinstance(expr, cst.Call) and dotted(expr.func) in ("torch.device",) and expr.args:
        return string_value(expr.args[0].value) == "cpu"
    return False


def with_string(expr: cst.SimpleString, value: str) -> cst.SimpleString:
    """The same literal (prefix and quotes kept) holding `value`."""
    quote_start = len(expr.prefix) + len(expr.quote)
    return expr.with_changes(value=expr.value[:quote_start] + value + expr.value[-len(expr.quote):])


def find_keyword(call: cst.Call, name: str) -> cst.Arg | None:
    """The `name=...` argument of a call, if given."""
    return next((a for a in call.args if a.keyword and a.keyword.value == name), None)


def plain_positional(call: cst.Call) -> list[cst.Arg]:
    """The positional arguments before any `*args` (whose positions a rule can know)."""
    plain = []
    for arg in call.args:
        if arg.keyword is not None or arg.star:
            break
        plain.append(arg)
    return plain


def keyword_arg(name: str, expr: cst.BaseExpression) -> cst.Arg:
    """`name=expr`, spaced as PEP 8 writes keyword arguments."""
    return cst.Arg(expr, keyword=cst.Name(name), equal=cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))


def with_commas(args: list[cst.Arg]) -> list[cst.Arg]:
    """Commas between arguments, none after the last (arguments kept from a longer call)."""
    out = []
    for i, arg in enumerate(args):
        last = i == len(args) - 1
        out.append(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT if last else cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))))
    return out


class _ShiftContinuations(cst.CSTTransformer):
    def __init__(self, delta: int) -> None:
        self.delta = delta

    def leave_ParenthesizedWhitespace(self, original, updated):
        indent = updated.last_line.value
        width = max(0, len(indent) + self.delta)
        return updated.with_changes(last_line=cst.SimpleWhitespace(" " * width))


def terminal_name(expr: cst.BaseExpression) -> str:
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        return expr.attr.value
    return ""


class _LocalNames(cst.CSTVisitor):
    """Names a function binds itself (parameters and assignment targets), not imports."""

    def __init__(self, function: cst.FunctionDef | cst.Lambda) -> None:
        self.function = function
        self.names: set[str] = set()

    def visit_FunctionDef(self, node) -> bool:
        return node is self.function

    def visit_Lambda(self, node) -> bool:
        return node is self.function

    def visit_ClassDef(self, node) -> bool:
        return False

    def visit_Import(self, node) -> bool:
        return False

    def visit_ImportFrom(self, node) -> bool:
        return False

    def visit_Param(self, node: cst.Param) -> None:
        self.names.add(node.name.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._bind(node.name)

    def _bind(self, target: cst.CSTNode) -> None:
        if isinstance(target, cst.Name):
            self.names.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind(element.value)
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value)


@dataclass
class Report:
    rule: Rule
    node: cst.CSTNode
    message: str
    applied: bool
    top: cst.CSTNode | None = None  # the top-level statement holding `node`
    fix: FixKind | None = None  # when it differs from the rule's (a table entry with no fix)
    extra: dict = field(default_factory=dict)


def _cuda_only_module(path: str) -> str | None:
    """A package module whose package path says cuda, cudnn, triton or nccl (torch/cuda/amp,
    torch/_dynamo/backends/cudagraphs.py, bitsandbytes/triton/...) is CUDA's own code."""
    if not path:
        return None
    file = Path(path)
    parts = [file.stem]
    folder = file.parent
    while (folder / "__init__.py").is_file() and folder != folder.parent:
        parts.append(folder.name)
        folder = folder.parent
    if len(parts) == 1:
        return None  # a script, not a package's module (fixtures' cuda.py included)
    hit = next((p for p in parts if re.search(r"cuda|cudnn|triton|nccl", p, re.I)), None)
    return f"module `{'.'.join(reversed(parts))}` is CUDA's own code ({hit})" if hit else None


class MigrationContext:
    def __init__(
        self, module: cst.Module, target: str, unsafe_fixes: bool, source: str = "",
        path: str = "",
    ) -> None:
        self.module = module
        self.source = source  # the file's text, for cheap whole-file lookups (regex prepasses)
        self.path = path  # the file's path, for the local modules it imports
        self.target = target
        self.unsafe_fixes = unsafe_fixes
        self.aliases: dict[str, str] = {}
        self.rebindings = ModuleRebindings(module, source)
        self.reports: list[Report] = []
        self.imports_needed: set[str] = set()
        # Modules imported for what importing them does (`torch_xla.distributed.xla_backend`
        # registers the "xla" process-group backend); added whether or not a name is used.
        self.side_effect_imports: set[str] = set()
        self.helpers_needed: set[str] = set()
        self.handled: set[int] = set()  # id() of nodes a rule already spoke for
        # id() of a rewritten guard -> (what was written, its report, negated): guards.py
        self.guards: dict[int, tuple[cst.CSTNode, Report, bool, cst.CSTNode]] = {}
        self.guarded_after: dict[int, list[int]] = {}  # id(if) -> its guards that exit
        # why the enclosing functions (or this module) are CUDA-only code: findings only
        self.cuda_only: list[str] = [why] if (why := _cuda_only_module(path)) else []
        self.assign_targets: list[list[str]] = []  # names the enclosing assignments bind
        self.in_import = False
        self.claimed: set[str] = set()  # qualified names some active rule rewrites
        self.current_top: cst.CSTNode | None = None
        self.fstring_quotes: list[str] = []  # quotes of the f-strings around the current node
        self.functions: list[cst.FunctionDef | cst.Lambda] = []  # enclosing functions
        self._locals: dict[int, set[str]] = {}  # id(function) -> names it binds
        self._memo: dict = {}
        # Names bound to the script's device, innermost scope last.
        self.device_scopes: list[set[str]] = [set()]
        self._branch_blocks: set[int] = set()  # id() of if/else/loop bodies: scopes of their own
        self._elifs: set[int] = set()
        self._bound_in: dict[int, set[str]] = {}  # id(body or elif) -> device names it bound
        # The target's device, as the device rule (TPU101) maps it: an object, what `.to()`
        # and `device=` take when the script has no device variable, and the type string.
        device = load_rules()["TPU101"].target(target)
        self._device_object: str = device["replace"]
        self._device_move: str = device.get("move_to", self._device_object)
        # What names the device without starting the runtime (`torch.device("xla")`), for
        # code a package module runs when it is imported.
        self._device_at_import: str = device.get("at_import", self._device_object)
        self.device_type: str = device["device_type"]
        self.device_module: str = device["imports"][0]
        # A module of a package runs its top level, its defaults and decorators when it is
        # imported: the XLA runtime must not start there (a script's top level is its program).
        name = Path(path).name if path else ""
        self.package_module = bool(path) and (
            name == "__init__.py" or (Path(path).parent / "__init__.py").is_file())
        self.header_depth = 0  # inside parameters (defaults) and decorators of `functions`

    def at_import_time(self) -> bool:
        """Does the current code run when this package module is imported?"""
        return self.package_module and len(self.functions) == self.header_depth

    @property
    def device_object_in_code(self) -> str:
        """The target's device where code runs after import (in functions, in scripts)."""
        return self._device_object

    @property
    def device_object(self) -> str:
        """The target's device, as the device rule (TPU101) maps it."""
        if self.at_import_time():
            self.need_import(self.device_module)
            return self._device_at_import
        return self._device_object

    @property
    def device_move(self) -> str:
        """What `.to()` and `device=` take when the script has no device variable."""
        return self.device_object if self.at_import_time() else self._device_move

    # -- names -------------------------------------------------------------------
    def reached(self, stmt: cst.CSTNode) -> None:
        """The traversal is at `stmt`: imports rebound by module-level statements before it
        name something else now."""
        if self.rebindings.pending:
            self.rebindings.reached(stmt, self.aliases)

    def add_import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = import_target(alias.name)
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.aliases[alias.asname.name.value] = full
            else:
                root = full.split(".")[0]
                self.aliases[root] = root

    def add_import_from(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = import_target(node.module)
        for alias in node.names:
            name = import_target(alias.name)
            bound = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                bound = alias.asname.name.value
            self.aliases[bound] = f"{module}.{name}"

    def resolve(self, expr: cst.BaseExpression | None) -> str | None:
        """The qualified name of a Name/Attribute chain through the imports seen so far,
        wherever it is (no function's locals are looked at): for whole-file scans."""
        path = dotted(expr)
        if path is None:
            return None
        root, _, rest = path.partition(".")
        full = self.aliases.get(root)
        if full is None:
            return None
        return f"{full}.{rest}" if rest else full

    def qualify(self, expr: cst.BaseExpression | None) -> str | None:
        """The qualified name of a Name/Attribute chain, through this file's imports."""
        path = dotted(expr)
        if path is None:
            return None
        root, _, rest = path.partition(".")
        full = self.aliases.get(root)
        if full is None:
            return None
        # `from torch import cuda` and a function's own `cuda` (a parameter, a local): the
        # local wins. Only aliases that differ from their module (`cuda`, `th`) are checked:
        # nobody rebinds `torch` itself, and checking costs a scan of the function.
        if full != root and any(root in self._local_names(f) for f in self.functions):
            return None
        return f"{full}.{rest}" if rest else full

    def _local_names(self, function: cst.FunctionDef | cst.Lambda) -> set[str]:
        names = self._locals.get(id(function))
        if names is None:
            visitor = _LocalNames(function)
            function.visit(visitor)
            names = self._locals[id(function)] = visitor.names
        return names

    # -- device variables in scope ----------------------------------------------------
    def push_scope(self, names: set[str]) -> None:
        self.device_scopes.append(set(names))

    def pop_scope(self) -> set[str]:
        return self.device_scopes.pop()

    # A device name bound inside an if/else branch or a loop body is in scope there only; after
    # an `if` whose every branch (an `else` included) binds it, it is in scope again. The
    # ImageNet example binds `device` in an `elif` and its `else` branch has none.
    def enter_branches(self, node: cst.If | cst.For | cst.While) -> None:
        self._branch_blocks.add(id(node.body))
        if isinstance(node.orelse, cst.Else):
            self._branch_blocks.add(id(node.orelse.body))
        elif isinstance(node, cst.If) and isinstance(node.orelse, cst.If):
            self._elifs.add(id(node.orelse))

    def enter_block(self, block: cst.BaseSuite) -> None:
        if id(block) in self._branch_blocks:
            self.push_scope(set())

    def leave_block(self, block: cst.BaseSuite) -> None:
        if id(block) in self._branch_blocks:
            self._branch_blocks.discard(id(block))
            self._bound_in[id(block)] = self.pop_scope()

    def leave_loop(self, node: cst.For | cst.While) -> None:
        """A loop body may not run: what it bound stays in it."""
        self._bound_in.pop(id(node.body), None)
        if isinstance(node.orelse, cst.Else):
            self._bound_in.pop(id(node.orelse.body), None)

    def leave_if(self, node: cst.If) -> None:
        """The names every branch of this if/elif/else chain binds, bound after it."""
        bound = self._bound_in.pop(id(node.body), set())
        if isinstance(node.orelse, cst.Else):
            bound &= self._bound_in.pop(id(node.orelse.body), set())
        elif isinstance(node.orelse, cst.If):
            bound &= self._bound_in.pop(id(node.orelse), set())
        else:
            bound = set()
        if id(node) in self._elifs:
            self._elifs.discard(id(node))
            self._bound_in[id(node)] = bound  # for the `if` this is the elif of
        else:
            self.device_scopes[-1].update(bound)

    def bind_device(self, name: str) -> None:
        self.device_scopes[-1].add(name)

    def used_as_string(self, name: str) -> bool:
        """Does this file use `name` (a variable, an attribute such as `args.device`, a
        config key) as a string anywhere? Read by every device rule, so that a value that is
        compared as a string stays one (`device == "xla"` is False for a `torch.device`)."""
        names = self.memo("string_names", lambda: {
            match.rpartition(".")[2] for pattern in _STRING_USES
            for match in pattern.findall(self.source)})
        return name in names

    def device_in_scope(self) -> str | None:
        for scope in reversed(self.device_scopes):
            if scope:
                return "device" if "device" in scope else sorted(scope)[0]
        return None

    def device_expr(self) -> cst.BaseExpression:
        """The script's device variable when one is in scope, else the target's device."""
        name = self.device_in_scope()
        return cst.Name(name) if name else self.expr(self.device_move)

    # -- fixes and findings ---------------------------------------------------------
    def can_fix(self, rule: Rule, fix: FixKind | None = None) -> bool:
        if self.cuda_only:
            return False  # CUDA-only code (guards.cuda_only_function): findings only
        fix = fix or rule.fix_for(self.target)
        return fix is FixKind.SAFE or (fix is FixKind.UNSAFE and self.unsafe_fixes)

    def report(
        self,
        rule: Rule,
        node: cst.CSTNode,
        message: str,
        applied: bool,
        fix: FixKind | None = None,
        **extra,
    ) -> None:
        self.handled.add(id(node))
        if isinstance(node, cst.Call):
            self.handled.add(id(node.func))
        if self.cuda_only and not applied and fix is None and rule.fix is not FixKind.NONE:
            message += f" (not rewritten: {self.cuda_only[-1]}: port it by hand)"
        self.reports.append(Report(rule, node, message, applied, self.current_top, fix, extra))

    def _needs(self, template: str) -> str:
        """Note the imports a template needs; `torch.` is written as this file names torch."""
        if self.target == "torchtpu" and ("tpu" in template or "accelerator" in template):
            # registers the "tpu" device, torch.tpu and the backend torch.accelerator reaches
            self.imports_needed.add("torch_tpu")
        if _TORCH_PREFIX.search(template):
            name = self.torch_name()
            if name != "torch":
                template = _TORCH_PREFIX.sub(f"{name}.", template)
        self.imports_needed.update(_ALIAS_USE.findall(template))
        return template

    def expr(self, template: str) -> cst.BaseExpression:
        """Parse a replacement expression and note the imports it needs."""
        template = self._needs(template)
        if any('"' in quote for quote in self.fstring_quotes):
            # Inside f"...{here}...": before Python 3.12 a nested string needs other quotes.
            template = template.replace('"', "'")
        return cst.parse_expression(template)

    def statement(self, template: str) -> cst.BaseSmallStatement:
        return cst.parse_statement(self._needs(template)).body[0]

    def add_guard(self, replacement: cst.CSTNode, original: cst.CSTNode,
                  negated: bool = False, shown: cst.CSTNode | None = None) -> None:
        """`replacement` (just reported) rewrote part of what may be an `if` test: a guard,
        put back by the engine if what it guards is not ported (guards.py). `negated`: the
        test is true when the original was false (`device.type != "cuda"`); `shown`: what the
        finding quotes (the comparison a literal is part of)."""
        self.guards[id(replacement)] = (original, self.reports[-1], negated,
                                        shown if shown is not None else original)

    def need_import(self, alias: str) -> None:
        self.imports_needed.add(alias)

    def memo(self, key, compute):
        """`compute()` once per file, shared by every rule that asks under `key`."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def in_launcher(self) -> bool:
        """Is the current code in the scope (function, or the module's top level) that calls
        `mp.spawn`/`torch_xla.launch`? There the XLA runtime must not be touched yet."""
        scope = self.functions[-1] if self.functions else None

        def compute() -> bool:
            if not _LAUNCH_CALL.search(self.source):
                return False  # no launcher in this file (the usual case): no code generation
            if scope is not None:
                code = self.code(scope)
            else:
                code = "\n".join(self.code(s) for s in self.module.body
                                 if not isinstance(s, (cst.FunctionDef, cst.ClassDef)))
            return bool(_LAUNCH_CALL.search(code))

        return self.memo(("launcher", id(scope)), compute)

    def torch_name(self) -> str:
        """The name this file uses for torch (`torch`, or `th` after `import torch as th`)."""
        for name, full in self.aliases.items():
            if full == "torch":
                return name
        self.need_import("torch")
        return "torch"

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
        text = " ".join(self.code(node).split())
        return text if len(text) <= limit else text[: limit - 3] + "..."
