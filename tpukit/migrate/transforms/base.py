"""The shared base of every rule's code, and the registry that maps codes to it.

A transform defines hooks the engine batches into one traversal:
- `visit_<Node>(node)` runs top-down and may return a replacement planned for the whole node
  (an expression node, or a `StatementPlan` for a small statement); its children are then
  skipped, so nothing inside is reported twice.
- `leave_<Node>(original, updated)` runs bottom-up and may return a local rewrite.
Match on `original` (what the user wrote), build from `updated` (children already rewritten).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate import policy
from tpukit.migrate.analysis import PROVIDERS
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import MigrationContext
from tpukit.rules import Rule, check_table_keys, engine_say


@dataclass
class StatementPlan:
    """A small statement becomes `statements` (none: removed, leaving `comment` behind)."""

    statements: list[cst.BaseSmallStatement] = field(default_factory=list)
    comment: str | None = None


# Words of the statements that bind the script's device (`device = torch.device("cuda")`,
# `dev = torch.device(...)`): a rule that reads the device variable in scope needs them
# traversed; with the names the dataflow says hold a device (whatever they are called).
DEVICE_FACT_WORDS = ("device", "cuda")


class Transform:
    # Qualified names this rule rewrites in a leave hook (after the generic unmapped-API rule
    # has looked at them): listed so that rule leaves them alone.
    claims: frozenset[str] = frozenset()
    # The analyses it reads (tpukit/migrate/analysis PROVIDERS), declared as libcst's
    # METADATA_DEPENDENCIES are: "device_facts" has the statements that bind the device
    # variable traversed. A name PROVIDERS lacks is refused when the rule registers.
    uses: frozenset[str] = frozenset()
    # The keys of its rule's `[targets.T]` table it reads, besides the ones every table may
    # hold (rules.DOC_KEYS, rules.RULE_KEYS): a rule file with any other key is refused
    # (check_tables; tests/test_rule_schema.py checks each module reads no undeclared key).
    table_keys: frozenset[str] = frozenset()

    def __init__(self, rule: Rule, ctx: MigrationContext) -> None:
        self.rule = rule
        self.ctx = ctx
        self.mapping = rule.target(ctx.target)
        ctx.claimed.update(self.claims)

    def statement_triggers(self, source: str) -> set[str]:
        """The one place that says which statements this rule must see (the others are not
        traversed, prune.py): the rule file's `statement_triggers` (else its `triggers`), the
        device-binding words for a rule that reads the device variable, and what a rule adds
        from this file's text by overriding this (names only the file knows, e.g. a class
        whose instances the rule must follow). tests/test_pruning.py fails when a word is
        missing."""
        words = set(self.rule.statement_triggers or self.rule.triggers)
        if "device_facts" in self.uses:
            words.update(DEVICE_FACT_WORDS)
            words.update(self.ctx.values.names_of({K.DEVICE}))
        return words

    def say(self, key: str, /, **values) -> str:
        """The message `key` of this rule on this target, from the rule file (Rule.say): every
        text a rule reports is a template there (or, for a data-driven engine's own texts, in
        rules/engines/ENGINE.toml), `{name}` fields filled from `values`."""
        return self.rule.say(self.ctx.target, key, **values)

    def library_leaves(self, node: cst.CSTNode, case: str, message) -> bool:
        """Where the policy table keeps `case` of this rule as written in this file's code
        (rules/catalog/ownership.toml: library code's own choices), `node` is reported with
        `message()` (the table's "report") and left (True); elsewhere, and in CUDA-only code
        (whose own finding says why), False. For what does nothing on a TPU host as written
        (a cuDNN flag, `torch.cuda.empty_cache()`), asks for the host's CUDA, or is the
        library's own choice of how to run (its `torch.compile` backend)."""
        rule = self.rule.code if self.rule.code in policy.table().get("library", {}) \
            else self.rule.extra.get("engine", self.rule.code)
        if self.ctx.cuda_only or not self.ctx.owner_leaves(rule, case):
            return False
        if self.ctx.owner_reports(rule, case):
            self.ctx.report(self.rule, node, message(), applied=False, fix=FixKind.NONE,
                            severity=Severity.INFO)
        return True

    def library_keeps_cuda_check(self, node: cst.CSTNode, shown: cst.CSTNode) -> bool:
        """In library code (a package module) a CUDA check stays as written, with a finding.
        It picks the library's CUDA path, which may hold what XLA cannot run (transformers'
        generate: `self.device.type == "cuda"` turns on torch.compile with inductor, which
        raised `KeyError: 'xla'` on XLA); the library's path for other devices is the one it
        supports for CPU, MPS or XLA, and what the original ran on a TPU."""
        if not self.ctx.owner_leaves(self.rule.code, "cuda_check"):
            return False
        self.ctx.report(self.rule, node, engine_say("migrate", "library_cuda_check",
                                                    self.ctx.target, code=self.ctx.short(shown)),
                        applied=False, fix=FixKind.NONE, severity=Severity.WARNING)
        return True

    def per_function(self, cache: dict, analyse):
        """`analyse(function)` of the innermost `def` being walked, once per function (kept in
        the rule's own `cache`); None outside any."""
        function = next((f for f in reversed(self.ctx.functions)
                         if isinstance(f, cst.FunctionDef)), None)
        if function is None:
            return None
        if id(function) not in cache:
            cache[id(function)] = analyse(function)
        return cache[id(function)]

    def fix_or_report(self, node: cst.CSTNode, message: str, build, fix: FixKind | None = None,
                      **extra):
        """Report `node`; return `build()` when this rule may fix it here, else None. `fix`: this
        finding's kind where it differs from the rule's (`.half()` outside a training script
        is an unsafe fix of a rule that is safe in one); `extra`: the finding's."""
        fixable = self.rule.maps(self.ctx.target) and self.ctx.can_fix(self.rule, fix)
        replacement = build() if fixable else None
        self.ctx.report(self.rule, node, message, applied=replacement is not None, fix=fix,
                        **extra)
        return replacement


TRANSFORMS: dict[str, type[Transform]] = {}
ENGINES: dict[str, type[Transform]] = {}  # data-driven kinds, named by a rule's `engine` key


def _check_uses(cls) -> None:
    unknown = sorted(set(cls.uses) - set(PROVIDERS))
    if unknown:
        raise ValueError(f"{cls.__module__}.{cls.__name__} uses {', '.join(unknown)}: not an "
                         f"analysis (tpukit/migrate/analysis PROVIDERS: {', '.join(PROVIDERS)})")


def transform(*codes: str):
    def register(cls):
        _check_uses(cls)
        for code in codes:
            TRANSFORMS[code] = cls
        return cls

    return register


def engine(kind: str):
    def register(cls):
        _check_uses(cls)
        ENGINES[kind] = cls
        return cls

    return register


def transform_for(rule: Rule) -> type[Transform] | None:
    kind = rule.extra.get("engine")
    return ENGINES.get(kind) if kind else TRANSFORMS.get(rule.code)


def check_tables(rules) -> None:
    """Refuse (RuleError, at the file's line) a rule whose target table holds a key its own
    transform does not read: the one check of the whole selection, before any file. Every
    transform module is imported first: a rule whose code is not registered yet would pass
    unchecked."""
    from tpukit.migrate.transforms import load_transforms

    load_transforms()
    for rule in rules:
        cls = transform_for(rule)
        if cls is not None:
            check_table_keys(rule, cls.table_keys, f"{cls.__name__} ({cls.__module__})")


class HookTable:
    """visit_/leave_ hooks of a set of transforms, grouped by node type name."""

    def __init__(self, transforms: list[Transform]) -> None:
        self.visit: dict[str, list] = {}
        self.leave: dict[str, list] = {}
        for t in transforms:
            for attr in dir(type(t)):
                kind, _, node_type = attr.partition("_")
                if kind in ("visit", "leave") and node_type[:1].isupper():
                    getattr(self, kind).setdefault(node_type, []).append(getattr(t, attr))

