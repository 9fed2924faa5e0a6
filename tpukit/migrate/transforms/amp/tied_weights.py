"""TPU205 tied-weights: Tied weights are tied again after the model moves to the XLA device.

Its messages and tables: rules/TPU205-tied-weights.toml.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import libcst as cst

from tpukit.migrate.context import dotted
from tpukit.migrate.transforms.base import Transform, transform


_CLASS = re.compile(r"^class\s+(\w+)", re.M)


# A file that ties weights has this text (a sound prefilter; class_ties decides, on the tree).
_TIE = re.compile(r"\w\.[\w.]*weight\s*=\s*\(?\s*\w+\.[\w.]*weight")


def class_ties(node: cst.ClassDef) -> list[tuple[str, str]]:
    """The `self.a.weight = self.b.weight` ties in a class's __init__ (its first parameter,
    whatever it is called), as ("a.weight", "b.weight")."""
    ties = []
    for me, stmt in _init_statements(node):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                left, right = dotted(small.targets[0].target), dotted(small.value)
                if (left and right and left.startswith(me) and right.startswith(me)
                        and left.endswith(".weight") and right.endswith(".weight")):
                    ties.append((left[len(me):], right[len(me):]))
    return ties


def imported_ties(module: cst.Module, path: str) -> dict[str, list[tuple[str, str]]]:
    """Tied classes this file imports from a module beside it, by the name they have here:
    nanoGPT's train.py does `from model import GPT` and model.py ties the embedding. Only
    files next to `path` (or in its package, for relative imports) are read, and only parsed
    when their text has a tie."""
    if not path:
        return {}
    here = Path(path).resolve().parent
    found: dict[str, list[tuple[str, str]]] = {}
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.ImportFrom) and small.module is not None:
                ties = _module_ties(here, len(small.relative), dotted(small.module) or "")
                if ties and not isinstance(small.names, cst.ImportStar):
                    for alias in small.names:
                        name = alias.name.value if isinstance(alias.name, cst.Name) else None
                        bound = (alias.asname.name.value if alias.asname is not None
                                 and isinstance(alias.asname.name, cst.Name) else name)
                        if name in ties:
                            found[bound] = ties[name]
            elif isinstance(small, cst.Import):
                for alias in small.names:
                    module_name = dotted(alias.name) or ""
                    bound = (dotted(alias.asname.name) if alias.asname is not None
                             else module_name)
                    for cls, ties in _module_ties(here, 0, module_name).items():
                        found[f"{bound}.{cls}"] = ties
    return found


def _module_ties(here: Path, level: int, module: str) -> dict[str, list[tuple[str, str]]]:
    if not module:
        return {}
    if level:  # from .model import GPT: the package of this file, `level - 1` up
        if level - 2 >= len(here.parents):
            return {}
        bases = [here.parents[level - 2] if level > 1 else here]
    else:  # the script's directory (sys.path[0]), and the roots of the packages it is in
        bases = [here]
        while (bases[-1] / "__init__.py").is_file():
            bases.append(bases[-1].parent)
    relative = Path(*module.split("."))
    candidates = [c for base in bases
                  for c in (base / relative.with_suffix(".py"), base / relative / "__init__.py")]
    for candidate in candidates:
        if candidate.is_file():
            return _file_ties(str(candidate))
    return {}


@functools.lru_cache(maxsize=256)  # a directory's files import the same model module
def _file_ties(path: str) -> dict[str, list[tuple[str, str]]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    if not _TIE.search(text):
        return {}
    try:
        parsed = cst.parse_module(text)
    except cst.ParserSyntaxError:
        return {}
    return {stmt.name.value: ties for stmt in parsed.body
            if isinstance(stmt, cst.ClassDef) and (ties := class_ties(stmt))}


def _init_statements(node: cst.ClassDef):
    for stmt in node.body.body if isinstance(node.body, cst.IndentedBlock) else ():
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "__init__":
            params = [*stmt.params.posonly_params, *stmt.params.params]
            body = stmt.body
            if params and isinstance(body, cst.IndentedBlock):
                yield from ((params[0].name.value + ".", s) for s in body.body)


@transform("TPU205")
class TiedWeights(Transform):
    """`self.a.weight = self.b.weight` ties two modules' weights. Moving a module to an XLA
    device creates new Parameter objects (XLA tensors cannot share a CPU tensor's storage),
    which unties them: the migrated model trains two separate matrices. The tie is repeated
    right after the model is moved."""

    def statement_triggers(self, source: str) -> set[str]:
        # Classes that tie weights, here or in a module this file imports from beside it:
        # statements that build or move their instances matter.
        names = set(self.ties)
        for match in _CLASS.finditer(source):
            body = source[match.end(): source.find("\nclass ", match.end()) % (len(source) + 1)]
            if _TIE.search(body):
                names.add(match.group(1))
        for name in list(names):  # and the variables that hold instances: `model.to(device)`
            names.update(re.findall(rf"(\w+)\s*=\s*{re.escape(name)}\b", source))
        return super().statement_triggers(source) | names

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        # class -> [(a.weight, b.weight)]; classes imported from local modules first
        self.ties: dict[str, list[tuple[str, str]]] = imported_ties(ctx.module, ctx.path)
        self.models: dict[str, str] = {}  # variable -> class
        self.pending: dict[cst.CSTNode, str] = {}  # line that moves a model -> variable

    def visit_ClassDef(self, node: cst.ClassDef):
        ties = class_ties(node)
        if ties:
            self.ties[node.name.value] = ties

    def _tied_class(self, call: cst.BaseExpression) -> str | None:
        """`GPT(cfg)` or `GPT.from_pretrained(...)`: the tied class it builds."""
        if not isinstance(call, cst.Call):
            return None
        name = dotted(call.func)
        if name in self.ties:
            return name
        owner = name.rpartition(".")[0] if name else ""
        return owner if owner in self.ties else None

    def _moved_model(self, expr) -> str | None:
        """`model.to(...)`/`model.cuda()` or `GPT(cfg).to(...)`: the variable or class moved."""
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("to", "cuda"):
            inner = expr.func.value
            if isinstance(inner, cst.Name) and inner.value in self.models:
                return inner.value
            return self._tied_class(inner)
        return None

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine):
        for small in node.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
                target = small.targets[0].target.value
                value = small.value
                built = self._tied_class(value)
                if built is not None:
                    self.models[target] = built
                moved = self._moved_model(value)
                if moved is not None:
                    self.models[target] = self.models.get(moved, moved)
                    self.pending[node] = target
            elif isinstance(small, cst.Expr):
                moved = self._moved_model(small.value)
                if moved in self.models:
                    self.pending[node] = moved

    def leave_SimpleStatementLine(self, original, updated):
        variable = self.pending.pop(original, None)
        if variable is None:
            return None
        ties = [
            (a, b) for a, b in self.ties[self.models[variable]]
            if not re.search(rf"^\s*{variable}\.{re.escape(a)}\s*=\s*{variable}\.{re.escape(b)}\b",
                             self.ctx.source, re.M)  # tied again already (migrated, hand port)
        ]
        if not ties:
            return None
        lines = [
            cst.parse_statement(f"{variable}.{a} = {variable}.{b}\n") for a, b in ties
        ]
        return self.fix_or_report(
            original,
            self.say("tie", code=self.ctx.short(original), ties=", ".join(a for a, _ in ties)),
            lambda: cst.FlattenSentinel([updated, *lines]),
        )
