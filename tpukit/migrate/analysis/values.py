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

from dataclasses import dataclass, field

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.nodes import dotted, is_cpu_device, is_cuda_device_string, string_value

NOTHING: frozenset[str] = frozenset()


@dataclass(eq=False)
class Scope:
    node: cst.CSTNode | None  # None: the module
    parent: Scope | None
    is_class: bool = False
    names: dict[str, list] = field(default_factory=dict)  # name -> its bindings
    declared_global: set[str] = field(default_factory=set)
    declared_nonlocal: set[str] = field(default_factory=set)
    qualname: str = ""  # `train`, `Trainer.fit` (functions and classes of the module)

    def bind(self, name: str, binding) -> None:
        self.names.setdefault(name, []).append(binding)


# Bindings: what a name was given.
@dataclass(frozen=True, eq=False)
class Imported:
    qualified: str


@dataclass(frozen=True, eq=False)
class Assigned:
    value: cst.BaseExpression
    path: tuple[int, ...] = ()  # the element of `value` an unpacking takes: (1, 0)


@dataclass(frozen=True, eq=False)
class Iterated:
    """A `for` target (or comprehension's): an item of `iterable`, at `path` of the item."""
    iterable: cst.BaseExpression
    path: tuple[int, ...] = ()


@dataclass(frozen=True, eq=False)
class Parameter:
    function: cst.FunctionDef | cst.Lambda
    param: cst.Param
    index: int  # among the positional parameters (-1: keyword-only or *args/**kwargs)
    scope: Scope  # the scope the function is defined in


@dataclass(frozen=True, eq=False)
class Defined:
    node: cst.FunctionDef | cst.ClassDef
    scope: Scope  # the function's or class's own scope


@dataclass(frozen=True, eq=False)
class Entered:
    """`with x as name`: what entering `x` gives (a file, a context); nothing known."""
    value: cst.BaseExpression


def _positional(params: cst.Parameters) -> list[cst.Param]:
    return [*params.posonly_params, *params.params]


class _Recorder(cst.CSTVisitor):
    """The one pass: scopes, bindings, attributes set on self, calls, argparse defaults and
    the uses of names."""

    def __init__(self, values: Values) -> None:
        self.v = values
        self.stack: list[Scope] = [values.module_scope]
        self.classes: list[tuple[cst.ClassDef, Scope]] = []
        self.functions: list[cst.FunctionDef | cst.Lambda] = []

    @property
    def scope(self) -> Scope:
        return self.stack[-1]

    def _binding_scope(self, name: str) -> Scope:
        scope = self.scope
        if name in scope.declared_global:
            return self.v.module_scope
        if name in scope.declared_nonlocal:
            outer = scope.parent
            while outer is not None and (outer.is_class or name not in outer.names):
                outer = outer.parent
            return outer or self.v.module_scope
        return scope

    def _bind_target(self, target: cst.BaseExpression, make, path: tuple[int, ...] = ()) -> None:
        if isinstance(target, cst.Name):
            self._binding_scope(target.value).bind(target.value, make(path))
        elif isinstance(target, (cst.Tuple, cst.List)):
            for i, element in enumerate(target.elements):
                value = element.value
                if isinstance(element, cst.StarredElement):
                    continue  # a starred target takes a list of the rest: nothing known
                self._bind_target(value, make, (*path, i))
        elif isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) \
                and self._is_self(target.value):
            cls = self.classes[-1][0]
            self.v.self_attrs.setdefault(id(cls), {}).setdefault(
                target.attr.value, []).append(make(path))

    def _is_self(self, name: cst.Name) -> bool:
        """`name` is the first parameter of a method of the innermost class."""
        if not self.classes or not self.functions:
            return False
        method = self.v.method_of.get(id(self.functions[-1]))
        if method is None or method is not self.classes[-1][0]:
            return False
        params = _positional(self.functions[-1].params)
        return bool(params) and params[0].name.value == name.value and not any(
            isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod"
            for d in getattr(self.functions[-1], "decorators", ()))

    # -- scopes -----------------------------------------------------------------------
    def _push(self, node, is_class=False, name: str | None = None) -> Scope:
        parent = self.scope
        prefix = parent.qualname + "." if parent.qualname else ""
        scope = Scope(node, parent, is_class, qualname=f"{prefix}{name}" if name else "")
        self.v.scopes[id(node)] = scope
        self.stack.append(scope)
        return scope

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        for decorator in node.decorators:
            decorator.visit(self)
        for base in node.bases:
            base.visit(self)
        for keyword in node.keywords:
            keyword.visit(self)
        outer = self._binding_scope(node.name.value)
        scope = self._push(node, is_class=True, name=node.name.value)
        outer.bind(node.name.value, Defined(node, scope))
        self.classes.append((node, scope))
        node.body.visit(self)
        self.classes.pop()
        self.stack.pop()
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        for decorator in node.decorators:
            decorator.visit(self)
        if node.returns is not None:
            node.returns.visit(self)
        self._visit_defaults(node.params)
        outer = self.scope
        if outer.is_class and self.classes and self.classes[-1][1] is outer:
            self.v.method_of[id(node)] = self.classes[-1][0]
        binding_scope = self._binding_scope(node.name.value)
        scope = self._push(node, name=node.name.value)
        binding_scope.bind(node.name.value, Defined(node, scope))
        self.v.functions_by_qualname[scope.qualname] = node
        return self._walk_function(node, outer)

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._visit_defaults(node.params)
        outer = self.scope
        self._push(node)
        return self._walk_function(node, outer)

    def _walk_function(self, node: cst.FunctionDef | cst.Lambda, outer) -> bool:
        """Bind the parameters in the scope just pushed, walk the body, pop the scope."""
        self._bind_params(node, outer)
        self.functions.append(node)
        node.body.visit(self)
        self.functions.pop()
        self.stack.pop()
        return False

    def _visit_defaults(self, params: cst.Parameters) -> None:
        for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
            if param.default is not None:
                param.default.visit(self)
            if param.annotation is not None:
                param.annotation.visit(self)

    def _bind_params(self, node, outer: Scope) -> None:
        params = node.params
        for i, param in enumerate(_positional(params)):
            self.scope.bind(param.name.value, Parameter(node, param, i, outer))
        for param in params.kwonly_params:
            self.scope.bind(param.name.value, Parameter(node, param, -1, outer))
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                self.scope.bind(star.name.value, Parameter(node, star, -1, outer))
        for param in [*_positional(params), *params.kwonly_params]:
            self.v._param_symbol[id(param)] = ("name", id(self.scope), param.name.value)
            self.v.scope_of[id(param.name)] = self.scope

    def _comprehension(self, node) -> bool:
        # The first iterable is evaluated outside; the rest inside the comprehension's scope.
        node.for_in.iter.visit(self)
        self._push(node)
        for_in = node.for_in
        first = True
        while for_in is not None:
            if not first:
                for_in.iter.visit(self)
            first = False
            self._bind_target(for_in.target, lambda path, it=for_in.iter: Iterated(it, path))
            for_in.target.visit(self)
            for condition in for_in.ifs:
                condition.visit(self)
            for_in = for_in.inner_for_in
        for part in ("elt", "key", "value"):
            child = getattr(node, part, None)
            if child is not None:
                child.visit(self)
        self.stack.pop()
        return False

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    # -- bindings ---------------------------------------------------------------------
    def visit_Global(self, node: cst.Global) -> None:
        self.scope.declared_global.update(item.name.value for item in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.scope.declared_nonlocal.update(item.name.value for item in node.names)

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            full = dotted(alias.name) or ""
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self._binding_scope(alias.asname.name.value).bind(
                    alias.asname.name.value, Imported(full))
            else:
                root = full.split(".")[0]
                self._binding_scope(root).bind(root, Imported(root))
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if isinstance(node.names, cst.ImportStar):
            return False
        module = dotted(node.module) if node.module is not None else ""
        level = len(node.relative)
        for alias in node.names:
            name = dotted(alias.name) or ""
            bound = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                bound = alias.asname.name.value
            qualified = f"{module}.{name}" if module else name
            # a relative import names the program's own module: its dots kept (program.py)
            self._binding_scope(bound).bind(bound, Imported("." * level + qualified))
        return False

    def visit_Assign(self, node: cst.Assign) -> None:
        self.v.targets_of[id(node.value)] = [t.target for t in node.targets]
        for target in node.targets:
            self._bind_target(target.target, lambda path, v=node.value: Assigned(v, path))
            if isinstance(target.target, cst.Attribute):
                self.v.attribute_targets.add(self.v.module.code_for_node(target.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if isinstance(node.target, cst.Attribute):
            self.v.attribute_targets.add(self.v.module.code_for_node(node.target))
        if node.value is not None:
            self.v.targets_of[id(node.value)] = [node.target]
            self._bind_target(node.target, lambda path, v=node.value: Assigned(v, path))
        elif isinstance(node.target, cst.Name):
            self._binding_scope(node.target.value).names.setdefault(node.target.value, [])

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Name):
            self._binding_scope(node.target.value).bind(node.target.value, Assigned(node.value))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        scope = self.scope
        while scope.node is not None and isinstance(
                scope.node, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
            scope = scope.parent
        if isinstance(node.target, cst.Name):
            scope.bind(node.target.value, Assigned(node.value))

    def visit_For(self, node: cst.For) -> None:
        self._bind_target(node.target, lambda path, it=node.iter: Iterated(it, path))

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind_target(node.asname.name, lambda path, v=node.item: Entered(v))

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None and isinstance(node.name.name, cst.Name):
            self.scope.bind(node.name.name.value, Entered(node.type or node))

    # -- uses -------------------------------------------------------------------------
    def visit_Name(self, node: cst.Name) -> None:
        self.v.scope_of[id(node)] = self.scope

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if isinstance(node.value, cst.Name) and self._is_self(node.value):
            self.v.self_class[id(node)] = self.classes[-1][0]
        said = K.ATTRIBUTE_SAYS.get(node.attr.value)
        if said is not None:
            self.v.used_as.append((node.value, said))

    def visit_Call(self, node: cst.Call) -> None:
        self.v.calls.append((node, self.scope))
        if isinstance(node.func, cst.Name) and node.func.value in ("getattr", "hasattr", "setattr") \
                and len(node.args) > 1:
            # `getattr(torch, device)`: what `device` holds names an attribute (`torch.cuda`)
            self.v.attribute_name_nodes.append(node.args[1].value)
        for arg in node.args:
            if arg.keyword is not None:
                self.v.keyword_nodes.setdefault(arg.keyword.value, []).append(arg.value)
                if arg.keyword.value in K.DEVICE_INDEX_KEYWORDS:
                    # `device_ids=[local_rank]`, `output_device=local_rank`: a CUDA index
                    given = arg.value
                    elements = [e.value for e in given.elements] if isinstance(
                        given, (cst.List, cst.Tuple)) else [given]
                    self.v.used_as.extend((e, K.RANK) for e in elements)
            if arg.keyword is not None and arg.keyword.value in K.DEVICE_KEYWORDS:
                self.v.device_uses.add(id(arg.value))
                self.v.device_use_nodes.append(arg.value)
        if isinstance(node.func, cst.Attribute):
            method = node.func.attr.value
            receiver = node.func.value
            said = K.METHOD_SAYS.get(method)
            if said is not None:
                self.v.used_as.append((receiver, said))
            if method == "add_argument":
                self.v.arguments.append(node)
            elif method in K.STR_METHODS:
                self.v.string_uses.add(id(node.func.value))
            elif method in ("to", "cuda") and node.args and node.args[0].keyword is None and (
                    method == "to" or _torch_cuda_call(node)):
                self.v.device_uses.add(id(node.args[0].value))
                self.v.device_use_nodes.append(node.args[0].value)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        # `dict(fused=True) if use_fused else dict()`: the test decides a keyword argument
        keywords = {n.keyword.value for branch in (node.body, node.orelse)
                    for n in _walk(branch) if isinstance(n, cst.Arg) and n.keyword is not None}
        for keyword in keywords:
            for part in _walk(node.test):
                if isinstance(part, (cst.Name, cst.Attribute)):
                    self.v.used_as.append((part, "decides:" + keyword))

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(c.comparator for c in node.comparisons)]
        if any(string_value(o) is not None for o in operands):
            # (`str(device) == "cuda"` says nothing of `device`: a string or an object)
            for operand in operands:
                if string_value(operand) is None:
                    self.v.string_uses.add(id(operand))
        for c in node.comparisons:
            if isinstance(c.operator, (cst.In, cst.NotIn)) and isinstance(
                    c.comparator, (cst.Tuple, cst.List, cst.Set)) and any(
                    string_value(e.value) is not None for e in c.comparator.elements):
                self.v.string_uses.add(id(node.left))

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if isinstance(node.operator, (cst.Multiply, cst.Divide, cst.FloorDivide)):
            # a count that multiplies or divides something scales it (a batch size per GPU),
            # also through `max(1, n_gpu)`
            for side in (node.left, node.right):
                self.v.used_as.append((side, K.SCALE))
                if isinstance(side, cst.Call) and dotted(side.func) in ("max", "min", "int"):
                    self.v.used_as.extend((a.value, K.SCALE) for a in side.args)
        if isinstance(node.operator, cst.Add):
            for side, other in ((node.left, node.right), (node.right, node.left)):
                if string_value(other) is not None:
                    self.v.string_uses.add(id(side))


class Values:
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
        self._argparse: dict[str, list[cst.BaseExpression]] | None = None
        self._numbers: set[str] | None = None
        self._string_symbols: set | None = None
        self._device_symbols: set | None = None
        module.visit(_Recorder(self))
        # What uses say is known before any kind is asked: a kind computed halfway through
        # collecting them would be remembered without them.
        self._collect_uses()

    # -- names ------------------------------------------------------------------------
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
            if name in scope.declared_global:
                scope = self.module_scope
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

    # -- kinds ------------------------------------------------------------------------
    def kinds(self, expr: cst.BaseExpression | None) -> frozenset[str]:
        if expr is None:
            return NOTHING
        key = id(expr)
        known = self._memo.get(key)
        if known is not None:
            return known
        if key in self._busy:
            return NOTHING  # a cycle: nothing more is known along it
        self._busy.add(key)
        try:
            found = self._kinds(expr)
        finally:
            self._busy.discard(key)
        self._memo[key] = found
        return found

    def is_kind(self, expr, kind: str) -> bool:
        return kind in self.kinds(expr)

    def _kinds(self, expr: cst.BaseExpression) -> frozenset[str]:
        if isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.BinaryOperation,
                             cst.ConcatenatedString)) and is_cuda_device_string(expr):
            return frozenset({K.DEVICE, K.CUDA, K.STRING})
        if isinstance(expr, cst.SimpleString):
            value = string_value(expr)
            if value is not None and is_cpu_device(expr):
                return frozenset({K.DEVICE, K.STRING})
            return frozenset({K.STRING})
        if isinstance(expr, (cst.FormattedString, cst.ConcatenatedString)):
            return frozenset({K.STRING})
        if isinstance(expr, (cst.Integer, cst.Float)):
            return frozenset({K.NUMBER})
        if isinstance(expr, cst.Name):
            return self._name_kinds(expr)
        if isinstance(expr, cst.Attribute):
            return self._attribute_kinds(expr)
        if isinstance(expr, cst.Call):
            return self._call_kinds(expr)
        if isinstance(expr, cst.IfExp):
            return self.kinds(expr.body) | self.kinds(expr.orelse)
        if isinstance(expr, cst.BooleanOperation):
            return self.kinds(expr.left) | self.kinds(expr.right)
        if isinstance(expr, cst.Comparison):
            return self._comparison_kinds(expr)
        if isinstance(expr, cst.UnaryOperation):
            inner = self.kinds(expr.expression)
            return inner & {K.CUDA_QUESTION} if isinstance(expr.operator, cst.Not) else inner
        if isinstance(expr, cst.BinaryOperation) and isinstance(
                expr.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
            both = self.kinds(expr.left) | self.kinds(expr.right)
            return both & {K.TENSOR, K.BOOL}  # `mask & valid`
        if isinstance(expr, cst.Subscript):
            return self._subscript_kinds(expr)
        if isinstance(expr, (cst.Tuple, cst.List)):
            found = frozenset({K.CONTAINER})
            for element in expr.elements:
                found |= self.kinds(element.value) & {K.TENSOR, K.BATCH}
            return found
        if isinstance(expr, (cst.Dict, cst.DictComp, cst.ListComp)):
            return frozenset({K.CONTAINER})
        if isinstance(expr, cst.BinaryOperation):
            left, right = self.kinds(expr.left), self.kinds(expr.right)
            if K.TENSOR in left or K.TENSOR in right:
                return frozenset({K.TENSOR})
            return (left | right) & {K.NUMBER, K.STRING, K.GPU_COUNT, K.WORLD, K.RANK}
        return NOTHING

    def _comparison_kinds(self, expr: cst.Comparison) -> frozenset[str]:
        operands = [expr.left, *(c.comparator for c in expr.comparisons)]
        if any(is_cuda_device_string(o) for o in operands) or any(
                isinstance(o, (cst.Tuple, cst.List, cst.Set)) and any(
                    is_cuda_device_string(e.value) for e in o.elements) for o in operands):
            return frozenset({K.CUDA_QUESTION})
        if any(K.GPU_COUNT in self.kinds(o) for o in operands):
            return frozenset({K.CUDA_QUESTION})
        if any(K.TENSOR in self.kinds(o) for o in operands) and not any(
                isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn))
                for c in expr.comparisons):
            return frozenset({K.TENSOR, K.BOOL})  # an elementwise comparison: a mask
        return NOTHING

    def _name_kinds(self, name: cst.Name) -> frozenset[str]:
        found = NOTHING
        for binding in self.bindings(name):
            found |= self._binding_kinds(binding)
        return found | self._said(name, found)

    def _said(self, expr: cst.BaseExpression, found: frozenset[str]) -> frozenset[str]:
        """What the APIs used on the variable `expr` reads say it is, where its sources said
        nothing of that sort (a sampler's `.sampler` is no loader's)."""
        if self._use_kinds is None:
            self._collect_uses()
        symbol = self.symbol(expr)
        said = self._use_kinds.get(symbol, ()) if symbol is not None else ()
        return _compatible(said, found)

    def _binding_kinds(self, binding) -> frozenset[str]:
        if isinstance(binding, Imported):
            return K.VALUES.get(binding.qualified, NOTHING)
        if isinstance(binding, Assigned):
            return self._element(binding.value, binding.path)
        if isinstance(binding, Iterated):
            return self._iterated(binding.iterable, binding.path)
        if isinstance(binding, Parameter):
            return self._parameter_kinds(binding)
        return NOTHING

    def _element(self, value: cst.BaseExpression, path: tuple[int, ...]) -> frozenset[str]:
        """The kinds of `value`'s element at `path` (an unpacking's), `value`'s own for ()."""
        for i, index in enumerate(path):
            if isinstance(value, (cst.Tuple, cst.List)) and index < len(value.elements) \
                    and not any(isinstance(e, cst.StarredElement) for e in value.elements):
                value = value.elements[index].value
                continue
            returned = self._returned_elements(value, index)
            if returned is not None:
                found = NOTHING
                for element in returned:
                    found |= self._element(element, path[i + 1:])
                return found
            kinds = self.kinds(value)
            if K.PREPARED in kinds and isinstance(value, cst.Call) and len(path) - i == 1 \
                    and index < len(value.args):
                # `model, opt, loader = accelerator.prepare(model, opt, loader)`
                return frozenset({K.PREPARED}) | (
                    self.kinds(value.args[index].value) & K.PREPARABLE)
            if K.BATCH in kinds or K.TENSOR in kinds:
                return frozenset({K.TENSOR}) if kinds & {K.BATCH, K.TENSOR} else NOTHING
            # `model, opt, loader = accelerator.prepare(model, opt, loader)`: what a call gives
            # back in the order it was given
            if isinstance(value, cst.Call) and len(path) - i == 1 and index < len(value.args) \
                    and all(a.keyword is None and not a.star for a in value.args) \
                    and len(value.args) > 1 and not self.kinds(value):
                return self.kinds(value.args[index].value) & {
                    K.LOADER, K.MODULE, K.OPTIMIZER, K.SCHEDULER}
            return NOTHING
        return self.kinds(value)

    def _iterated(self, iterable: cst.BaseExpression, path: tuple[int, ...]) -> frozenset[str]:
        """What a `for` over `iterable` binds at `path` of each item."""
        if isinstance(iterable, cst.Call):
            callee = self.qualified(iterable.func) or dotted(iterable.func)
            if callee == "enumerate" and iterable.args:
                if not path:
                    return NOTHING
                if path[0] == 0:
                    return frozenset({K.NUMBER})
                return self._iterated(iterable.args[0].value, path[1:])
            if callee == "zip":
                if not path:
                    return NOTHING
                if path[0] < len(iterable.args):
                    return self._iterated(iterable.args[path[0]].value, path[1:])
                return NOTHING
            if callee in K.ITER_WRAPPERS and iterable.args:
                return self._iterated(iterable.args[0].value, path)
            if callee == "range":
                return frozenset({K.NUMBER})
        kinds = self.kinds(iterable)
        if K.LOADER in kinds:
            return frozenset({K.BATCH}) if not path else frozenset({K.TENSOR})
        if isinstance(iterable, (cst.Tuple, cst.List)) and not path:
            found = NOTHING
            for element in iterable.elements:
                found |= self.kinds(element.value)
            return found & {K.DEVICE, K.CUDA, K.LOADER, K.MODULE, K.OPTIMIZER}
        return NOTHING

    def _parameter_kinds(self, binding: Parameter) -> frozenset[str]:
        param = binding.param
        found = NOTHING
        if param.default is not None and not _is_none(param.default):
            found |= self.kinds(param.default)
        if param.annotation is not None:
            annotated = self.qualified(param.annotation.annotation)
            if annotated == "torch.device":
                found |= {K.DEVICE}
            elif annotated in K.BASES:
                found |= {K.BASES[annotated]}
        for arg in self.param_args().get(id(param), ()):
            found |= self.kinds(arg)
        if self.spawned_rank(binding):
            found |= {K.RANK}
        cls = self.method_of.get(id(binding.function))
        if cls is not None and binding.index == 0 and not _static(binding.function):
            found |= self._called(Defined(cls, self.scopes.get(id(cls))))  # `self` of a Module
        scope = self.scopes.get(id(binding.function))
        if scope is not None and scope.qualname in self.param_kinds:
            found |= self.param_kinds[scope.qualname].get(param.name.value, NOTHING)
        return found

    def _collect_uses(self) -> None:
        """Symbol -> the kinds the places it goes say: an API only one kind has (`.param_groups`),
        a position that takes one kind (a scheduler's or `xm.optimizer_step`'s optimizer,
        `scaler.step(opt)`, `init_process_group(backend)`), `.step()` beside `.zero_grad()`."""
        self._use_kinds = {}
        uses = list(self.used_as)
        methods: dict = {}
        for call, _ in self.calls:
            qualified = self.qualified(call.func)
            first = call.args[0].value if call.args and call.args[0].keyword is None else None
            if qualified is not None:
                if first is not None and (qualified.startswith("torch.optim.lr_scheduler.")
                                          or qualified in K.OPTIMIZER_TAKERS):
                    uses.append((first, K.OPTIMIZER))
                if qualified in K.BACKEND_CALLS:
                    keyword, index = K.BACKEND_CALLS[qualified]
                    given = next((a.value for a in call.args if a.keyword is not None
                                  and a.keyword.value == keyword), None)
                    positional = [a for a in call.args if a.keyword is None]
                    if given is None and len(positional) > index:
                        given = positional[index].value
                    if given is not None:
                        uses.append((given, K.BACKEND))
                if qualified in K.DEVICE_CALLS and first is not None:
                    uses.append((first, K.DEVICE))
                if qualified in K.AUTOCAST_CALLS or (
                        qualified in K.BINDERS and first is not None
                        and self.qualified(first) in K.AUTOCAST_CALLS):
                    dtype = next((a.value for a in call.args if a.keyword is not None
                                  and a.keyword.value == "dtype"), None)
                    if dtype is not None:
                        uses.append((dtype, K.AUTOCAST_DTYPE))
                if qualified in K.SPAWNS:
                    positional = [a for a in call.args if a.keyword is None]
                    if len(positional) > 2:
                        uses.append((positional[2].value, K.PROCESS_COUNT))
            elif isinstance(call.func, cst.Attribute):
                method = call.func.attr.value
                if method in ("step", "zero_grad"):
                    symbol = self.symbol(call.func.value)
                    if symbol is not None:
                        methods.setdefault(symbol, set()).add(method)
                if method == "step" and first is not None:
                    uses.append((first, "_scaler_step", call.func.value))
        uses += [(node, K.DEVICE) for node in self.device_use_nodes]
        if self.external_uses:
            by_qualname = {s.qualname: s for s in [*self.scopes.values(), self.module_scope]
                           if s.node is None or isinstance(s.node, (cst.FunctionDef, cst.ClassDef))}
            for (qualname, name), kinds in self.external_uses.items():
                scope = by_qualname.get(qualname)
                if scope is not None:
                    self._use_kinds.setdefault(("name", id(scope), name), set()).update(kinds)
        for dest, kinds in self.received_option_uses.items():
            self._use_kinds.setdefault(("arg", dest), set()).update(kinds)
        uses += [(node, K.PROCESS_COUNT) for keyword in K.PROCESS_COUNT_KEYWORDS
                 for node in self.keyword_nodes.get(keyword, ())]
        for use in uses:
            node, kind = use[0], use[1]
            if kind == "_scaler_step":
                if K.SCALER not in self.kinds(use[2]):
                    continue
                kind = K.OPTIMIZER
            symbol = self.symbol(node)
            if symbol is not None:
                self._use_kinds.setdefault(symbol, set()).add(kind)
        for symbol, called in methods.items():
            if called == {"step", "zero_grad"}:
                self._use_kinds.setdefault(symbol, set()).add(K.OPTIMIZER)
        self._propagate_uses()
        self._memo.clear()  # kinds computed on the way knew no uses yet

    def _propagate_uses(self) -> None:
        """What a variable's uses say flows back to where its value came from: `x = y` makes
        `y` what `x` is used as, a call gives its arguments what the parameters are used as,
        and an argparse option's default what the option is used as (`backend = "nccl"`, the
        default of `--backend`, given to init_process_group as `args.backend`)."""
        edges: list[tuple[object, object]] = []  # (used symbol, the symbol it came from)
        for scope in [self.module_scope, *self.scopes.values()]:
            for name, bindings in scope.names.items():
                for binding in bindings:
                    if isinstance(binding, Assigned) and not binding.path:
                        source = self.symbol(binding.value) if isinstance(
                            binding.value, (cst.Name, cst.Attribute, cst.Call)) else None
                        if source is not None:
                            edges.append((("name", id(scope), name), source))
        for cls_id, attrs in self.self_attrs.items():
            for attr, bindings in attrs.items():
                for binding in bindings:
                    if isinstance(binding, Assigned) and not binding.path and isinstance(
                            binding.value, (cst.Name, cst.Attribute)):
                        source = self.symbol(binding.value)
                        if source is not None:
                            edges.append((("attr", cls_id, attr), source))
        for param_id, args in self.param_args().items():
            param_symbol = self._param_symbol.get(param_id)
            for arg in args:
                source = self.symbol(arg) if isinstance(
                    arg, (cst.Name, cst.Attribute, cst.Call)) else None
                if param_symbol is not None and source is not None:
                    edges.append((param_symbol, source))
        for dest, defaults in self.argparse_defaults().items():
            for default in defaults:
                source = self.symbol(default) if isinstance(
                    default, (cst.Name, cst.Attribute)) else None
                if source is not None:
                    edges.append((("arg", dest), source))
        flowing = {K.BACKEND, K.DEVICE, K.OPTIMIZER, K.LOADER, K.SCALE, K.PROCESS_COUNT,
                   K.STRING_USE, K.AUTOCAST_DTYPE}
        for _ in range(8):  # chains are short; a bound keeps cycles finite
            changed = False
            for used, source in edges:
                carried = self._use_kinds.get(used, set()) & flowing
                if carried - self._use_kinds.get(source, set()):
                    self._use_kinds.setdefault(source, set()).update(carried)
                    changed = True
            if not changed:
                break

    def _attribute_kinds(self, expr: cst.Attribute) -> frozenset[str]:
        qualified = self.qualified(expr)
        if qualified is not None:
            return K.VALUES.get(qualified, NOTHING)
        attr = expr.attr.value
        cls = self.self_class.get(id(expr))
        if cls is not None:
            found = NOTHING
            for binding in self.self_attrs.get(id(cls), {}).get(attr, ()):
                found |= self._binding_kinds(binding)
            for base_attr in self._class_level(cls, attr):
                found |= self.kinds(base_attr)
            found |= self._said(expr, found)
            if found:
                return found
        base = self.kinds(expr.value)
        if K.ARGS in base:
            return self._option_kinds(attr)
        if attr == "device":
            return frozenset({K.DEVICE})
        if attr == "type" and K.DEVICE in base:
            return frozenset({K.DEVICE_TYPE, K.STRING})
        if attr == "is_cuda":
            return frozenset({K.CUDA_QUESTION})
        if attr in ("module", "_orig_mod") and K.MODULE in base:
            return frozenset({K.MODULE})
        if attr == "sampler" and K.LOADER in base:
            return frozenset({K.SAMPLER})
        if attr == "dataset" and K.LOADER in base:
            return NOTHING
        if attr in ("T", "data", "grad", "mT") and K.TENSOR in base:
            return frozenset({K.TENSOR})
        return NOTHING

    def _class_level(self, cls: cst.ClassDef, attr: str) -> list[cst.BaseExpression]:
        """`attr = value` in the class body itself (a default the instance reads as self.attr)."""
        scope = self.scopes.get(id(cls))
        if scope is None:
            return []
        return [b.value for b in scope.names.get(attr, ()) if isinstance(b, Assigned) and not b.path]

    def _call_kinds(self, call: cst.Call) -> frozenset[str]:
        func = call.func
        qualified = self.qualified(func)
        if qualified is not None:
            if qualified in ("os.environ.get", "os.getenv") and call.args:
                return self._environment(call.args[0].value)
            if qualified in K.SAME_KIND_CALLS and call.args:
                return self.kinds(call.args[0].value)
            if qualified == "torch.device" and call.args:
                # torch.device("cuda" if ... else "cpu"): a device, CUDA's where its type is
                return frozenset({K.DEVICE}) | (self.kinds(call.args[0].value) & {K.CUDA})
            known = K.call_kinds(qualified)
            if known is not None:
                return known
            if self.imported_kinds:
                absolute = absolute_import(qualified, self.module_name, self.is_package)
                if absolute in self.imported_kinds:
                    return self.imported_kinds[absolute]  # a class of another module
        option = self._getattr_option(call)
        if option is not None:
            found = self._option_kinds(option)
            if len(call.args) > 2:
                found |= self.kinds(call.args[2].value)
            return found | self._said(call, found)
        if isinstance(func, cst.Name):
            if func.value in ("int", "float") and call.args and not self.bindings(func):
                return self.kinds(call.args[0].value) & {K.RANK, K.WORLD, K.GPU_COUNT} or \
                    frozenset({K.NUMBER})
            if func.value in ("dict", "list", "tuple") and not self.bindings(func):
                return frozenset({K.CONTAINER})
            if func.value == "str" and call.args and not self.bindings(func):
                return (self.kinds(call.args[0].value) & {K.DEVICE, K.CUDA}) | {K.STRING}
            if func.value in ("next", "iter") and call.args and not self.bindings(func):
                inner = self.kinds(call.args[0].value)
                if K.LOADER in inner:
                    return frozenset({K.BATCH}) if func.value == "next" else inner
                return NOTHING
            defined = [b for b in self.bindings(func) if isinstance(b, Defined)]
            if defined:
                found = NOTHING
                for d in defined:
                    found |= self._called(d)
                return found
        if K.MODULE in self.kinds(func):
            return frozenset({K.TENSOR})  # a model's (or a loss module's) output
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            receiver = self.kinds(func.value)
            if method == "parse_args" and K.PARSER in receiver:
                return frozenset({K.ARGS})
            if method in K.PREPARES and K.ACCELERATOR in receiver:
                given = call.args[0].value if len(call.args) == 1 else None
                return frozenset({K.PREPARED}) | (self.kinds(given) & K.PREPARABLE)
            if method == "parse_known_args" and K.PARSER in receiver:
                return NOTHING
            if method == "bool" and K.TENSOR in receiver:
                return frozenset({K.TENSOR, K.BOOL})
            if method in K.SAME_KIND_METHODS:
                return receiver & {K.TENSOR, K.MODULE, K.BATCH, K.BOOL}
            if method == "state_dict":
                return frozenset({K.STATE})
            if method == "get_device" and K.TENSOR in receiver:
                return frozenset({K.DEVICE})
            if method in ("item", "tolist"):
                return frozenset({K.NUMBER})
            if K.TENSOR in receiver and method not in ("numpy",):
                return frozenset({K.TENSOR})
            if method == "numpy":
                return frozenset({K.NUMPY})
            cls = self.self_class.get(id(func))
            if cls is not None:
                return self._method_returns(cls, method)
        return NOTHING

    def _environment(self, key: cst.BaseExpression) -> frozenset[str]:
        name = string_value(key)
        kind = K.LAUNCHER_ENV.get(name or "")
        return frozenset({kind, K.STRING}) if kind else frozenset({K.STRING})

    def _subscript_kinds(self, expr: cst.Subscript) -> frozenset[str]:
        if self.qualified(expr.value) == "os.environ" and len(expr.slice) == 1 \
                and isinstance(expr.slice[0].slice, cst.Index):
            return self._environment(expr.slice[0].slice.value)
        base = self.kinds(expr.value)
        if K.BATCH in base or K.TENSOR in base:
            return frozenset({K.TENSOR})
        return NOTHING

    def _called(self, defined: Defined) -> frozenset[str]:
        node = defined.node
        if isinstance(node, cst.ClassDef):
            found = set()
            for base in node.bases:
                qualified = self.qualified(base.value)
                if qualified in K.BASES:
                    found.add(K.BASES[qualified])
                elif isinstance(base.value, cst.Name):
                    for b in self.bindings(base.value):
                        if isinstance(b, Defined) and isinstance(b.node, cst.ClassDef) \
                                and b.node is not node:
                            found |= self._called(b)
                known = K.call_kinds(qualified)
                if known and qualified in K.CALLS and qualified.startswith(
                        ("torch.utils.data", "torch.optim", "torch.nn.")):
                    found |= known
            return frozenset(found)
        return self._returns(node)

    def _returned_elements(self, value, index: int) -> list[cst.BaseExpression] | None:
        """`a, b, mask = f(...)` where the file's `f` returns tuples: each return's element at
        `index` (None when `value` is no such call)."""
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
            return None
        functions = [b.node for b in self.bindings(value.func)
                     if isinstance(b, Defined) and isinstance(b.node, cst.FunctionDef)]
        if not functions:
            return None
        elements = []
        for function in functions:
            finder = _Returns(function)
            function.body.visit(finder)
            for returned in finder.values:
                if not isinstance(returned, (cst.Tuple, cst.List)) or index >= len(
                        returned.elements) or any(isinstance(e, cst.StarredElement)
                                                  for e in returned.elements):
                    return None
                elements.append(returned.elements[index].value)
        return elements

    def _returns(self, function: cst.FunctionDef) -> frozenset[str]:
        finder = _Returns(function)
        function.body.visit(finder)
        if finder.yields:
            return frozenset({K.GENERATOR})  # the file's own generator: what it yields is its own
        found = NOTHING
        for value in finder.values:
            found |= self.kinds(value)
        return found

    def _method_returns(self, cls: cst.ClassDef, method: str) -> frozenset[str]:
        scope = self.scopes.get(id(cls))
        if scope is None:
            return NOTHING
        found = NOTHING
        for binding in scope.names.get(method, ()):
            if isinstance(binding, Defined) and isinstance(binding.node, cst.FunctionDef):
                found |= self._returns(binding.node)
        return found

    # -- parameters from call sites -----------------------------------------------------
    def param_args(self) -> dict[int, list[cst.BaseExpression]]:
        """id(Param) -> the expressions the file's calls give it."""
        if self._param_args is None:
            self._param_args = {}
            for call, scope in self.calls:
                for function, skip in self._callees(call, scope):
                    self._map_args(call, function, skip)
        return self._param_args

    def _callees(self, call: cst.Call, scope: Scope):
        """The file's own functions `call` calls: (FunctionDef, leading params to skip)."""
        func = call.func
        if isinstance(func, cst.Name):
            for binding in self._lookup(scope, func.value):
                if isinstance(binding, Defined):
                    if isinstance(binding.node, cst.FunctionDef):
                        yield binding.node, 0
                    else:
                        init = self._init_of(binding.node)
                        if init is not None:
                            yield init, 1
        elif isinstance(func, cst.Attribute):
            cls = self.self_class.get(id(func))
            classes = [cls] if cls is not None else self.classes_of(func.value)
            for cls in classes:
                class_scope = self.scopes.get(id(cls))
                for binding in class_scope.names.get(func.attr.value, ()) if class_scope else ():
                    if isinstance(binding, Defined) and isinstance(binding.node, cst.FunctionDef):
                        yield binding.node, 1

    def _variable_bindings(self, expr: cst.BaseExpression) -> list:
        """The bindings the variable `expr` reads: a name's, or a `self` attribute's in its
        class ([] for anything else)."""
        if isinstance(expr, cst.Name):
            return list(self.bindings(expr))
        if isinstance(expr, cst.Attribute) and id(expr) in self.self_class:
            return self.self_attrs.get(id(self.self_class[id(expr)]), {}).get(
                expr.attr.value, [])
        return []

    def classes_of(self, expr: cst.BaseExpression, depth: int = 0) -> list[cst.ClassDef]:
        """The file's classes whose instance `expr` may hold (`trainer = Trainer(...)`;
        `trainer.fit(loader)` then calls `Trainer.fit`)."""
        if depth > 8:
            return []
        if isinstance(expr, cst.Call):
            if isinstance(expr.func, cst.Name):
                return [b.node for b in self.bindings(expr.func)
                        if isinstance(b, Defined) and isinstance(b.node, cst.ClassDef)]
            return []
        bindings = self._variable_bindings(expr)
        found = []
        for b in bindings:
            if isinstance(b, Assigned) and not b.path:
                found += self.classes_of(b.value, depth + 1)
        return found

    def _init_of(self, cls: cst.ClassDef) -> cst.FunctionDef | None:
        scope = self.scopes.get(id(cls))
        for binding in scope.names.get("__init__", ()) if scope else ():
            if isinstance(binding, Defined) and isinstance(binding.node, cst.FunctionDef):
                return binding.node
        return None

    def _map_args(self, call: cst.Call, function: cst.FunctionDef, skip: int) -> None:
        positional = _positional(function.params)[skip:]
        by_name = {p.name.value: p for p in [*positional, *function.params.kwonly_params]}
        index = 0
        for arg in call.args:
            if arg.star:
                return  # `*args`: which parameter takes what is not known past here
            if arg.keyword is None:
                if index < len(positional):
                    self._param_args.setdefault(id(positional[index]), []).append(arg.value)
                index += 1
            elif arg.keyword.value in by_name:
                self._param_args.setdefault(id(by_name[arg.keyword.value]), []).append(arg.value)

    def spawned_rank(self, binding: Parameter) -> bool:
        """Is this the first parameter of a function the file starts processes with
        (`mp.spawn(fn, ...)`: fn gets each process's index)?"""
        if binding.index != 0:
            return False
        if self._spawned is None:
            self._spawned = {}
            for call, scope in self.calls:
                if self.qualified(call.func) in K.SPAWNS and call.args and isinstance(
                        call.args[0].value, cst.Name):
                    for b in self._lookup(scope, call.args[0].value.value):
                        if isinstance(b, Defined):
                            self._spawned[id(b.node)] = True
        return self._spawned.get(id(binding.function), False)

    def argparse_defaults(self) -> dict[str, list[cst.BaseExpression]]:
        """Option destination -> the defaults `add_argument` gives it, for every parser of the
        file (an option named `--local-rank` lands in `args.local_rank`)."""
        if self._argparse is None:
            self._argparse = {}
            # every add_argument of the file: a parser's, an argument group's, or one a helper
            # is given
            for call in self.arguments:
                dest = destination(call)
                default = next((a.value for a in call.args if a.keyword is not None
                                and a.keyword.value == "default"), None)
                if dest is not None and default is not None:
                    self._argparse.setdefault(dest, []).append(default)
        return self._argparse

    def _option_kinds(self, attr: str) -> frozenset[str]:
        """What the argparse option `attr` holds: its defaults', a launcher's option's."""
        found = frozenset({K.LAUNCHER_OPTIONS[attr]}) if attr in K.LAUNCHER_OPTIONS else NOTHING
        for default in self.argparse_defaults().get(attr, ()):
            found |= self.kinds(default)
        if attr in self._numeric_options():
            found |= {K.NUMBER}  # `--gpu type=int`: an index, whatever its uses say
        return found

    def _numeric_options(self) -> set[str]:
        """The argparse options that `type=int` or `type=float` (the builtins, unshadowed)
        makes numbers."""
        if self._numbers is None:
            self._numbers = {
                dest for call in self.arguments if (dest := destination(call)) is not None
                and any(a.keyword is not None and a.keyword.value == "type"
                        and isinstance(a.value, cst.Name) and a.value.value in ("int", "float")
                        and not self.bindings(a.value) for a in call.args)}
        return self._numbers

    def parameter_kinds(self, function, param: cst.Param) -> frozenset[str]:
        """The kinds a parameter of one of the file's functions (or lambdas) may hold."""
        scope = self.scopes.get(id(function))
        if scope is None:
            return NOTHING
        found = NOTHING
        for binding in scope.names.get(param.name.value, ()):
            found |= self._binding_kinds(binding)
        if self._use_kinds is None:
            self._collect_uses()
        said = self._use_kinds.get(("name", id(scope), param.name.value), ())
        return found | _compatible(said, found)

    def parameter_uses(self, function, param: cst.Param) -> set[str]:
        """What the places a parameter goes say it is (with STRING_USE where it is used as a
        string): what callers in other modules learn about what they give it."""
        scope = self.scopes.get(id(function))
        if scope is None:
            return set()
        said = set(self._use_kinds.get(("name", id(scope), param.name.value), ()))
        if self.used_as_string(param.name):
            said.add(K.STRING_USE)
        return said

    def instance_kinds(self, cls: cst.ClassDef) -> frozenset[str]:
        """What an instance of one of the file's classes is (an nn.Module's subclass: one)."""
        return self._called(Defined(cls, self.scopes.get(id(cls))))

    def calls_for_data(self, call: cst.Call) -> bool:
        """Does `call` run a model (a module's forward) or one of the file's own functions that
        returns tensors (nanoGPT's `get_batch(split)`)?"""
        if K.MODULE in self.kinds(call.func):
            return True
        if isinstance(call.func, cst.Name) and any(
                isinstance(b, Defined) and isinstance(b.node, cst.FunctionDef)
                for b in self.bindings(call.func)):
            return bool(self.kinds(call) & {K.TENSOR, K.BATCH})
        return False

    def names_of(self, wanted: frozenset[str] | set[str]) -> set[str]:
        """The identifiers (names, `self` attributes, argparse options) whose values may be of a
        `wanted` kind: the words a statement that uses such a value holds (prune.py)."""
        key = ("names_of", frozenset(wanted))
        if key in self._names_of:
            return self._names_of[key]
        found = set()
        scopes = [self.module_scope, *self.scopes.values()]
        for scope in scopes:
            for name, bindings in scope.names.items():
                if any(self._binding_kinds(b) & wanted for b in bindings):
                    found.add(name)
        for attrs in self.self_attrs.values():
            for attr, bindings in attrs.items():
                if any(self._binding_kinds(b) & wanted for b in bindings):
                    found.add(attr)
        for dest, defaults in self.argparse_defaults().items():
            if any(self.kinds(d) & wanted for d in defaults):
                found.add(dest)
        if self._use_kinds is None:
            self._collect_uses()
        for symbol, kinds in self._use_kinds.items():
            if kinds & wanted:
                found.add(symbol[-1])
        self._names_of[key] = found
        return found

    # -- how a variable is used -----------------------------------------------------
    def _symbols_given(self, nodes) -> set:
        found = set()
        for node in nodes:
            symbol = self.symbol(node)
            if symbol is not None:
                found.add(symbol)
        return found

    def used_as_attribute_name(self, expr: cst.BaseExpression) -> bool:
        """Is the variable `expr` reads given to getattr() as an attribute's name? (`"cuda"`
        there names `torch.cuda`, not a device.)"""
        symbol = self.symbol(expr)
        key = "attribute_name_symbols"
        if key not in self._names_of:
            self._names_of[key] = self._symbols_given(self.attribute_name_nodes)
        return symbol is not None and symbol in self._names_of[key]

    def given_as(self, expr: cst.BaseExpression, keyword: str) -> bool:
        """Is the variable `expr` reads given anywhere as `keyword=` (`fused=use_fused`), or
        does it decide whether that keyword is given (`dict(fused=True) if use_fused else
        dict()`)?"""
        if self.uses_of("decides:" + keyword, expr):
            return True
        symbol = self.symbol(expr)
        key = ("keyword_symbols", keyword)
        if key not in self._names_of:
            self._names_of[key] = self._symbols_given(self.keyword_nodes.get(keyword, ()))
        return symbol is not None and symbol in self._names_of[key]

    def assigned_to(self, value: cst.BaseExpression) -> list[cst.BaseExpression]:
        """The targets an assignment of `value` binds (`[device]` for `device = value`)."""
        return self.targets_of.get(id(value), [])

    def callers_targets(self, function: cst.FunctionDef) -> list[cst.BaseExpression]:
        """What the file's calls of `function` are assigned to (`device = get_device()`)."""
        found = []
        for call, scope in self.calls:
            if any(f is function for f, _ in self._callees(call, scope)) or (
                    isinstance(call.func, cst.Name) and any(
                        isinstance(b, Defined) and b.node is function
                        for b in self._lookup(scope, call.func.value))):
                found += self.targets_of.get(id(call), [])
        return found

    def uses_of(self, kind: str, expr: cst.BaseExpression) -> bool:
        """Do the places the variable `expr` reads goes say it is of `kind` (a backend's
        name given to init_process_group, a device given to `.to()`)?"""
        if self._use_kinds is None:
            self._collect_uses()
        symbol = self.symbol(expr)
        return symbol is not None and kind in self._use_kinds.get(symbol, ())

    def worker_init_functions(self) -> set[int]:
        """id() of the file's functions given to a DataLoader as `worker_init_fn`: they run in
        the loader's worker processes, where no device runtime may start."""
        return self.functions_given_as("worker_init_fn")

    def functions_given_as(self, keyword: str) -> set[int]:
        """id() of the file's functions given somewhere as `keyword=` (`collate_fn=collate`)."""
        key = ("functions_given", keyword)
        if key not in self._names_of:
            found = set()
            for value in self.keyword_nodes.get(keyword, ()):
                if isinstance(value, cst.Name):
                    found.update(id(b.node) for b in self.bindings(value) if isinstance(b, Defined))
            self._names_of[key] = found
        return self._names_of[key]

    def constant(self, expr: cst.BaseExpression | None, depth: int = 0) -> int | None:
        """The integer `expr` always is, folded through the file's constants (`n_embd //
        n_head`, `self.head_dim` set once to one), or None."""
        if expr is None or depth > 8:
            return None
        if isinstance(expr, cst.Integer):
            return expr.evaluated_value
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            inner = self.constant(expr.expression, depth + 1)
            return -inner if inner is not None else None
        if isinstance(expr, cst.BinaryOperation):
            a, b = self.constant(expr.left, depth + 1), self.constant(expr.right, depth + 1)
            if a is None or b is None:
                return None
            if isinstance(expr.operator, cst.FloorDivide) and b:
                return a // b
            if isinstance(expr.operator, cst.Multiply):
                return a * b
            if isinstance(expr.operator, cst.Add):
                return a + b
            if isinstance(expr.operator, cst.Subtract):
                return a - b
            return None
        bindings = self._variable_bindings(expr)
        values = {self.constant(b.value, depth + 1) if isinstance(b, Assigned) and not b.path
                  else (self.constant(b.param.default, depth + 1)
                        if isinstance(b, Parameter) and b.param.default is not None
                        and not self.param_args().get(id(b.param)) else None)
                  for b in bindings}
        return values.pop() if len(values) == 1 else None

    def option_is_not_a_device(self, dest: str) -> bool:
        """Is the argparse option `dest` given where a backend goes, or read as an attribute
        name (so a "cuda" default of it is no device)?"""
        if self._use_kinds is None:
            self._collect_uses()
        if K.BACKEND in self._use_kinds.get(("arg", dest), ()):
            return True
        key = "attribute_name_symbols"
        if key not in self._names_of:
            self._names_of[key] = self._symbols_given(self.attribute_name_nodes)
        return ("arg", dest) in self._names_of[key]

    def option_used_as_string(self, dest: str) -> bool:
        """Is the argparse option `dest` (`args.dest`) compared as a string anywhere?"""
        if self._string_symbols is None:
            self._string_symbols = self._symbols_of(self.string_uses | self._device_type_args())
        return ("arg", dest) in self._string_symbols

    def key_used_as_string(self, key: str) -> bool:
        """Is a field or entry `key` (`config.device`, `cfg["device"]`) used as a string
        anywhere in the file? What a keyword argument or a dict entry is read back as."""
        if "key_string_uses" not in self._names_of:
            found = set()
            for node in _expressions(self.module, self.string_uses):
                if isinstance(node, cst.Attribute):
                    found.add(node.attr.value)
                elif isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(
                        node.slice[0].slice, cst.Index):
                    text = string_value(node.slice[0].slice.value)
                    if text:
                        found.add(text)
            self._names_of["key_string_uses"] = found
        return key in self._names_of["key_string_uses"]

    def device_parameters_given(self, call: cst.Call) -> list[cst.BaseExpression]:
        """The arguments of `call` that land in parameters of the file's functions that hold
        devices (what the function does with them: `.to(p)`, `device=p`)."""
        scope = next((s for c, s in self.calls if c is call), None)
        if scope is None:
            return []
        found = []
        for function, skip in self._callees(call, scope):
            positional = _positional(function.params)[skip:]
            by_name = {p.name.value: p for p in [*positional, *function.params.kwonly_params]}
            for i, arg in enumerate(call.args):
                if arg.star:
                    break
                param = by_name.get(arg.keyword.value) if arg.keyword is not None else (
                    positional[i] if i < len(positional) else None)
                if param is not None and K.DEVICE in self.parameter_kinds(function, param):
                    found.append(arg.value)
        return found

    def returned_as_device(self, function: cst.FunctionDef) -> bool:
        """Is what `function` returns used where a device goes (`device = get_device()`,
        then `.to(device)`; `x.to(get_device())`)?"""
        if any(self.used_as_device(t) for t in self.callers_targets(function)):
            return True
        return any(id(call) in self.device_uses for call, scope in self.calls
                   if any(f is function for f, _ in self._callees(call, scope)))

    def all_option_uses(self) -> dict[str, set[str]]:
        """Every argparse option this file reads (`args.dest`, `getattr(args, "dest")`) and
        what the places it goes say it is."""
        if self._use_kinds is None:
            self._collect_uses()
        return {key[1]: kinds for key, kinds in self._use_kinds.items() if key[0] == "arg"}

    def option_uses(self, dest: str) -> set[str]:
        """What the places an argparse option (`args.dest`) goes say it is."""
        if self._use_kinds is None:
            self._collect_uses()
        return set(self._use_kinds.get(("arg", dest), ()))

    def is_process_count(self, expr: cst.BaseExpression) -> bool:
        """Is the variable `expr` reads given where a count of processes goes (`nprocs=`,
        `world_size=`, `mp.spawn(fn, args, n)`)?"""
        return self.uses_of(K.PROCESS_COUNT, expr)

    def derives_from(self, expr: cst.BaseExpression | None, kind: str, depth: int = 0) -> bool:
        """Is `expr` built from a value of `kind` (a path made from the rank: f"ckpt_{rank}.pt",
        `os.path.join(out, name)` where `name` holds one, `"w%d" % rank`)?"""
        if expr is None or depth > 12:
            return False
        key = ("derives", id(expr), kind)
        if key in self._names_of:
            return self._names_of[key]
        self._names_of[key] = False  # a cycle reads as no
        found = kind in self.kinds(expr) or self._derives(expr, kind, depth + 1)
        self._names_of[key] = found
        return found

    def _derives(self, expr: cst.BaseExpression, kind: str, depth: int) -> bool:
        parts: list = []
        if isinstance(expr, cst.FormattedString):
            parts = [p.expression for p in expr.parts if isinstance(p, cst.FormattedStringExpression)]
        elif isinstance(expr, (cst.BinaryOperation, cst.BooleanOperation)):
            parts = [expr.left, expr.right]
        elif isinstance(expr, cst.IfExp):
            parts = [expr.body, expr.orelse]
        elif isinstance(expr, (cst.Tuple, cst.List)):
            parts = [e.value for e in expr.elements]
        elif isinstance(expr, cst.ConcatenatedString):
            parts = [expr.left, expr.right]
        elif isinstance(expr, cst.Call):
            parts = [a.value for a in expr.args]
            if isinstance(expr.func, cst.Attribute):
                parts.append(expr.func.value)  # "w{}".format(rank), out.joinpath(name)
        elif isinstance(expr, cst.Name):
            for binding in self.bindings(expr):
                if isinstance(binding, Assigned):
                    parts.append(binding.value)
                elif isinstance(binding, Parameter) and binding.param.default is not None:
                    parts.append(binding.param.default)
        elif isinstance(expr, cst.Attribute):
            cls = self.self_class.get(id(expr))
            if cls is not None:
                parts = [b.value for b in self.self_attrs.get(id(cls), {}).get(expr.attr.value, ())
                         if isinstance(b, Assigned)]
        return any(self.derives_from(p, kind, depth) for p in parts)

    def holds_state(self, expr: cst.BaseExpression) -> bool:
        """Does `expr` hold a state dict or a container of values (a dict, list or tuple made
        in this file), what a checkpoint saves?"""
        return bool(self.kinds(expr) & {K.STATE, K.CONTAINER})

    def calls_any(self, names: frozenset[str] | set[str]) -> bool:
        """Does the file call any of these qualified names?"""
        return any(self.qualified(call.func) in names for call, _ in self.calls)

    def used_as_string(self, expr: cst.BaseExpression) -> bool:
        """Is the variable `expr` reads used as a string anywhere in the file (compared with
        a string, a str method called on it, concatenated with one, given as a device type),
        or in another module of the program it is given to?"""
        symbol = self.symbol(expr)
        if symbol is None:
            return id(expr) in self.string_uses
        if K.STRING_USE in self._use_kinds.get(symbol, ()):
            return True
        if self._string_symbols is None:
            self._string_symbols = self._symbols_of(self.string_uses | self._device_type_args())
        return symbol in self._string_symbols

    def used_as_device_string(self, expr: cst.BaseExpression) -> bool:
        """Is the variable `expr` reads (a name, an attribute, an argparse option) given where
        a device goes, or compared as a string? What a CUDA device string set in it means."""
        return self.uses_of(K.DEVICE, expr) or self.used_as_string(expr)

    def used_as_device(self, expr: cst.BaseExpression) -> bool:
        """Is the variable `expr` reads given somewhere a device goes (`.to(x)`, `device=x`)?"""
        symbol = self.symbol(expr)
        if symbol is None:
            return id(expr) in self.device_uses
        if self._device_symbols is None:
            self._device_symbols = self._symbols_of(self.device_uses)
        return symbol in self._device_symbols

    def _device_type_args(self) -> set[int]:
        found = set()
        for call, _ in self.calls:
            if self.qualified(call.func) in K.DEVICE_TYPE_CALLS and call.args \
                    and call.args[0].keyword is None:
                found.add(id(call.args[0].value))
            for arg in call.args:
                if arg.keyword is not None and arg.keyword.value == "device_type":
                    found.add(id(arg.value))
        return found

    def _symbols_of(self, ids: set[int]) -> set:
        found = set()
        for node in _expressions(self.module, ids):
            symbol = self.symbol(node)
            if symbol is not None:
                found.add(symbol)
        return found


def _torch_cuda_call(call: cst.Call) -> bool:
    """`x.cuda(device)` as torch's Tensor/Module method takes it (at most the device and
    non_blocking by position; no keyword torch's does not take): another class's `.cuda`
    (hqq's quantizer: `.cuda(qtensor, meta=meta)`) says nothing of its arguments."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    return len(positional) <= 2 and not any(a.star for a in call.args) and keywords <= {
        "device", "non_blocking", "memory_format"}


def _compatible(said, found: frozenset[str]) -> frozenset[str]:
    """The kinds uses say that the sources (`found`) and the other uses do not rule out: a
    rank given as `device_ids=[rank]` and as `.to(rank)` is a device index, not a device."""
    return frozenset(k for k in said if not ((found | set(said)) & K.EXCLUSIVE.get(k, NOTHING)))


def absolute_import(qualified: str, module: str, is_package: bool) -> str:
    """An import as recorded (a relative one with its leading dots) made absolute from the
    importing module `module`."""
    if not qualified.startswith("."):
        return qualified
    level = len(qualified) - len(qualified.lstrip("."))
    base = module.split(".") if module else []
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[:max(0, len(base) - (level - 1))]
    rest = qualified.lstrip(".")
    return ".".join([*base, rest]) if base else rest


def _static(function) -> bool:
    return any(isinstance(d.decorator, cst.Name) and d.decorator.value in (
        "staticmethod", "classmethod") for d in getattr(function, "decorators", ()))


def _walk(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


def _expressions(module: cst.Module, ids: set[int]):
    """The nodes of `module` whose id() is in `ids`."""
    class Find(cst.CSTVisitor):
        def __init__(self) -> None:
            self.found = []

        def on_visit(self, node) -> bool:
            if id(node) in ids:
                self.found.append(node)
            return True

    finder = Find()
    module.visit(finder)
    return finder.found


class _Returns(cst.CSTVisitor):
    def __init__(self, function) -> None:
        self.function = function
        self.values: list[cst.BaseExpression] = []
        self.yields = False

    def visit_FunctionDef(self, node) -> bool:
        return False

    def visit_Lambda(self, node) -> bool:
        return False

    def visit_ClassDef(self, node) -> bool:
        return False

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            self.values.append(node.value)

    def visit_Yield(self, node: cst.Yield) -> None:
        self.yields = True


def _is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def destination(call: cst.Call) -> str | None:
    """Where argparse stores an option: `dest=`, else the first long option's name with
    dashes as underscores, else the positional's name."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "dest":
            return string_value(arg.value)
    flags = [string_value(a.value) for a in call.args if a.keyword is None]
    flags = [f for f in flags if f]
    long = next((f for f in flags if f.startswith("--")), None)
    chosen = long or (flags[0] if flags else None)
    if chosen is None:
        return None
    return chosen.lstrip("-").replace("-", "_")
