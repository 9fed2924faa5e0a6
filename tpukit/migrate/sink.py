"""The edit and report sink of one file: what rules reported, and what their edits need
(imports, modules imported for their side effects, helper functions, guards to put back)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from tpukit.findings import FixKind, Message, Severity
from tpukit.migrate.names import Names
from tpukit.rules import Rule, engine_say

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
_TORCH_PREFIX = re.compile(r"(?<![\w.])torch\.")


@dataclass
class Report:
    rule: Rule
    node: cst.CSTNode
    message: Message  # in parts (findings.Message)
    applied: bool
    top: cst.CSTNode | None = None  # the top-level statement holding `node`
    fix: FixKind | None = None  # when it differs from the rule's (a table entry with no fix)
    extra: dict = field(default_factory=dict)
    severity: Severity | None = None  # when it differs from the rule's (nothing to do: info)


class EditSink:
    def __init__(self, target: str, unsafe_fixes: bool, names: Names, path: str = "") -> None:
        self.target = target
        self.unsafe_fixes = unsafe_fixes
        self.names = names
        self.reports: list[Report] = []
        self.imports_needed: set[str] = set()
        # Modules imported for what importing them does (`torch_xla.distributed.xla_backend`
        # registers the "xla" process-group backend); added whether or not a name is used.
        self.side_effect_imports: set[str] = set()
        self.helpers_needed: set[str] = set()
        self.handled: set[int] = set()  # id() of nodes a rule already spoke for
        # id() of a rewritten guard -> (what was written, its report, negated): guards.py
        self.guards: dict[int, tuple[cst.CSTNode, Report, bool, cst.CSTNode]] = {}
        # id(if) -> its guards whose guarded code is what follows the if: (guard, None) for a guard
        # that exits, (guard, names) for one whose code fills names read after it
        self.held: dict[str, str] = {}  # rule code -> why its fixes are held (MigrateOptions)
        self.guarded_after: dict[int, list[tuple[int, frozenset[str] | None]]] = {}
        # why the enclosing functions (or this module) are CUDA-only code: findings only
        # (a library module that is CUDA's or another vendor's own code starts with its why:
        # context.MigrationContext, analysis/cuda_code.py)
        self.cuda_only: list[str] = []
        self.current_top: cst.CSTNode | None = None  # the top-level statement being walked
        self.fstring_quotes: list[str] = []  # quotes of the f-strings around the current node

    def can_fix(self, rule: Rule, fix: FixKind | None = None) -> bool:
        if self.cuda_only:
            return False  # CUDA-only code (analysis/cuda_only.py): findings only
        if rule.code in self.held:
            return False  # a rule it needs is suppressed here (engine._held)
        fix = fix or rule.fix_for(self.target)
        return fix is FixKind.SAFE or (fix is FixKind.UNSAFE and self.unsafe_fixes)

    def report(
        self,
        rule: Rule,
        node: cst.CSTNode,
        message: Message,
        applied: bool,
        fix: FixKind | None = None,
        severity: Severity | None = None,
        **extra,
    ) -> None:
        if not isinstance(message, Message):  # every migrate finding is said in parts
            raise TypeError(f"{rule.code}: a finding's message is a Message, not {message!r}")
        self.handled.add(id(node))
        if isinstance(node, cst.Call):
            self.handled.add(id(node.func))
        if self.cuda_only and not applied and fix is None and rule.fix is not FixKind.NONE:
            message += engine_say("migrate", "cuda_only_code", self.target, why=self.cuda_only[0])
        elif rule.code in self.held and not applied and fix is None \
                and rule.fix is not FixKind.NONE:
            message += self.held[rule.code]
        self.reports.append(Report(rule, node, message, applied, self.current_top, fix, extra,
                                   severity))

    def torch_name(self) -> str:
        """The name this file uses for torch (`torch`, or `th` after `import torch as th`)."""
        name = self.names.torch_alias()
        if name is not None:
            return name
        self.need_import("torch")
        return "torch"

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

    def checkpoint(self) -> tuple:
        """The sink's state now, to undo what hooks ask for after it (`rollback`)."""
        return (len(self.reports), set(self.imports_needed), set(self.side_effect_imports),
                set(self.helpers_needed), dict(self.guards), dict(self.guarded_after),
                set(self.handled))

    def rollback(self, checkpoint: tuple, keep_handled: bool = False) -> list[Report]:
        """Back to `checkpoint`: the reports made since are removed and returned; the nodes
        they spoke for stay spoken for with `keep_handled`."""
        reported, *saved, handled = checkpoint
        for now, then in zip((self.imports_needed, self.side_effect_imports, self.helpers_needed,
                              self.guards, self.guarded_after), saved):
            now.clear()
            now.update(then)
        if not keep_handled:
            self.handled.clear()
            self.handled.update(handled)
        undone = self.reports[reported:]
        del self.reports[reported:]
        return undone
