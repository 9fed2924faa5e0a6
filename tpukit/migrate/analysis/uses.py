"""How a file uses its values, for values.py: the arguments its calls give each parameter of its
own functions, the classes an expression may be an instance of, where a variable is given (as
a keyword, an attribute's name, a device, a string), argparse options and what their values
become, and constants."""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.bindings import (
    compatible,
    destination,
    expressions,
    positional_params,
    Assigned,
    Defined,
    NOTHING,
    Parameter,
    Scope,
)
from tpukit.migrate.nodes import string_value


class ValueUses:
    """How the file uses its values: what its calls give each parameter, what a variable is
    given as, which options hold a device or a string: a part of Values (values.py)."""

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
        positional = positional_params(function.params)[skip:]
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
        return found | compatible(said, found)

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

    def _calls_of(self) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """id() of each of the file's functions -> the positions in `calls` of the calls that
        reach it (by `_callees`), and of the calls whose name is bound to its definition;
        indexed once, as every question about a function's callers would scan every call."""
        if self._call_index is None:
            by_callee: dict[int, list[int]] = {}
            by_name: dict[int, list[int]] = {}
            for index, (call, scope) in enumerate(self.calls):
                for f, _ in self._callees(call, scope):
                    _add_once(by_callee, id(f), index)
                if isinstance(call.func, cst.Name):
                    for b in self._lookup(scope, call.func.value):
                        if isinstance(b, Defined):
                            _add_once(by_name, id(b.node), index)
            self._call_index = (by_callee, by_name)
        return self._call_index

    def callers_targets(self, function: cst.FunctionDef) -> list[cst.BaseExpression]:
        """What the file's calls of `function` are assigned to (`device = get_device()`)."""
        by_callee, by_name = self._calls_of()
        found = []
        for index in sorted({*by_callee.get(id(function), ()), *by_name.get(id(function), ())}):
            found += self.targets_of.get(id(self.calls[index][0]), [])
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
            for node in expressions(self.module, self.string_uses):
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
            positional = positional_params(function.params)[skip:]
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
        by_callee, _ = self._calls_of()
        return any(id(self.calls[index][0]) in self.device_uses
                   for index in by_callee.get(id(function), ()))

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
        for node in expressions(self.module, ids):
            symbol = self.symbol(node)
            if symbol is not None:
                found.add(symbol)
        return found


def _add_once(index: dict[int, list[int]], key: int, position: int) -> None:
    positions = index.setdefault(key, [])
    if not positions or positions[-1] != position:
        positions.append(position)
