"""A number read back from the device every step only to be given to a meter object that sums
and formats it for the logs, given as a device tensor instead (TPU513).

`losses.update(loss.item(), images.size(0))` (pytorch/examples' ImageNet trainer, MoCo,
SimSiam: an `AverageMeter` and a `ProgressMeter` of the file's own) makes the host wait for the
device at every step, though the meter only sums the number and prints it every `print_freq`
steps. Given `_xla_deferred(loss)`, the meter's arithmetic runs on the device and formatting
the meter (`'{val:.4e}'.format(**self.__dict__)`: a 0-d tensor formats as its number) reads it
back: once per print.

Decided by dataflow over the file, the meter's class and what holds its instances:
- the receiver is a local bound only to instances of one class of the file, used in its
  function only as the receiver of that class's methods, for its attributes, by `str()` /
  formatting, or inside a list given to a class of the file that only keeps it and formats or
  calls the class's methods on its items (ImageNet's `ProgressMeter`);
- in the method, the parameter given the read flows only through arithmetic into attributes of
  `self` (`self.val = val`, `self.sum += val * n`), and so does every read of those attributes
  in the class (`self.avg = self.sum / self.count`), or it is formatted (an f-string field,
  `format()`, the instance's `__dict__` given to `str.format` with no `!r`/`!s` conversion in
  the file), or read as a number (`float()`, `int()`, `round()`, a comparison, an element of
  `torch.tensor([...])`'s data: read back there, `_xla_value(self.sum)`);
- the call is in a loop that ends a graph at every iteration (as TPU512's sums), and every use
  in that loop that reads the meter back (a format or a number read of its sums, a method that
  formats them, any method of the holder) is under an `if` (the logging interval): read at
  every iteration, the port would read more often than the `.item()` it replaces (a format
  reads both `val` and `avg`).
Reads of those attributes through the receiver (`losses.avg`) become `_xla_value(losses.avg)`,
the Python number they were. The device sums in float32 where the host summed Python floats:
the logged figures' last digits may differ; the training does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from tpukit.migrate.analysis.bindings import Assigned, Defined, Parameter, positional_params
from tpukit.migrate.nodes import ancestors, walk
from tpukit.migrate.transforms.base import Transform, transform
from tpukit.migrate.transforms.hot_loop.common import (
    _ARITHMETIC, _SCOPES, DEFERRED, VALUE, deferred_fix, enclosing_loop, ends_graph, reads_in,
    under_if)

_NUMBER_CALLS = ("float", "int", "round")
_TENSOR_DATA = ("torch.tensor", "torch.as_tensor")
_CONVERSIONS = ("!r", "!s", "!a")


@dataclass
class _Plan:
    reads: dict[int, tuple[cst.Call, str]] = field(default_factory=dict)  # read -> receiver
    values: set[int] = field(default_factory=set)  # id() of attribute reads to wrap
    receivers: set[str] = field(default_factory=set)  # names (the statement prefilter)
    attributes: set[str] = field(default_factory=set)


class _Blocked(Exception):
    """A use the proof does not cover: the meter is left as written."""


def _arithmetic_top(node, parents):
    """The outermost arithmetic expression `node` is an operand of (`node` itself if none)."""
    while True:
        parent = parents.get(id(node))
        if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, _ARITHMETIC) \
                or isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Minus):
            node = parent
            continue
        return node


def _is_store(node, parents) -> bool:
    """`node` is (an element of) an assignment's target or an augmented assignment's."""
    child, parent = node, parents.get(id(node))
    while isinstance(parent, (cst.Element, cst.Tuple, cst.List)):
        child, parent = parent, parents.get(id(parent))
    return isinstance(parent, cst.AssignTarget) or (
        isinstance(parent, cst.AugAssign) and parent.target is child)


class _Meters:
    """The proof for one file (see the module's doc), built once."""

    def __init__(self, ctx) -> None:
        self.ctx, self.values = ctx, ctx.values
        self.parents = ctx.parents()
        self.plan = _Plan()
        self.classes: dict[tuple[int, str, int], tuple[frozenset, frozenset] | None] = {}
        self.containers: dict[tuple[int, int, int], bool] = {}
        self.conversions = any(isinstance(n, cst.SimpleString) and any(
            c in n.value for c in _CONVERSIONS) for n in walk(ctx.module))

    def prove(self) -> _Plan:
        for node in walk(self.ctx.module):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                    and isinstance(node.func.value, cst.Name):
                try:
                    self._call(node)
                except _Blocked:
                    continue
        return self.plan

    # -- the call: a read given to a method of a meter -------------------------------------
    def _call(self, call: cst.Call) -> None:
        receiver = call.func.value
        cls = self._class_of(receiver)
        method = self._method(cls, call.func.attr.value) if cls is not None else None
        if method is None:
            return
        for index, arg in enumerate(call.args):
            reads = reads_in(self.values, arg.value)
            if not reads:
                continue
            param = self._param(method, call, index)
            if param is None:
                raise _Blocked
            proven = self._class(cls, method, param)
            if proven is None:
                raise _Blocked
            tainted, wraps, showing = proven
            function = self._function_of(call)
            loop = enclosing_loop(call, self.parents, function)
            if function is None or loop is None or not ends_graph(self.ctx, loop):
                raise _Blocked
            outside = self._receiver_uses(receiver, cls, tainted, showing, function, loop)
            for read in reads:
                self.plan.reads[id(read)] = (read, receiver.value)
            self.plan.values.update(wraps | outside)
            self.plan.receivers.add(receiver.value)
            self.plan.attributes.update(tainted)

    def _class_of(self, receiver: cst.Name) -> cst.ClassDef | None:
        bindings = self.values.bindings(receiver)
        found = self.values.classes_of(receiver)
        if not bindings or len(found) != len(bindings) or any(
                not isinstance(b, Assigned) or b.path for b in bindings):
            return None
        return found[0] if all(c is found[0] for c in found) else None

    def _method(self, cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
        scope = self.values.scopes.get(id(cls))
        bindings = scope.names.get(name, []) if scope else []
        if len(bindings) == 1 and isinstance(bindings[0], Defined) \
                and isinstance(bindings[0].node, cst.FunctionDef) and not bindings[0].node.decorators:
            return bindings[0].node
        return None

    def _methods(self, cls: cst.ClassDef) -> set[str]:
        scope = self.values.scopes.get(id(cls))
        return {n for n, bs in (scope.names.items() if scope else ()) if any(
            isinstance(b, Defined) and isinstance(b.node, cst.FunctionDef) for b in bs)}

    @staticmethod
    def _param(method: cst.FunctionDef, call: cst.Call, index: int) -> cst.Param | None:
        positional = positional_params(method.params)[1:]
        arg = call.args[index]
        if arg.star or any(a.star for a in call.args[:index]):
            return None
        if arg.keyword is not None:
            return next((p for p in positional if p.name.value == arg.keyword.value), None)
        return positional[index] if index < len(positional) else None

    def _function_of(self, node) -> cst.FunctionDef | None:
        return next((n for n in ancestors(node, self.parents, None)
                     if isinstance(n, cst.FunctionDef)), None)

    # -- the class: where the number goes -------------------------------------------------
    def _class(self, cls, method, param):
        key = (id(cls), method.name.value, id(param))
        if key not in self.classes:
            try:
                self.classes[key] = self._prove_class(cls, method, param)
            except _Blocked:
                self.classes[key] = None
        return self.classes[key]

    def _self_attribute(self, node, cls) -> str | None:
        if isinstance(node, cst.Attribute) and self.values.self_class.get(id(node)) is cls:
            return node.attr.value
        return None

    def _into(self, top, cls) -> str | None:
        """The attribute of self an arithmetic expression is assigned or added to."""
        parent = self.parents.get(id(top))
        if isinstance(parent, cst.Assign) and parent.value is top and len(parent.targets) == 1:
            return self._self_attribute(parent.targets[0].target, cls)
        if isinstance(parent, cst.AugAssign) and parent.value is top:
            return self._self_attribute(parent.target, cls)
        return None

    def _prove_class(self, cls, method, param):
        seen = False
        tainted: set[str] = set()
        shows: set[int] = set()  # id() of reads that format or read a number back
        for node in walk(method.body):
            if not (isinstance(node, cst.Name) and node.value == param.name.value):
                continue
            bindings = self.values.bindings(node)
            if not bindings or not all(isinstance(b, Parameter) and b.param is param
                                       for b in bindings):
                continue  # another variable of that name (a nested scope's)
            parent = self.parents.get(id(node))
            if isinstance(parent, cst.Attribute) and parent.attr is node:
                continue
            seen = True
            into = self._into(_arithmetic_top(node, self.parents), cls)
            if into is None:
                raise _Blocked  # the number goes elsewhere than into the meter
            tainted.add(into)
        if not seen:
            raise _Blocked
        wraps: set[int] = set()
        nodes = [n for n in walk(cls.body) if isinstance(n, cst.Attribute)
                 and self.values.self_class.get(id(n)) is cls]
        changed = True
        while changed:
            changed = False
            for node in nodes:
                name = node.attr.value
                if name == "__dict__":
                    self._dict_read(node)
                    continue
                if name not in tainted or _is_store(node, self.parents):
                    continue
                top = _arithmetic_top(node, self.parents)
                into = self._into(top, cls)
                if into is not None:
                    if into not in tainted:
                        tainted.add(into)
                        changed = True
                elif self._formatted(top):
                    shows.add(id(node))
                elif self._read_as_number(top):
                    wraps.add(id(node))
                    shows.add(id(node))
                else:
                    raise _Blocked
        return frozenset(tainted), frozenset(wraps), self._showing(cls, shows)

    def _showing(self, cls, shows: set[int]) -> frozenset:
        """The methods that read the meter's numbers back (format them or read them as
        numbers), directly or through another method of `self`, or that use `self` other than
        for its attributes: a call of one of them reads the device."""
        methods = {}
        for statement in cls.body.body:
            if isinstance(statement, cst.FunctionDef):
                methods[statement.name.value] = statement
        showing, calls = set(), {}
        for name, method in methods.items():
            params = positional_params(method.params)
            own = params[0].name.value if params else None
            calls[name] = set()
            for node in walk(method.body):
                if id(node) in shows or (isinstance(node, cst.Attribute)
                                         and node.attr.value == "__dict__"):
                    showing.add(name)
                elif isinstance(node, cst.Name) and node.value == own:
                    parent = self.parents.get(id(node))
                    if not (isinstance(parent, cst.Attribute) and parent.value is node):
                        showing.add(name)  # `self` handed on or formatted
                    elif parent.attr.value in methods:
                        calls[name].add(parent.attr.value)
        changed = True
        while changed:
            changed = False
            for name, called in calls.items():
                if name not in showing and called & showing:
                    showing.add(name)
                    changed = True
        return frozenset(showing)

    def _dict_read(self, node) -> None:
        """`fmt.format(**self.__dict__)` with `fmt` a string: each field formats its value."""
        arg = self.parents.get(id(node))
        call = self.parents.get(id(arg))
        if not (isinstance(arg, cst.Arg) and arg.star == "**" and isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute) and call.func.attr.value == "format"
                and self._string(call.func.value) and not self.conversions):
            raise _Blocked

    def _string(self, expr, depth: int = 0) -> bool:
        if isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
            return True
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
            return self._string(expr.left, depth)
        if isinstance(expr, cst.Name) and depth < 3:
            bindings = self.values.bindings(expr)
            return bool(bindings) and all(isinstance(b, Assigned) and not b.path
                                          and self._string(b.value, depth + 1) for b in bindings)
        return False

    def _formatted(self, top) -> bool:
        parent = self.parents.get(id(top))
        if isinstance(parent, cst.FormattedStringExpression):
            return parent.expression is top and parent.conversion is None
        if isinstance(parent, cst.Arg) and parent.keyword is None and not parent.star:
            call = self.parents.get(id(parent))
            return (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)
                    and call.func.value == "format" and not self.values.bindings(call.func)
                    and call.args[0] is parent)
        return False

    def _read_as_number(self, top) -> bool:
        """A context that reads the number either way: the wrapped read gives the same."""
        parent = self.parents.get(id(top))
        if isinstance(parent, cst.ComparisonTarget) or isinstance(parent, cst.Comparison):
            return True
        if isinstance(parent, cst.Arg) and parent.keyword is None and not parent.star:
            call = self.parents.get(id(parent))
            return (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)
                    and call.func.value in _NUMBER_CALLS and not self.values.bindings(call.func)
                    and call.args[0] is parent)
        if isinstance(parent, cst.Element):
            data = self.parents.get(id(parent))
            arg = self.parents.get(id(data))
            call = self.parents.get(id(arg))
            return (isinstance(data, (cst.List, cst.Tuple)) and isinstance(arg, cst.Arg)
                    and isinstance(call, cst.Call) and call.args[0] is arg
                    and self.values.qualified(call.func) in _TENSOR_DATA)
        return False

    # -- the receiver: what its function does with it --------------------------------------
    def _receiver_uses(self, receiver, cls, tainted, showing, function, loop) -> set[int]:
        """The reads of the meter's numbers through `receiver` in `function` (to wrap); every
        use that reads the device inside `loop` must be under an `if` (printed every N steps,
        as TPU512's sums): read at every iteration, the port would read more, not less."""
        symbol = self.values.symbol(receiver)
        methods = self._methods(cls)
        wraps = set()
        for node in self._local_uses(symbol, function):
            parent = self.parents.get(id(node))
            if isinstance(parent, cst.AssignTarget):
                continue  # its bindings: instances of the class (_class_of)
            if isinstance(parent, cst.Attribute):
                call = self.parents.get(id(parent))
                if parent.attr.value in methods:
                    if not (isinstance(call, cst.Call) and call.func is parent):
                        raise _Blocked  # a bound method handed on
                    if parent.attr.value in showing:
                        self._seldom(node, loop)
                elif parent.attr.value in tainted and not _is_store(parent, self.parents):
                    self._seldom(node, loop)
                    wraps.add(id(parent))
                continue
            if self._formatted(node) or self._str_of(node):
                self._seldom(node, loop)
                continue
            if isinstance(parent, cst.Element):
                holder = self._kept_by_file_class(self.parents.get(id(parent)), cls, methods)
                if holder is not None:
                    self._holder_uses(holder, function, loop)
                    continue
            raise _Blocked
        return wraps

    def _local_uses(self, symbol, function):
        """The Name nodes of the local `symbol` in `function` (not attribute names)."""
        for node in walk(function.body):
            if not (isinstance(node, cst.Name) and self.values.symbol(node) == symbol):
                continue
            parent = self.parents.get(id(node))
            if isinstance(parent, cst.Attribute) and parent.attr is node:
                continue
            if any(isinstance(n, _SCOPES) for n in ancestors(node, self.parents, function)):
                raise _Blocked  # seen from a nested scope
            yield node

    def _seldom(self, node, loop) -> None:
        if any(n is loop for n in ancestors(node, self.parents, None)) \
                and not under_if(node, self.parents, loop):
            raise _Blocked  # read at every iteration: nothing is saved

    def _holder_uses(self, call, function, loop) -> None:
        """The holder (`progress = ProgressMeter(..., [losses], ...)`) is a local of the
        function used only for its methods (which format the meters), and those calls are not
        made at every iteration of `loop`."""
        assign = self.parents.get(id(call))
        if not (isinstance(assign, cst.Assign) and assign.value is call
                and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)):
            raise _Blocked
        for node in self._local_uses(self.values.symbol(assign.targets[0].target), function):
            parent = self.parents.get(id(node))
            if isinstance(parent, cst.AssignTarget) and parent.target is node:
                continue
            if not (isinstance(parent, cst.Attribute) and parent.value is node
                    and isinstance(self.parents.get(id(parent)), cst.Call)
                    and self.parents[id(parent)].func is parent):
                raise _Blocked  # the holder handed on
            self._seldom(node, loop)

    def _str_of(self, node) -> bool:
        arg = self.parents.get(id(node))
        call = self.parents.get(id(arg))
        return (isinstance(arg, cst.Arg) and arg.keyword is None and not arg.star
                and isinstance(call, cst.Call) and isinstance(call.func, cst.Name)
                and call.func.value in ("str", "print") and not self.values.bindings(call.func))

    def _kept_by_file_class(self, literal, cls, methods) -> cst.Call | None:
        """`[a, b, losses]` given to a class of the file whose `__init__` keeps it as an
        attribute that is only iterated, each item formatted or given the meter's methods: the
        holder's construction, or None."""
        arg = self.parents.get(id(literal))
        call = self.parents.get(id(arg))
        if not (isinstance(literal, (cst.List, cst.Tuple)) and isinstance(arg, cst.Arg)
                and isinstance(call, cst.Call)):
            return None
        holders = self.values.classes_of(call)
        init = self._method(holders[0], "__init__") if len(holders) == 1 else None
        if init is None:
            return None
        index = call.args.index(arg)
        param = self._param(init, call, index)
        if param is None:
            return None
        key = (id(holders[0]), id(param), id(cls))
        if key not in self.containers:
            self.containers[key] = self._container(holders[0], init, param, methods)
        return call if self.containers[key] else None

    def _container(self, holder, init, param, methods) -> bool:
        kept = None
        for node in walk(init.body):
            if isinstance(node, cst.Name) and node.value == param.name.value and any(
                    isinstance(b, Parameter) and b.param is param
                    for b in self.values.bindings(node)):
                assign = self.parents.get(id(node))
                if isinstance(assign, cst.Attribute) and assign.attr is node:
                    continue  # `self.meters`: the attribute's name
                if not (isinstance(assign, cst.Assign) and assign.value is node
                        and len(assign.targets) == 1):
                    return False
                kept = self._self_attribute(assign.targets[0].target, holder)
                if kept is None:
                    return False
        if kept is None:
            return False
        for node in walk(self.ctx.module):
            if not (isinstance(node, cst.Attribute) and node.attr.value == kept):
                continue
            if self.values.self_class.get(id(node)) is not holder:
                return False  # read through another receiver: not followed
            if _is_store(node, self.parents):
                continue
            if not self._items_only_shown(node, methods):
                return False
        return True

    def _items_only_shown(self, node, methods) -> bool:
        loop = self.parents.get(id(node))
        if not (isinstance(loop, (cst.For, cst.CompFor)) and loop.iter is node
                and isinstance(loop.target, cst.Name)):
            return False
        owner = self.parents.get(id(loop)) if isinstance(loop, cst.CompFor) else loop
        item = loop.target
        for use in walk(owner):
            if not (isinstance(use, cst.Name) and use.value == item.value) or use is item:
                continue
            parent = self.parents.get(id(use))
            if isinstance(parent, cst.Attribute) and parent.value is use:
                call = self.parents.get(id(parent))
                if parent.attr.value in methods and isinstance(call, cst.Call) \
                        and call.func is parent:
                    continue
                return False
            if isinstance(parent, cst.Attribute) or self._formatted(use) or self._str_of(use):
                continue
            return False
        return True


@transform("TPU513")
class LoggedMeters(Transform):
    uses = frozenset({"bindings", "steps", "values"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self._plan: _Plan | None = None

    def plan(self) -> _Plan:
        if self._plan is None:
            self._plan = _Meters(self.ctx).prove()
        return self._plan

    def statement_triggers(self, source: str) -> set[str]:
        # the statements to see: the calls (their receivers) and the attribute reads wrapped
        words = super().statement_triggers(source)
        if "class " in source and any(w in source for w in self.rule.statement_triggers):
            plan = self.plan()
            words |= plan.receivers | plan.attributes
        else:
            self._plan = _Plan()  # no class of the file or no read: no meter to prove
        return words

    def visit_Call(self, node: cst.Call) -> None:
        if id(node) in self.plan().reads:  # TPU501 leaves to this rule the reads it moves
            self.ctx.handled.add(id(node))

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        found = self.plan().reads.get(id(original))
        if found is None:
            return None
        _, receiver = found
        return deferred_fix(self, original, updated, self.say(
            "meter", code=self.ctx.short(original), name=receiver, helper=DEFERRED,
            value=VALUE))

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        if id(original) not in self.plan().values:
            return None
        if not (self.rule.maps(self.ctx.target) and self.ctx.can_fix(self.rule, None)):
            return None
        self.ctx.helpers_needed.add(VALUE)
        return cst.Call(func=cst.Name(VALUE), args=[cst.Arg(updated)])
