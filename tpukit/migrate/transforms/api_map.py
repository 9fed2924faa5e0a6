"""Table-driven rules: calls of a qualified name, mapped per target in the rule file.

Each entry under `[targets.<target>.calls."<qualified name>"]` may have:
  replace     an expression template for the call (`{0}`, `{1}`: positional arguments' code,
              `{args}`: all arguments' code)
  statements  templates the call becomes when it is a statement of its own
  remove      the call, as a statement of its own, is removed; the text is the comment left
  helper      a function from tpukit.migrate.helpers that `replace` uses
  instead     no rewrite: what to do instead (the finding's fix), or a table of its `cause`
              and `fix` (rules.manual_message)
  value_ok    a `statements`/`remove` entry whose call, used as a value, is right as it is
              (`with torch.tpu.set_eager_mode(m):` is the context manager's own use)
  when        a regular expression the call's source must match for the entry to apply
  file_lacks_group  true: where the file makes no process group of its own (no
              init_process_group call, no NCCL backend named in its code),
              `lacking_statements` (and `lacking_note`) are used instead of `statements`
              (`{call}`: the call's code, `{owner}`: what its function is an attribute of)
  lacking_in_package  true: in a package module (library code) the lacking form is used
              whatever the file says
  otherwise   the finding's fix (or table, as `instead`) for a call `when` does not match
              (no rewrite)
  as_device   the `replace` template where the call's value is used as a device (`.to(...)`,
              `device=`, `map_location=`, a `device_map` dict; `as_device_note`: its note)
  as_type     the `replace` template where only the value's `.type` is read
              (`current_accelerator().type`: the string "xla", which starts nothing;
              `as_type_note`: its note)
  gpu_count   no rewrite where the value is stored in a variable that scales something
              (`batch_size * n_gpu`): the finding's cause (or table, as `instead`)
  per_process the `replace` template for the call floor-divided as a whole (`device_count()
              // local_world_size`: the host's devices shared among its processes), where the
              target's own count is already one process's (`per_process_note`: its note)
  before_launch  the `replace` template to use instead in a launcher's scope (the function or
              top level that calls mp.spawn / torch_xla.launch), where the XLA runtime must
              not be initialised yet (`before_launch_note`: its note, `before_launch_helper`:
              its helper)
"""

from __future__ import annotations

import re

import libcst as cst

from tpukit.findings import FixKind, Message
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.context import dotted, string_value
from tpukit.migrate.analysis.unported import unported_cuda_call
from tpukit.migrate.nodes import walk
from tpukit.migrate.transforms.base import StatementPlan, Transform, engine
from tpukit.rules import manual_message


@engine("call-map")
class CallMap(Transform):
    uses = frozenset({"unported", "values"})
    table_keys = frozenset({"calls"})
    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.calls: dict[str, dict] = self.mapping.get("calls", {})
        self.as_device = any("as_device" in entry for entry in self.calls.values())
        self.device_arguments: set[int] = set()  # id() of expressions used as a device
        self.as_type = any("as_type" in entry for entry in self.calls.values())
        self.type_reads: set[int] = set()  # id() of calls rewritten with what encloses them
        self.module_names: set[int] = set()  # id() of getattr's attribute-name arguments
        # id() of the calls given to a CUDA-only call no rule ports: they stay CUDA's
        # (`get_device_properties(torch.cuda.current_device())`: an XLA index there would name
        # CUDA device 0)
        self.unported: set[int] = set()
        # id() of what runs only where the process group's backend is not XLA's (the branch
        # a backend test keeps for the others, as the lacking form of TPU407 writes it)
        self.not_xla: set[int] = set()

    def _entry(self, call: cst.BaseExpression,
               report_otherwise: bool = False) -> tuple[str, dict] | tuple[None, None]:
        if type(call) is not cst.Call:  # (every rule of this engine asks, of every node)
            return None, None
        name = self.ctx.qualify(call.func)
        entry = self.calls.get(name) if name else None
        if entry is None:
            return None, None
        if "when" in entry and not re.search(entry["when"], self.ctx.code(call)):
            if report_otherwise and "otherwise" in entry:
                self._manual(call, entry["otherwise"])
            return None, None
        return name, entry

    def _describe(self, call: cst.Call, new: str, entry: dict) -> Message:
        """`call` -> `new`, with the entry's note (else the rule's message) as the cause."""
        note = entry.get("note") or self.rule.message_for(self.ctx.target) or self.rule.summary
        return Message(f"`{self.ctx.short(call)}` -> `{new}`", note)

    def _manual(self, call: cst.Call, text: str | dict | Message) -> None:
        """Report `call` as left for a person: `text` is an entry's own (`instead`, `otherwise`:
        the fix to make, or a table of cause and fix) or a message of
        rules/engines/call-map.toml in parts (what `call` is follows it)."""
        if not isinstance(text, Message):
            text = manual_message(text)
        head = Message(f"`{self.ctx.short(call)}`: " if text.what else f"`{self.ctx.short(call)}`")
        self.ctx.report(self.rule, call, head + text, False, fix=FixKind.NONE)

    def _format(self, template: str, call: cst.Call) -> str:
        positional = [self.ctx.code(a.value) for a in call.args if a.keyword is None]
        everything = ", ".join(self.ctx.code(a).rstrip(", ") for a in call.args)
        if "{call}" not in template and "{owner}" not in template:
            return template.format(*positional, args=everything)
        owner = (self.ctx.code(call.func.value) if isinstance(call.func, cst.Attribute)
                 else (self.ctx.qualify(call.func) or "").rpartition(".")[0])
        return template.format(*positional, args=everything, call=self.ctx.code(call),
                               owner=owner)

    def visit_Expr(self, node: cst.Expr):
        name, entry = self._entry(node.value)
        if entry is None or not ("statements" in entry or "remove" in entry):
            return None
        call = node.value
        if "remove" in entry:
            if entry.get("library_keeps"):
                if self.library_leaves(call, "kept_call", lambda: self.say(
                        "library_kept", call=self.ctx.short(call))):
                    return None  # a no-op without CUDA: on a TPU host it does what it did
            note = f'removed "{self.ctx.short(call)}": {entry["remove"]}'
            plan = self.fix_or_report(
                call, self.say("removed", call=self.ctx.short(call), why=entry["remove"]),
                lambda: StatementPlan([], note),
            )
        else:
            statements = entry["statements"]
            if entry.get("file_lacks_group") and (
                    not self._makes_group()
                    or (entry.get("lacking_in_package") and self.ctx.package_module)):
                statements = entry["lacking_statements"]
                entry = {**entry, "note": entry.get("lacking_note", entry.get("note"))}
            texts = [self._format(t, call) for t in statements]
            plan = self.fix_or_report(
                call, self._describe(call, "; ".join(texts), entry),
                lambda: StatementPlan([self.ctx.statement(t) for t in texts]),
            )
        return plan

    def _makes_group(self) -> bool:
        """Does the file make a process group of its own (an init_process_group call, or an
        NCCL backend named in its code: a value, not a comment)?"""
        def compute() -> bool:
            values = self.ctx.values
            if values.calls_any({"torch.distributed.init_process_group"}):
                return True
            return any(isinstance(n, cst.SimpleString) and (string_value(n) or "").lower()
                       in ("nccl", "cuda:nccl", "cuda:nccl,cpu:gloo", "cpu:gloo,cuda:nccl")
                       for n in walk(self.ctx.module))
        return self.ctx.memo("makes_group", compute)

    def _mark_device_arguments(self, node: cst.Call) -> None:
        """Remember the arguments of `node` that take a device, for the calls inside them."""
        func = node.func
        # x.to(d), x.cuda(d), torch.device(d), send_to_device(batch, d): the first arguments
        moves = isinstance(func, cst.Attribute) and func.attr.value in ("to", "cuda")
        # a function of the file that moves what it is given to the device it is given
        self.device_arguments.update(id(a) for a in self.ctx.values.device_parameters_given(node))
        position = K.DEVICE_ARGUMENT_CALLS.get(self.ctx.qualify(func) or "")
        if position is not None and len(node.args) > position and not node.args[position].keyword:
            self.device_arguments.add(id(node.args[position].value))
        for i, arg in enumerate(node.args):
            if (arg.keyword is None and not arg.star and i == 0
                    and (moves or self.ctx.qualify(func) == "torch.device")) or (
                    arg.keyword is not None and arg.keyword.value in DEVICE_KEYWORDS):
                self.device_arguments.add(id(arg.value))
                if isinstance(arg.value, cst.Dict):  # device_map={"": ...}
                    self.device_arguments.update(
                        id(e.value) for e in arg.value.elements if isinstance(e, cst.DictElement))

    def visit_IfExp(self, node: cst.IfExp) -> None:
        # `xm.rendezvous("barrier") if dist.get_backend() == "xla" else dist.barrier()`: the
        # branch for the other backends runs the call as written, where it means what it says
        test = node.test
        if (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
                and isinstance(test.left, cst.Call)
                and self.ctx.qualify(test.left.func) == "torch.distributed.get_backend"):
            target = test.comparisons[0]
            if isinstance(target.comparator, cst.SimpleString) and \
                    target.comparator.evaluated_value == "xla":
                if isinstance(target.operator, cst.Equal):
                    self.not_xla.update(map(id, walk(node.orelse)))
                elif isinstance(target.operator, cst.NotEqual):
                    self.not_xla.update(map(id, walk(node.body)))

    def visit_Assign(self, node: cst.Assign) -> None:
        # `device_map = {"": torch.cuda.current_device()}` (transformers' quantizers): a
        # device_map's values are devices, where an index names a CUDA device
        if self.as_device and isinstance(node.value, cst.Dict) and any(
                self.ctx.values.given_as(t.target, "device_map") for t in node.targets):
            self.device_arguments.update(id(e.value) for e in node.value.elements
                                         if isinstance(e, cst.DictElement))

    def visit_Return(self, node: cst.Return) -> None:
        # def get_device(...): return torch.cuda.current_device(): what it returns is a device
        function = self.ctx.functions[-1] if self.ctx.functions else None
        if (self.as_device and node.value is not None and isinstance(function, cst.FunctionDef)
                and self.ctx.values.returned_as_device(function)):
            self.device_arguments.add(id(node.value))

    def _targets(self) -> list[cst.BaseExpression]:
        return self.ctx.assign_targets[-1] if self.ctx.assign_targets else []

    def _held_name(self) -> str | None:
        """The target of the enclosing assignment that the file reads as an attribute name
        (`getattr(torch, device_type)`), as written."""
        held = [t for t in self._targets() if self.ctx.values.used_as_attribute_name(t)]
        return self.ctx.short(held[0]) if held else None

    def _held(self, call: cst.Call, held: str, new: str) -> None:
        """`held` is read as an attribute name (`getattr(torch, device_type)`, diffusers'
        `getattr(torch, current_accelerator().type)`: torch.cuda): `new` names no module."""
        self._manual(call, self.say("attribute_name", held=held, new=new))

    def visit_Attribute(self, node: cst.Attribute):
        """`current_accelerator().type` becomes the type's name (the whole attribute)."""
        if not (self.as_type and node.attr.value == "type" and isinstance(node.value, cst.Call)):
            return None
        name, entry = self._entry(node.value)
        if entry is not None and id(node) in self.module_names:
            # diffusers' group offloading: `getattr(torch, current_accelerator().type)` is
            # the accelerator's torch module (torch.cuda); torch has no `xla` module.
            self.type_reads.add(id(node.value))
            self._held(node.value, self.ctx.short(node), entry["as_type"])
            return None
        if entry is None or "as_type" not in entry or self._held_name() is not None:
            return None  # getattr(torch, device_type): visit_Call says why it is left
        self.type_reads.add(id(node.value))
        new = entry["as_type"]
        note = entry.get("as_type_note", entry.get("note"))
        return self.fix_or_report(node.value, self._describe(node, new, {"note": note}),
                                  lambda: self.ctx.expr(new))

    def visit_BinaryOperation(self, node: cst.BinaryOperation):
        """`torch.cuda.device_count() // local_world_size` (pytorch/examples' DDP demo: the
        GPUs of one of the host's processes, which then become its device indices): on XLA a
        process addresses only its own devices, so its count is already the share; divided
        again it would be 0 and the device list empty."""
        if not isinstance(node.operator, cst.FloorDivide) or isinstance(
                node.right, (cst.Integer, cst.Float)):
            return None  # `// 2`: pairs of devices, a share of the count, not the processes'
        name, entry = self._entry(node.left)
        if entry is None or "per_process" not in entry or self._held_name() is not None:
            return None
        if self.ctx.at_import_time() or self.ctx.in_launcher() or (
                entry.get("library_keeps") and self.ctx.owner_leaves(
                    self.rule.extra.get("engine", self.rule.code), "cuda_query")):
            return None  # visit_Call says what the call becomes there
        self.type_reads.add(id(node.left))
        new = entry["per_process"]
        note = entry.get("per_process_note", entry.get("note"))
        return self.fix_or_report(node, self._describe(node, new, {"note": note}),
                                  lambda: self.ctx.expr(new))

    def _inside_unported(self, node: cst.Call) -> None:
        """The calls given to `node`, which stay CUDA's; spoken for by the finding on `node`
        (no TPU117 for each). A set of ids, not a stack: a node another rule plans gets no
        leave hooks."""
        for inner in walk(*node.args):
            if isinstance(inner, cst.Call):
                self.unported.add(id(inner))
                self.ctx.handled.update((id(inner), id(inner.func)))

    def visit_Call(self, node: cst.Call):
        if id(node) in self.unported or id(node) in self.not_xla:
            return None
        if isinstance(node.func, cst.Attribute) and unported_cuda_call(
                self.ctx.target, self.ctx.qualify(node.func)):
            self._inside_unported(node)
        if self.as_device:
            self._mark_device_arguments(node)
        if self.as_type and dotted(node.func) == "getattr" and len(node.args) >= 2:
            self.module_names.add(id(node.args[1].value))
        if id(node) in self.type_reads:
            return None  # its `.type` was rewritten as a whole (visit_Attribute)
        name, entry = self._entry(node, report_otherwise=True)
        if entry is None:
            return None
        if "replace" not in entry:
            if entry.get("value_ok"):
                return None
            text = entry.get("instead")
            if text is None:  # statement-only entry used as a value
                text = (self.say("value_removed", why=entry["remove"]) if entry.get("remove")
                        else self.say("value"))
            self._manual(node, text)
            return None
        template = entry["replace"]
        if entry.get("library_keeps") and not (
                "as_device" in entry and id(node) in self.device_arguments):
            # lightning's RunIf(bf16_cuda=True): `not (torch.cuda.is_available() and
            # torch.cuda.is_bf16_supported())` read the XLA runtime and ran CUDA tests on a
            # TPU host (and on a CPU host with torch_xla)
            if self.library_leaves(node, "cuda_query", lambda: self.say(
                    "library_query", call=self.ctx.short(node))):
                return None
        held = self._held_name()
        if held:  # device_type = ...; getattr(torch, device_type): a module's name
            self._held(node, held, self._format(template, node))
            return None
        if "as_device" in entry and id(node) in self.device_arguments:
            template = entry["as_device"]
            entry = {**entry, "note": entry.get("as_device_note", entry.get("note"))}
        elif "before_launch" in entry and (self.ctx.in_launcher() or any(
                self.ctx.values.is_process_count(t) for t in self._targets())):
            # accelerate's launch command: `args.num_processes = torch.cuda.device_count()` is
            # how many processes a launcher (in another module) will start
            template = entry["before_launch"]
            entry = {**entry, "note": entry.get("before_launch_note", entry.get("note")),
                     "helper": entry.get("before_launch_helper")}
        elif "gpu_count" in entry and any(
                self.ctx.values.uses_of(K.SCALE, t) for t in self._targets()):
            # `n_gpu = ...` that scales a batch size (`batch_size * n_gpu`)
            self._manual(node, manual_message(entry["gpu_count"], "cause"))
            return None
        elif self.ctx.at_import_time() and STARTS_RUNTIME.search(template):
            if "before_launch" in entry:  # what runs before torch_xla.launch runs here too
                template = entry["before_launch"]
                entry = {**entry, "note": self.say("import_time_launch",
                                                   note=entry.get("note", "")),
                         "helper": entry.get("before_launch_helper")}
            else:
                reason = self.ctx.import_time_reason()
                new = self._format(template, node)
                self._manual(node, self.say("import_time_because", new=new, reason=reason)
                             if reason else self.say("import_time", new=new))
                return None
        new = self._format(template, node)

        def build():
            if entry.get("helper"):
                self.ctx.helpers_needed.add(entry["helper"])
            return self.ctx.expr(new)

        replacement = self.fix_or_report(node, self._describe(node, new, entry), build)
        if replacement is not None and name in GUARDS:
            self.ctx.add_guard(replacement, node)
        return replacement

# Calls whose value decides whether code runs: an availability test, and a count (`if
# torch.cuda.device_count() > 1:`, `for i in range(torch.cuda.device_count()):`).
GUARDS = {"torch.cuda.is_available", "torch.accelerator.is_available", "torch.cuda.device_count",
          "torch.accelerator.device_count"}
DEVICE_KEYWORDS = ("device", "map_location", "device_map")
# torch_xla calls that start the runtime (xr.device_type() only reads the environment).
STARTS_RUNTIME = re.compile(r"torch_xla\.device(?:_count)?\(|\bxm\.|\bxr\.(?!device_type\()")
