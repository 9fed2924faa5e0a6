"""Library mode's contract, kept in one place: a package module ported in library mode
imports and runs exactly as written on every host whose process does not use the TPU
runtime (no torch_xla, or a CUDA machine), and runs the port where it does.

The rules rewrite library code as they rewrite a program; `confine` then puts each rewritten
statement under the runtime's test, next to what was written:

    if _tpukit_on_xla():        # torch_xla is imported in this process
        <the port>
    else:
        <the statement as written>

A compound statement whose body changed keeps its header and has its body confined; a
changed header test (`if`, `while`, a `for`'s iterable, a `with`'s items) becomes
`(ported if _tpukit_on_xla() else written)`. A definition's header (defaults, decorators,
bases) runs when the module is imported, before a program can have imported torch_xla: it
stays as written, and the rewrites there are reported as not applied (`library_header`).
The port's torch_xla imports go inside the branches that use them (import_fixup.fix_imports),
never at the top of the module, so importing the library never imports torch_xla.

`_tpukit_on_xla` asks `sys.modules`: it imports nothing and is False until the program has
imported torch_xla (or torch_tpu on the torchtpu target).
"""

from __future__ import annotations

import ast
import difflib

import libcst as cst

from tpukit.migrate.nodes import import_bindings, is_docstring, scan, walk

_EMPTY = cst.Module(body=[])
# The inserted test of each target: the helper's name and the module whose import it asks for.
TESTS = {"xla": ("_tpukit_on_xla", "torch_xla"), "torchtpu": ("_tpukit_on_torchtpu", "torch_tpu")}


def helper_source(target: str) -> str:
    name, module = TESTS[target]
    return f'''
def {name}():
    """Library mode (inserted by tpukit): True once this process has imported {module}; the
    code as written runs until then, and wherever it is not imported."""
    import sys

    return sys.modules.get("{module}") is not None
'''


def is_test(node: cst.CSTNode, target: str) -> bool:
    """Is `node` the inserted test (`_tpukit_on_xla()`), or its negation?"""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        node = node.expression
    return (isinstance(node, cst.Call) and not node.args and isinstance(node.func, cst.Name)
            and node.func.value == TESTS[target][0])


def confined(node: cst.CSTNode, target: str) -> bool:
    """Is `node` a choice `confine` made (its branches are the port and the code as written:
    a second run leaves both alone)?"""
    return isinstance(node, (cst.If, cst.IfExp)) and is_test(node.test, target)


def _code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _statements(body: cst.BaseSuite) -> list[cst.BaseStatement]:
    if isinstance(body, cst.IndentedBlock):
        return list(body.body)
    return [cst.SimpleStatementLine(body=list(body.body))]  # `def f(): return x`


class Confinement:
    """One file's confinement: the module, and the definitions whose headers were kept."""

    def __init__(self, target: str, header_needs_import) -> None:
        self.target = target
        self.name = TESTS[target][0]
        # Does an expression of the port need a name only an import of ours binds (`xm`)?
        # Such a header is not made a conditional expression (it has nowhere to import).
        self.header_needs_import = header_needs_import
        self.kept_headers: list[cst.CSTNode] = []  # header parts kept as written
        self.rebound: list[cst.CSTNode] = []  # ... whose default a call on XLA rebinds
        self.used = False

    def _call(self) -> cst.Call:
        self.used = True
        return cst.Call(func=cst.Name(self.name))

    # -- blocks ----------------------------------------------------------------------
    def block(self, olds: list, news: list) -> list:
        """The statements of one block: the unchanged ones as they are, the changed ones
        confined (by pairs where the same compound statement was rewritten inside)."""
        if len(olds) == len(news) and all(o is n for o, n in zip(olds, news)):
            return news
        old_keys, new_keys = [self._key(s) for s in olds], [self._key(s) for s in news]
        out: list = []
        matcher = difflib.SequenceMatcher(None, old_keys, new_keys, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            old_run, new_run = olds[i1:i2], news[j1:j2]
            if tag == "equal" or (tag == "replace" and len(old_run) == len(new_run) and all(
                    type(o) is type(n) and not isinstance(o, cst.SimpleStatementLine)
                    for o, n in zip(old_run, new_run))):
                for old, new in zip(old_run, new_run):
                    out.extend(self.pair(old, new))
            else:
                out.extend(self.wrap(old_run, new_run))
        return out

    def _key(self, stmt: cst.CSTNode) -> str:
        """What pairs a statement with its rewritten self: a simple statement's code; a
        compound statement's kind and header (a definition's name: its header is kept)."""
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            return f"{type(stmt).__name__} {stmt.name.value}"
        if isinstance(stmt, (cst.If, cst.While)):
            return f"{type(stmt).__name__} {_code(stmt.test)}"
        if isinstance(stmt, cst.For):
            return f"for {_code(stmt.target)} in {_code(stmt.iter)}"
        if isinstance(stmt, cst.With):
            return "with " + ", ".join(_code(item) for item in stmt.items)
        if isinstance(stmt, (cst.Try, cst.TryStar)):
            return type(stmt).__name__
        return _code(stmt)

    def pair(self, old: cst.CSTNode, new: cst.CSTNode) -> list:
        if old is new or _code(old) == _code(new):
            return [new]
        if isinstance(old, cst.SimpleStatementLine) or type(old) is not type(new):
            return self.wrap([old], [new])
        rebuilt = self._compound(old, new)
        return self.wrap([old], [new]) if rebuilt is None else [rebuilt]

    def wrap(self, olds: list, news: list) -> list:
        """`if on_xla(): news else: olds` (a side left empty drops out)."""
        if not olds and not news:
            return []
        first = (olds or news)[0]
        leading = first.leading_lines
        olds = _without_leading(olds)
        news = _without_leading(news)
        if not news:
            test = cst.UnaryOperation(operator=cst.Not(), expression=self._call())
            return [cst.If(test=test, body=cst.IndentedBlock(body=olds), leading_lines=leading)]
        orelse = cst.Else(body=cst.IndentedBlock(body=olds)) if olds else None
        return [cst.If(test=self._call(), body=cst.IndentedBlock(body=news), orelse=orelse,
                       leading_lines=leading)]

    def _suite(self, old: cst.BaseSuite, new: cst.BaseSuite) -> cst.BaseSuite:
        if old is new or _code(old) == _code(new):
            return new
        body = self.block(_statements(old), _statements(new))
        if isinstance(new, cst.IndentedBlock):
            return new.with_changes(body=body)
        return cst.IndentedBlock(body=body)

    def _choice(self, old: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression | None:
        """`(new if on_xla() else old)` for a changed header expression; None when the two
        are the same, False when the port's form needs an import (wrap the statement)."""
        if old is new or _code(old) == _code(new):
            return None
        if self.header_needs_import(new):
            raise _WrapWhole
        return cst.IfExp(test=self._call(), body=new.with_changes(lpar=(), rpar=()),
                         orelse=old.with_changes(lpar=(), rpar=()),
                         lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    def _orelse(self, old, new):
        if old is None and new is None:
            return None
        if old is None or new is None or type(old) is not type(new):
            raise _WrapWhole
        if isinstance(old, cst.If):  # elif
            rebuilt = self._compound(old, new)
            if rebuilt is None:
                raise _WrapWhole
            return rebuilt
        return new.with_changes(body=self._suite(old.body, new.body))

    def _rebound_defaults(self, old: cst.FunctionDef, new: cst.FunctionDef):
        """A parameter default the port changed (`device="cuda"` made `"xla"`) stays as
        written in the header (it runs at import); when the function runs on XLA, the written
        default becomes the port's: `if _tpukit_on_xla(): if device == "cuda": device = "xla"`.
        Only for a default that is a string (a device's name): (statements, defaults)."""
        statements, defaults = [], []
        # an earlier run's rebinding: `if _tpukit_on_xla(): if name == ...: name = ...`
        done = {inner.test.left.value for stmt in _statements(old.body)[:3]
                if isinstance(stmt, cst.If) and confined(stmt, self.target)
                for inner in _statements(stmt.body) if isinstance(inner, cst.If)
                and isinstance(inner.test, cst.Comparison) and isinstance(inner.test.left, cst.Name)}
        olds = [*old.params.params, *old.params.kwonly_params, *old.params.posonly_params]
        news = [*new.params.params, *new.params.kwonly_params, *new.params.posonly_params]
        for was, now in zip(olds, news):
            if was.default is None or now.default is None or _same(was.default, now.default) \
                    or not isinstance(was.default, cst.SimpleString):
                continue
            name = was.name.value
            if name in done:
                continue  # rebound by an earlier run (the header is still as written)
            rebind = cst.If(test=cst.Comparison(
                left=cst.Name(name), comparisons=[cst.ComparisonTarget(
                    operator=cst.Equal(), comparator=was.default)]),
                body=cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Assign(
                    targets=[cst.AssignTarget(target=cst.Name(name))],
                    value=now.default)])]))
            statements.append(rebind)
            defaults.append(was.default)
        if not statements:
            return [], []
        return [cst.If(test=self._call(), body=cst.IndentedBlock(body=statements))], defaults

    def _compound(self, old, new):
        """`new` with its header confined to the test or kept as written and its body
        confined, or None when it must be confined whole."""
        try:
            return self._compound_parts(old, new)
        except _WrapWhole:
            return None

    def _compound_parts(self, old, new):
        if isinstance(old, (cst.FunctionDef, cst.ClassDef)):
            header = ("decorators", "params", "returns", "asynchronous") \
                if isinstance(old, cst.FunctionDef) else ("decorators", "bases", "keywords")
            kept = {part: getattr(old, part) for part in header}
            rebound = self._rebound_defaults(old, new) if isinstance(old, cst.FunctionDef) \
                else ([], [])
            for part in header:
                written = getattr(old, part)
                if not _same(written, getattr(new, part)) and written is not None:
                    self.kept_headers.extend(
                        written if isinstance(written, (list, tuple)) else [written])
            body = self._suite(old.body, new.body)
            statements, defaults = rebound
            if statements:
                self.rebound.extend(defaults)
                if not isinstance(body, cst.IndentedBlock):
                    body = cst.IndentedBlock(body=_statements(body))
                first = 1 if body.body and is_docstring(body.body[0]) else 0
                body = body.with_changes(body=[*body.body[:first], *statements,
                                               *body.body[first:]])
            return new.with_changes(body=body, **kept)
        if isinstance(old, (cst.If, cst.While)):
            test = self._choice(old.test, new.test)
            orelse = self._orelse(old.orelse, new.orelse)
            return new.with_changes(test=test or new.test, body=self._suite(old.body, new.body),
                                    orelse=orelse)
        if isinstance(old, cst.For):
            if not _same(old.target, new.target):
                return None
            iterable = self._choice(old.iter, new.iter)
            return new.with_changes(iter=iterable or new.iter,
                                    body=self._suite(old.body, new.body),
                                    orelse=self._orelse(old.orelse, new.orelse))
        if isinstance(old, cst.With):
            if len(old.items) != len(new.items) or any(
                    not _same(o.asname, n.asname) for o, n in zip(old.items, new.items)):
                return None
            items = []
            for o, n in zip(old.items, new.items):
                chosen = self._choice(o.item, n.item)
                items.append(n if chosen is None else n.with_changes(item=chosen))
            return new.with_changes(items=items, body=self._suite(old.body, new.body))
        if isinstance(old, (cst.Try, cst.TryStar)):
            if len(old.handlers) != len(new.handlers) or any(
                    not _same(o.type, n.type) or not _same(o.name, n.name)
                    for o, n in zip(old.handlers, new.handlers)):
                return None
            handlers = [n.with_changes(body=self._suite(o.body, n.body))
                        for o, n in zip(old.handlers, new.handlers)]
            finalbody = None
            if (old.finalbody is None) != (new.finalbody is None):
                return None
            if old.finalbody is not None:
                finalbody = new.finalbody.with_changes(
                    body=self._suite(old.finalbody.body, new.finalbody.body))
            return new.with_changes(body=self._suite(old.body, new.body), handlers=handlers,
                                    orelse=self._orelse(old.orelse, new.orelse),
                                    finalbody=finalbody)
        return None


class _WrapWhole(Exception):
    """A header that cannot be confined in place: the statement is confined whole."""


def _same(a, b) -> bool:
    """The same code (a header part: parameters, decorators, an `as` name), compared as trees:
    some parts cannot be rendered alone (a parameter list's `*` needs its function)."""
    if a is None or b is None:
        return a is b
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            _same(x, y) for x, y in zip(a, b))
    return a is b or a.deep_equals(b)


def _without_leading(stmts: list) -> list:
    if not stmts:
        return stmts
    return [stmts[0].with_changes(leading_lines=()), *stmts[1:]]


def confine(original: cst.Module, ported: cst.Module, target: str,
            header_needs_import) -> tuple[cst.Module, Confinement]:
    """`ported` with every change confined to the runtime's test (module docstring above)."""
    confinement = Confinement(target, header_needs_import)
    body = confinement.block(list(original.body), list(ported.body))
    return ported.with_changes(body=body), confinement


# -- imports: inside the branches that use them ---------------------------------------------
class _Names(cst.CSTVisitor):
    """The names an expression or block uses (`x.xm` is not a use of `xm`)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        scan(node.value, self)
        return False


def names_used(node: cst.CSTNode) -> set[str]:
    finder = _Names()
    scan(node, finder)
    return finder.names


def top_level_imports(module: cst.Module) -> set[str]:
    """The names the module's top-level imports bind."""
    return set(import_bindings(module))


def _device_strings(node: cst.CSTNode) -> set[str]:
    found = set()
    for part in walk(node):
        if isinstance(part, cst.SimpleString) and len(part.value) <= 13:
            found.add(part.evaluated_value)
    return found


class BranchImports(cst.CSTTransformer):
    """Each confined branch of the port starts with the imports of the names it uses from
    `imports` (alias -> `import ...` statement code), and the imports run for their side
    effects (`side_effects`: the "xla" process-group backend's module) where it names the
    target's device."""

    def __init__(self, target: str, imports: dict[str, str], side_effects: list[str],
                 device: str) -> None:
        super().__init__()
        self.target = target
        self.imports = imports
        self.side_effects = side_effects
        self.device = device

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        if not isinstance(updated.test, cst.Call) or not is_test(updated.test, self.target):
            return updated
        present = {stmt for stmt in (_code(s).strip() for s in updated.body.body)}
        code = [self.imports[alias] for alias in sorted(names_used(updated.body) & set(self.imports))
                if self.imports[alias] not in present]
        if self.side_effects and self.device in _device_strings(updated.body):
            code += [f"import {module}" for module in self.side_effects
                     if f"import {module}" not in present]
        if not code:
            return updated
        lines = [cst.parse_statement(line + "\n") for line in code]
        return updated.with_changes(body=updated.body.with_changes(
            body=[*lines, *updated.body.body]))


# -- the contract, checked on every file ported in library mode ------------------------------
class _Written(ast.NodeTransformer):
    """The code as written, read back from a port: each confined choice's written side, the
    inserted helpers gone."""

    def __init__(self, target: str, inserted: set[str]) -> None:
        self.name = TESTS[target][0]
        self.inserted = inserted

    def _ours(self, test: ast.AST) -> bool | None:
        """True for `on_xla()`, False for `not on_xla()`, None for any other test."""
        negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        call = test.operand if negated else test
        if isinstance(call, ast.Call) and not call.args and isinstance(call.func, ast.Name) \
                and call.func.id == self.name:
            return not negated
        return None

    def visit_If(self, node: ast.If):
        ours = self._ours(node.test)
        if ours is None:
            return self.generic_visit(node)
        written = node.orelse if ours else node.body
        return [self.visit(stmt) for stmt in written]

    def visit_IfExp(self, node: ast.IfExp):
        if self._ours(node.test):
            return self.visit(node.orelse)
        return self.generic_visit(node)

    def visit_Module(self, node: ast.Module):
        node.body = [s for s in node.body if not (
            isinstance(s, (ast.FunctionDef, ast.ClassDef)) and s.name in self.inserted)]
        return self.generic_visit(node)


def _flat(node: ast.AST) -> ast.AST:
    """`node` with statement lists flattened (a visitor returned lists inside lists)."""
    for field, value in ast.iter_fields(node):
        if isinstance(value, list):
            flat = []
            for item in value:
                flat.extend(item if isinstance(item, list) else [item])
            setattr(node, field, [_flat(i) if isinstance(i, ast.AST) else i for i in flat])
        elif isinstance(value, ast.AST):
            _flat(value)
    return node


def broken_contract(source: str, new_source: str, target: str, helpers: set[str]) -> str | None:
    """Where the port of a library-mode file would run anything but the code as written when
    the TPU runtime is not imported: the first statement that differs, or None."""
    before = ast.parse(source)
    inserted = helpers - {s.name for s in before.body if isinstance(s, (ast.FunctionDef,
                                                                        ast.ClassDef))}
    after = _flat(_Written(target, inserted).visit(ast.parse(new_source)))
    had_torch = any(isinstance(s, ast.Import) and any(a.name == "torch" and a.asname is None
                                                      for a in s.names) for s in before.body)
    if not had_torch:  # what the port's own uses of torch need at the top
        after.body = [s for s in after.body if not (
            isinstance(s, ast.Import) and [(a.name, a.asname) for a in s.names] == [("torch", None)])]
    if ast.dump(after) == ast.dump(before):
        return None
    for old, new in zip(ast.walk(before), ast.walk(after)):
        if ast.dump(old) != ast.dump(new) and isinstance(old, ast.stmt):
            return f"line {old.lineno}"
    return "the module"
