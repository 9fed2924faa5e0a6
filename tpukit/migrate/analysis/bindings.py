"""The names of one file and what binds them, recorded in one pass for values.py: the scopes
(module, functions, lambdas, comprehensions, classes, with Python's rules: a class body's
names are not seen by its methods), every binding (imports, assignments and their unpacking,
`for` targets, `with ... as`, parameters, definitions), `self.x = ...` per class, argparse's
`add_argument` defaults, every call of the file's own functions and how each name is used (as
a string, as a device); and the small readers of nodes the dataflow shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.nodes import children, dotted, scan, string_value

if TYPE_CHECKING:
    from tpukit.migrate.analysis.values import Values

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


def positional_params(params: cst.Parameters) -> list[cst.Param]:
    return [*params.posonly_params, *params.params]


class Recorder(cst.CSTVisitor):
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
        params = positional_params(self.functions[-1].params)
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
            scan(decorator, self)
        for base in node.bases:
            scan(base, self)
        for keyword in node.keywords:
            scan(keyword, self)
        outer = self._binding_scope(node.name.value)
        scope = self._push(node, is_class=True, name=node.name.value)
        outer.bind(node.name.value, Defined(node, scope))
        self.classes.append((node, scope))
        scan(node.body, self)
        self.classes.pop()
        self.stack.pop()
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        for decorator in node.decorators:
            scan(decorator, self)
        if node.returns is not None:
            scan(node.returns, self)
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
        scan(node.body, self)
        self.functions.pop()
        self.stack.pop()
        return False

    def _visit_defaults(self, params: cst.Parameters) -> None:
        for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
            if param.default is not None:
                scan(param.default, self)
            if param.annotation is not None:
                scan(param.annotation, self)

    def _bind_params(self, node, outer: Scope) -> None:
        params = node.params
        for i, param in enumerate(positional_params(params)):
            self.scope.bind(param.name.value, Parameter(node, param, i, outer))
        for param in params.kwonly_params:
            self.scope.bind(param.name.value, Parameter(node, param, -1, outer))
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                self.scope.bind(star.name.value, Parameter(node, star, -1, outer))
        for param in [*positional_params(params), *params.kwonly_params]:
            self.v._param_symbol[id(param)] = ("name", id(self.scope), param.name.value)
            self.v.scope_of[id(param.name)] = self.scope

    def _comprehension(self, node) -> bool:
        # The first iterable is evaluated outside; the rest inside the comprehension's scope.
        scan(node.for_in.iter, self)
        self._push(node)
        for_in = node.for_in
        first = True
        while for_in is not None:
            if not first:
                scan(for_in.iter, self)
            first = False
            self._bind_target(for_in.target, lambda path, it=for_in.iter: Iterated(it, path))
            scan(for_in.target, self)
            for condition in for_in.ifs:
                scan(condition, self)
            for_in = for_in.inner_for_in
        for part in ("elt", "key", "value"):
            child = getattr(node, part, None)
            if child is not None:
                scan(child, self)
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
                    method == "to" or torch_cuda_call(node)):
                self.v.device_uses.add(id(node.args[0].value))
                self.v.device_use_nodes.append(node.args[0].value)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        # `dict(fused=True) if use_fused else dict()`: the test decides a keyword argument
        keywords = {n.keyword.value for branch in (node.body, node.orelse)
                    for n in walk_shallow(branch) if isinstance(n, cst.Arg) and n.keyword is not None}
        for keyword in keywords:
            for part in walk_shallow(node.test):
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


def torch_cuda_call(call: cst.Call) -> bool:
    """`x.cuda(device)` as torch's Tensor/Module method takes it (at most the device and
    non_blocking by position; no keyword torch's does not take): another class's `.cuda`
    (hqq's quantizer: `.cuda(qtensor, meta=meta)`) says nothing of its arguments."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    return len(positional) <= 2 and not any(a.star for a in call.args) and keywords <= {
        "device", "non_blocking", "memory_format"}


def compatible(said, found: frozenset[str]) -> frozenset[str]:
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


def is_static(function) -> bool:
    return any(isinstance(d.decorator, cst.Name) and d.decorator.value in (
        "staticmethod", "classmethod") for d in getattr(function, "decorators", ()))


def walk_shallow(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(children(current))


def expressions(module: cst.Module, ids: set[int]):
    """The nodes of `module` whose id() is in `ids`."""
    class Find(cst.CSTVisitor):
        def __init__(self) -> None:
            self.found = []

        def on_visit(self, node) -> bool:
            if id(node) in ids:
                self.found.append(node)
            return True

    finder = Find()
    scan(module, finder)
    return finder.found


class Returns(cst.CSTVisitor):
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


def is_none(expr: cst.BaseExpression) -> bool:
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
