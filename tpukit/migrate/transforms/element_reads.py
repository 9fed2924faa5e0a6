"""A tensor iterated element by element, each element only read to the host (TPU506).

`''.join(itos[int(i)] for i in y)` over a device tensor: iterating a tensor gives one view per
element (`y[k]`: on XLA a graph with `k` baked in, one compile per position) and `int(i)` reads
each one back (a transfer per element). minGPT's chargpt decodes 500 sampled tokens this way:
466 graphs. When the loop variable is only ever read to the host (`int(i)`, `float(i)`,
`i.item()`, `i.tolist()`), iterating the tensor copied to the host once gives the same values:
the loop then reads host tensors. The copy is made by a helper that leaves what is not a tensor
as it is (a list, a numpy array), so the rewrite is safe wherever the iterable's type is only
likely, not known.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.nodes import find_keyword, is_cpu_device, name_uses
from tpukit.migrate.transforms.base import Transform, transform

HELPER = "_tensor_on_host"  # helpers.py
_CONVERSIONS = ("int", "float", "bool")  # builtins that read a 0-d tensor's value
_READ_METHODS = ("item", "tolist")


@transform("TPU506")
class ElementReads(Transform):
    uses = frozenset({"values"})
    def _only_read_to_host(self, name: str, scopes: list[cst.CSTNode]) -> bool:
        """Is every use of the loop variable `name` in `scopes` a read of its value to the host
        (and is there at least one)? An assignment to it, or any other use, says no."""
        reads = 0
        for node, parent, call in name_uses(name, *scopes):
            if (isinstance(parent, cst.Attribute) and parent.attr is node) or (
                    isinstance(parent, cst.Arg) and parent.keyword is node):
                continue  # `x.i`, `f(i=...)`: another name
            if isinstance(parent, cst.Arg):
                if (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)
                        and call.func.value in _CONVERSIONS and len(call.args) == 1
                        and not self.ctx.values.bindings(call.func)):
                    reads += 1
                    continue
            if isinstance(parent, cst.Attribute) and parent.value is node:
                if (isinstance(call, cst.Call) and call.func is parent and not call.args
                        and parent.attr.value in _READ_METHODS):
                    reads += 1
                    continue
            return False
        return reads > 0

    def _made_on_host(self, expr: cst.BaseExpression) -> bool:
        """A tensor a torch function makes on the CPU: no `device=`, or a CPU one
        (`torch.linspace(0, rate, depth)`, `.split(...)` of it, timm's drop-path rates):
        iterating it reads no device. A name: every value assigned to it is made so."""
        if isinstance(expr, cst.Name):
            assigned = [getattr(b, "value", None) for b in self.ctx.values.bindings(expr)]
            return bool(assigned) and all(v is not None and not isinstance(v, cst.Name)
                                          and self._made_on_host(v) for v in assigned)
        while True:
            if isinstance(expr, cst.Subscript):
                expr = expr.value
            elif (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)
                  and not (self.ctx.values.qualified(expr.func) or "").startswith("torch.")):
                if expr.func.attr.value in ("to", "cuda"):
                    return False  # moved: wherever it was made
                expr = expr.func.value  # `.split(...)`, `.flip(0)`: where its receiver is
            else:
                break
        if not (isinstance(expr, cst.Call)
                and (self.ctx.values.qualified(expr.func) or "").startswith("torch.")):
            return False
        device = find_keyword(expr, "device")
        return device is None or is_cpu_device(device.value)

    def _likely_tensor(self, expr: cst.BaseExpression) -> bool:
        """A tensor by the dataflow, or what a model's method gives (`model.generate(x)[0]`:
        a method of an nn.Module, the module's class maybe in another file); not one a torch
        function made on the CPU."""
        if self._made_on_host(expr):
            return False
        if K.TENSOR in self.ctx.values.kinds(expr):
            return True
        for binding in ([expr] if not isinstance(expr, cst.Name) else
                        [getattr(b, "value", None) for b in self.ctx.values.bindings(expr)]):
            while isinstance(binding, cst.Subscript):
                binding = binding.value
            if (isinstance(binding, cst.Call) and isinstance(binding.func, cst.Attribute)
                    and K.MODULE in self.ctx.values.kinds(binding.func.value)):
                return True
        return False

    def _port(self, iterable: cst.BaseExpression, new_iterable: cst.BaseExpression, target,
              scopes: list[cst.CSTNode], rebuild):
        if (isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name)
                and iterable.func.value == HELPER):
            return None  # ported already (the helper this rule inserts)
        if not isinstance(target, cst.Name) or not self._likely_tensor(iterable):
            return None
        if not self._only_read_to_host(target.value, scopes):
            return None

        def build():
            self.ctx.helpers_needed.add(HELPER)
            self.ctx.need_import("torch")
            return rebuild(cst.Call(cst.Name(HELPER), [cst.Arg(new_iterable)]))

        return self.fix_or_report(iterable, self.say(
            "elements", code=self.ctx.short(iterable), name=target.value), build)

    def leave_For(self, original: cst.For, updated: cst.For):
        if original.orelse is not None:
            return None
        return self._port(original.iter, updated.iter, original.target, [original.body],
                          lambda new: updated.with_changes(iter=new))

    def _leave_comprehension(self, original, updated):
        comp = original.for_in
        if comp.inner_for_in is not None or comp.asynchronous is not None:
            return None
        elements = [original.elt] if not isinstance(original, cst.DictComp) else [
            original.key, original.value]
        parts = [*elements, *comp.ifs]
        return self._port(comp.iter, updated.for_in.iter, comp.target, parts,
                          lambda new: updated.with_changes(
                              for_in=updated.for_in.with_changes(iter=new)))

    leave_ListComp = leave_SetComp = leave_GeneratorExp = leave_DictComp = _leave_comprehension
