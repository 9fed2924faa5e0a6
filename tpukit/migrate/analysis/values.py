"""What the values of one file are, by dataflow: the kinds of an expression (catalog.py: a
device, a CUDA device, a question to the host's CUDA, a DataLoader, an optimizer, a rank, a
backend name ...), from the APIs that make it and the assignments, attributes, parameters,
returns, argparse defaults and conditionals that carry it. Never from how a name is spelled:
renaming every variable, function and class of a file changes no answer.

One pass over the module (Values.__init__) records the scopes (module, functions, lambdas,
comprehensions, classes, with Python's rules: a class body's names are not seen by its
methods), every binding (imports, assignments and their unpacking, `for` targets, `with ...
as`, parameters, definitions), `self.x = ...` per class, argparse's `add_argument` defaults,
every call of the file's own functions (for their parameters) and how each name is used (as a
string, as a device). Kinds are computed on demand and memoized; a cycle (`x = x + 1`) reads as
nothing known.

Facts from the program's other modules (a parameter its callers elsewhere give a DataLoader)
come in as `param_kinds`: {function's qualified name in this module: {parameter: kinds}}.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.bindings import Imported, Recorder, Scope
from tpukit.migrate.analysis.kinds import ValueKinds
from tpukit.migrate.analysis.uses import ValueUses
from tpukit.migrate.nodes import scan, string_value


class Values(ValueKinds, ValueUses):
    """The kinds of a file's values. `param_kinds`: facts from the program's other modules."""

    def __init__(self, module: cst.Module,
                 param_kinds: dict[str, dict[str, frozenset[str]]] | None = None,
                 received=None, module_name: str = "", is_package: bool = False) -> None:
        self.module = module
        # What the program's other modules say (program.Received): parameter kinds from
        # their calls, what they do with the variables this file gives them, their classes.
        self.external_uses = received.external_uses if received is not None else {}
        self.imported_kinds = received.imported_kinds if received is not None else {}
        self.received_option_uses = received.option_uses if received is not None else {}
        # (module, code) of the other modules' `.module` reads of values nothing is known of
        self.module_reads_elsewhere = received.module_reads if received is not None else []
        self.module_name, self.is_package = module_name, is_package
        self.module_scope = Scope(None, None)
        self.scopes: dict[int, Scope] = {}
        self.scope_of: dict[int, Scope] = {}  # id(Name) -> the scope it is read or bound in
        self.self_class: dict[int, cst.ClassDef] = {}  # id(`self.x` Attribute) -> its class
        self.self_attrs: dict[int, dict[str, list]] = {}  # id(class) -> attr -> bindings
        self.method_of: dict[int, cst.ClassDef] = {}  # id(FunctionDef) -> its class
        self.functions_by_qualname: dict[str, cst.FunctionDef] = {}
        self.calls: list[tuple[cst.Call, Scope]] = []
        self.arguments: list[cst.Call] = []  # parser.add_argument(...) calls
        self.string_uses: set[int] = set()  # id(expr) used as a string
        self.device_uses: set[int] = set()  # id(expr) given where a device goes
        self.device_use_nodes: list[cst.BaseExpression] = []
        self.targets_of: dict[int, list[cst.BaseExpression]] = {}  # id(value) -> assigned to
        self.attribute_targets: set[str] = set()  # code of attributes assigned (`self.is_cuda`)
        self.attribute_name_nodes: list[cst.BaseExpression] = []  # getattr(x, NAME)
        self.keyword_nodes: dict[str, list[cst.BaseExpression]] = {}  # keyword -> values given
        # (expr, kind): an API used on a value says what it is (`x.param_groups`: an optimizer)
        self.used_as: list[tuple[cst.BaseExpression, str]] = []
        self._use_kinds: dict | None = None
        self._names_of: dict = {}
        self._param_symbol: dict[int, tuple] = {}  # id(Param) -> its symbol
        self.param_kinds = dict(param_kinds or {})
        if received is not None:
            for qualname, kinds in received.param_kinds.items():
                self.param_kinds.setdefault(qualname, {}).update(kinds)
        self._memo: dict[int, frozenset[str]] = {}
        self._busy: set[int] = set()
        self._param_args: dict[int, list[cst.BaseExpression]] | None = None
        self._spawned: dict[int, bool] | None = None
        self._call_index: tuple[dict, dict] | None = None  # uses.ValueUses._calls_of
        self._argparse: dict[str, list[cst.BaseExpression]] | None = None
        self._numbers: set[str] | None = None
        self._string_symbols: set | None = None
        self._device_symbols: set | None = None
        scan(module, Recorder(self))
        # What uses say is known before any kind is asked: a kind computed halfway through
        # collecting them would be remembered without them.
        self._collect_uses()

    # -- names ------------------------------------------------------------------------
    def unresolved_module_reads(self) -> list[str]:
        """The code of each `x.module` read where nothing is known of `x` (pix2pix's
        `getattr(self, "net" + name).module`): a model DataParallel wrapped in another
        function or module may reach it."""
        finder = _ModuleReads(self)
        scan(self.module, finder)
        return finder.reads

    def bindings(self, name: cst.Name) -> list:
        """What `name` (a Name node of this module) may hold: its scope's bindings, as Python
        looks it up (enclosing functions, then the module; a class body is skipped)."""
        scope = self.scope_of.get(id(name))
        if scope is None:
            return []
        return self._lookup(scope, name.value)

    def _lookup(self, scope: Scope, name: str) -> list:
        first = True
        while scope is not None:
            if name in scope.declared_global and scope is not self.module_scope:
                scope = self.module_scope  # (`global x` at the top level changes nothing)
                continue
            if (first or not scope.is_class) and name in scope.names:
                return scope.names[name]
            first = False
            scope = scope.parent
        return []

    def symbol(self, expr: cst.BaseExpression):
        """What identifies the variable `expr` reads (a name's scope and name, a `self`
        attribute's class and name, an argparse option), or None."""
        if isinstance(expr, cst.Name) and expr.value in ("None", "True", "False"):
            return None  # a constant, no variable: `default=None` carries nothing back
        if isinstance(expr, cst.Name):
            scope = self.scope_of.get(id(expr))
            while scope is not None:
                if expr.value in scope.declared_global:
                    scope = self.module_scope
                    break
                if expr.value in scope.names and not (scope.is_class and scope is not
                                                      self.scope_of.get(id(expr))):
                    break
                scope = scope.parent
            # a name bound nowhere in the file is a global another module (or a notebook's
            # earlier cell) set: one variable wherever it is read
            return ("name", id(scope if scope is not None else self.module_scope), expr.value)
        if isinstance(expr, cst.Attribute):
            cls = self.self_class.get(id(expr))
            if cls is not None:
                return ("attr", id(cls), expr.attr.value)
            if K.ARGS in self.kinds(expr.value):
                return ("arg", expr.attr.value)
        option = self._getattr_option(expr)
        if option is not None:
            return ("arg", option)
        if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 \
                and isinstance(expr.slice[0].slice, cst.Index) \
                and isinstance(expr.slice[0].slice.value, cst.SimpleString):
            # `self.optimizer["generator"]`: one entry of a dict, by its constant key
            # (ParallelWaveGAN's trainer keeps its optimizers so, made by a getattr of a name
            # read from its config: what `.step()` beside `.zero_grad()` says is all there is)
            base = self.symbol(expr.value)
            key = expr.slice[0].slice.value.evaluated_value
            if base is not None and isinstance(key, str):
                return ("item", base, key)
        return None

    def _getattr_option(self, expr: cst.BaseExpression) -> str | None:
        """`getattr(args, "device", "cuda")` on an argparse namespace: the option it reads."""
        if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name)
                and expr.func.value == "getattr" and not self.bindings(expr.func)
                and len(expr.args) >= 2 and all(a.keyword is None for a in expr.args[:2])):
            return None
        name = string_value(expr.args[1].value) if isinstance(
            expr.args[1].value, cst.SimpleString) else None
        if name is None or K.ARGS not in self.kinds(expr.args[0].value):
            return None
        return name

    def qualified(self, expr: cst.BaseExpression | None) -> str | None:
        """The qualified name a Name/Attribute chain stands for through the file's imports,
        in its own scope (a local or parameter that shadows an import is not it)."""
        if isinstance(expr, cst.Name):
            found = self.bindings(expr)
            imported = [b for b in found if isinstance(b, Imported)]
            if imported and len(imported) == len(found):
                return imported[-1].qualified
            return None
        if isinstance(expr, cst.Attribute):
            base = self.qualified(expr.value)
            return f"{base}.{expr.attr.value}" if base else None
        return None


class _ModuleReads(cst.CSTVisitor):
    def __init__(self, values: Values) -> None:
        self.values = values
        self.reads: list[str] = []

    def visit_Import(self, node) -> bool:
        return False  # `import a.module` names a module, reads nothing

    def visit_ImportFrom(self, node) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        inner = node.value
        if isinstance(inner, cst.Attribute) and inner.attr.value == "module":
            return  # `m.module.module`: the read of `m.module` is the one to say
        if node.attr.value == "module" and not self.values.kinds(node.value):
            self.reads.append(self.values.module.code_for_node(node))
