"""Small functions over libcst nodes that rule code shares: names, literals, arguments."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

import libcst as cst

_CUDA_DEVICE = re.compile(r"^cuda(:\d+)?$")


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


def _child_fields(node_type: type) -> tuple[str, ...] | None:
    """The fields of `node_type` that hold its children, in the order libcst visits them
    (which is source order): read once per type from its `_visit_and_replace_children`, whose
    `visit_*(self, "field", ...)` calls name them. None where that cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(node_type._visit_and_replace_children))
    except (OSError, TypeError):
        return None
    fields: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id.startswith("visit_") and len(node.args) >= 3 \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value not in fields:
            fields.append(node.args[1].value)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return tuple(fields)


_CHILD_FIELDS: dict[type, tuple[str, ...] | None] = {}


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node.children` without its cost: libcst makes them by rebuilding the node (a copy of
    it and a validation per call); this reads the fields that hold them, in the same order
    (tests/test_engine.py compares both on every node of the fixtures and of torch's
    nn.modules)."""
    node_type = type(node)
    try:
        fields = _CHILD_FIELDS[node_type]
    except KeyError:
        fields = _CHILD_FIELDS[node_type] = _child_fields(node_type)
    if fields is None:
        return list(node.children)
    found = []
    for name in fields:
        value = getattr(node, name, None)
        kind = type(value)
        if kind is tuple or kind is list:
            found.extend(item for item in value if _is_node(type(item)))
        elif _is_node(kind):
            found.append(value)
    return found


_NODE_TYPES: dict[type, bool] = {}


def _is_node(kind: type) -> bool:
    """issubclass(kind, cst.CSTNode), once per type (CSTNode is an ABC: its checks are slow)."""
    try:
        return _NODE_TYPES[kind]
    except KeyError:
        found = _NODE_TYPES[kind] = issubclass(kind, cst.CSTNode)
        return found


def walk(*nodes: cst.CSTNode):
    """Each of `nodes` and everything it contains, in source order."""
    stack = list(reversed(nodes))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def parent_map(root: cst.CSTNode) -> dict[int, cst.CSTNode]:
    """id() of each node under `root` -> its parent."""
    found = {}
    for node in walk(root):
        for child in children(node):
            found[id(child)] = node
    return found


def ancestors(node: cst.CSTNode, parents: dict[int, cst.CSTNode], stop: cst.CSTNode):
    """The nodes above `node` (nearest first), up to `stop`, which is left out."""
    node = parents.get(id(node))
    while node is not None and node is not stop:
        yield node
        node = parents.get(id(node))


def name_uses(name: str, *scopes: cst.CSTNode):
    """Each `Name` node spelled `name` in `scopes` (a variable's reads and bindings, an
    attribute or keyword of that name too: the caller tells them apart), in source order, as
    (node, parent, grandparent); None above a scope's root."""
    for scope in scopes:
        stack = [(scope, None, None)]
        while stack:
            node, parent, grandparent = stack.pop()
            if isinstance(node, cst.Name) and node.value == name:
                yield node, parent, grandparent
            stack.extend((child, node, parent) for child in reversed(children(node)))


def scan(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """`node.visit(visitor)` for a visitor that only reads: the same `visit_<Node>` and
    `leave_<Node>` calls in the same order, without the copy of every node libcst makes on
    the way (a visitor's traversal there rebuilds the tree it reads). A visitor that keeps
    libcst's `on_visit`/`on_leave` has its hooks looked up once per node type."""
    cls = type(visitor)
    own = (cls.on_visit is not cst.CSTVisitor.on_visit, cls.on_leave is not cst.CSTVisitor.on_leave)
    _scan(node, visitor, cls, *own)


_HOOKS: dict[tuple[type, type], tuple] = {}


def _scan(node: cst.CSTNode, visitor, cls: type, own_visit: bool, own_leave: bool) -> None:
    key = (cls, type(node))
    try:
        visit, leave = _HOOKS[key]
    except KeyError:
        name = type(node).__name__
        visit, leave = _HOOKS[key] = (getattr(cls, f"visit_{name}", None),
                                      getattr(cls, f"leave_{name}", None))
    if own_visit:
        deeper = visitor.on_visit(node)
    else:
        deeper = visit is None or visit(visitor, node) is not False
    if deeper:
        for child in children(node):
            _scan(child, visitor, cls, own_visit, own_leave)
    if own_leave:
        visitor.on_leave(node)
    elif leave is not None:
        leave(visitor, node)


def first(node: cst.CSTNode, test):
    """The first truthy `test(n)` over `node` and what it contains (in source order), or
    None; the walk stops at the first."""
    for found in map(test, walk(node)):
        if found:
            return found
    return None


def is_docstring(stmt: cst.CSTNode) -> bool:
    """A statement that is only a string: a module's, class's or function's docstring when it
    comes first."""
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def import_bindings(module: cst.Module) -> dict[str, str]:
    """What the module's top-level imports bind: {bound name: qualified name} (`import
    numpy as np` -> np: numpy; `import a.b` -> a: a; `from setuptools import setup` -> setup:
    setuptools.setup; a relative import's module keeps its dots: `from . import x` -> x: .x)."""
    names = {}
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                module_name = "." * len(small.relative) + (dotted(small.module) or "")
                for alias in small.names:
                    name = dotted(alias.name) or ""
                    full = f"{module_name}.{name}" if module_name.rstrip(".") else module_name + name
                    names[alias.asname.name.value if alias.asname else name] = full
            elif isinstance(small, cst.Import):
                for alias in small.names:
                    if alias.asname is not None:
                        names[alias.asname.name.value] = dotted(alias.name) or ""
                    else:  # `import a.b` binds `a`
                        root = (dotted(alias.name) or "").split(".")[0]
                        names[root] = root
    return names
