"""Kinds by dataflow, for values.py: the kinds of an expression from the APIs that make it and
the assignments, attributes, parameters, returns, argparse defaults and conditionals that carry
it, and what the uses of a value say it is. Computed on demand and memoized; a cycle (`x = x +
1`) reads as nothing known."""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.bindings import (
    absolute_import,
    compatible,
    is_none,
    is_static,
    Assigned,
    Defined,
    Imported,
    Iterated,
    NOTHING,
    Parameter,
    Returns,
)
from tpukit.migrate.nodes import dotted, is_cpu_device, is_cuda_device_string, scan, string_value


class ValueKinds:
    """What kind of value an expression holds: a part of Values (values.py), reading the
    bindings it records."""

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
            if expr.elements and all(not isinstance(e, cst.StarredElement) and K.NUMBER in
                                     self.kinds(e.value) for e in expr.elements):
                found |= {K.NUMBERS}  # `[0, 1]`
            return found
        if isinstance(expr, cst.ListComp):
            # `[int(s) for s in ids.split(",")]`
            return frozenset({K.CONTAINER}) | (
                {K.NUMBERS} if K.NUMBER in self.kinds(expr.elt) else NOTHING)
        if isinstance(expr, (cst.Dict, cst.DictComp)):
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
        return compatible(said, found)

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
            if isinstance(iterable.func, cst.Attribute) and not iterable.args:
                # a module's parameters (nn.Module's API): `for p in m.parameters()`, `for n, p
                # in m.named_parameters()`: the tensors themselves
                method = iterable.func.attr.value
                if method in ("parameters", "buffers") and not path:
                    return frozenset({K.TENSOR})
                if method in ("named_parameters", "named_buffers") and path == (1,):
                    return frozenset({K.TENSOR})
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
        if param.default is not None and not is_none(param.default):
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
        if cls is not None and binding.index == 0 and not is_static(binding.function):
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
                ids = self._device_ids_given(call, qualified)
                if ids is not None and not isinstance(ids, (cst.List, cst.Tuple)):
                    uses.append((ids, K.NUMBERS))  # `DataParallel(net, gpu_ids)`
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
            if func.value in ("list", "tuple", "sorted") and not self.bindings(func) \
                    and call.args and self._gives_numbers(call.args[0].value):
                return frozenset({K.CONTAINER, K.NUMBERS})  # list(range(n)), list(map(int, s))
            if func.value == "range" and not self.bindings(func):
                return frozenset({K.NUMBERS})
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
        if (K.NUMBERS in base or K.NUMBER in base) and len(expr.slice) == 1:
            # `gpu_ids[0]`: an element of numbers (an option `type=int, nargs="+"` holds a
            # list of numbers); `ids[1:]`: numbers
            if isinstance(expr.slice[0].slice, cst.Index):
                return frozenset({K.NUMBER})
            return frozenset({K.CONTAINER, K.NUMBERS})
        return self._said(expr, NOTHING)  # a dict's entry, by what is done with it

    @staticmethod
    def _device_ids_given(call: cst.Call, qualified: str) -> cst.BaseExpression | None:
        """What a DataParallel/DDP call is given as its CUDA device indices."""
        given = next((a.value for a in call.args if a.keyword is not None
                      and a.keyword.value == "device_ids"), None)
        position = K.DEVICE_IDS_POSITION.get(qualified)
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if given is None and position is not None and len(positional) > position:
            given = positional[position].value
        return given

    def _gives_numbers(self, expr: cst.BaseExpression) -> bool:
        """Does `expr` give numbers when iterated: numbers, or `map(int, ...)`?"""
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) \
                and expr.func.value == "map" and not self.bindings(expr.func) and expr.args \
                and isinstance(expr.args[0].value, cst.Name) \
                and expr.args[0].value.value in ("int", "float") \
                and not self.bindings(expr.args[0].value):
            return True
        return K.NUMBERS in self.kinds(expr)

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
            finder = Returns(function)
            scan(function.body, finder)
            for returned in finder.values:
                if not isinstance(returned, (cst.Tuple, cst.List)) or index >= len(
                        returned.elements) or any(isinstance(e, cst.StarredElement)
                                                  for e in returned.elements):
                    return None
                elements.append(returned.elements[index].value)
        return elements

    def _returns(self, function: cst.FunctionDef) -> frozenset[str]:
        finder = Returns(function)
        scan(function.body, finder)
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
