"""TPU101 cuda-device: A CUDA device becomes the XLA device.

Its messages and tables: rules/TPU101-cuda-device.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.findings import FixKind
from tpukit.migrate.analysis import catalog as K
from tpukit.migrate.analysis.bindings import destination as _option_destination
from tpukit.migrate.context import find_keyword, is_cpu_device, is_cuda_device_string, string_value
from tpukit.migrate.device_facts import is_accelerator_value, is_availability_test
from tpukit.migrate.transforms.base import Transform, transform
from tpukit.migrate.transforms.devices.common import (
    device_string,
    holds_a_device_string,
    need_device_module,
)


def _texts_around_a_device(parts) -> bool:
    """f"{'cuda' if c else 'cpu'}" and f"{...}:{rank}" name a device; the text of
    f"{...}_time_total" (a profiler sort key) says it is a name of something else."""
    return all(p.value in ("", ":") for p in parts if isinstance(p, cst.FormattedStringText))


@transform("TPU101")
class CudaDevice(Transform):
    uses = frozenset({"bindings", "device_facts", "values"})

    def statement_triggers(self, source: str) -> set[str]:
        """`.to(` and `device(`: a number given as a device (`.to(gpu_ids[0])`) names CUDA."""
        return super().statement_triggers(source) | {".to(", "device("}
    # read by device_facts.DeviceFacts: the device every rule writes
    table_keys = frozenset({"at_import", "device_type", "imports", "move_to"})

    def __init__(self, rule, ctx) -> None:
        super().__init__(rule, ctx)
        self.not_devices: set[int] = set()  # id() of expressions that build a non-device name
        self.choices: set[int] = set()  # id() of the CUDA-or-CPU choices visit_IfExp said
        self._returned: dict[int, cst.CSTNode] = {}  # id(IfExp returned) -> its function
        self._keywords: dict[int, str] = {}  # id(IfExp given by keyword or dict key) -> the key
        self.argparse_defaults: set[int] = set()  # id() of `add_argument(default=...)` values

    def _to_xla_device(self, node: cst.CSTNode):
        message = self.say("object", code=self.ctx.short(node))
        device = self.ctx.device_object
        if self.ctx.at_import_time() and device != self.ctx.device_object_in_code:
            message += self.say("object_at_import", device=device)
        return self.fix_or_report(node, message, lambda: self.ctx.expr(device))

    def _string_to_xla(self, node: cst.BaseExpression, context: str):
        """`context`: where the string stands, a message (`self.say("in_setting")`)."""
        def build():
            need_device_module(self.ctx)
            return device_string(self.ctx, node)

        return self.fix_or_report(
            node, self.say("string", code=self.ctx.short(node), context=context), build)

    def visit_Call(self, node: cst.Call):
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument":
            default = find_keyword(node, "default")
            if default is not None:
                self.argparse_defaults.add(id(default.value))
        if self.ctx.qualify(node.func) != "torch.device" or not node.args:
            return None
        first = node.args[0].value
        if len(node.args) == 1 and node.args[0].keyword is None and self._device_index(first):
            return self._to_xla_device(node)  # torch.device(0): CUDA's device 0
        whole = is_cuda_device_string(first) or (
            isinstance(first, cst.IfExp)
            and is_availability_test(self.ctx, first.test)
            and is_accelerator_value(self.ctx, first.body)
            and is_cpu_device(first.orelse)
        )
        if whole and isinstance(first, cst.IfExp) and self._library_choice(node):
            return None
        return self._to_xla_device(node) if whole else None

    def _library_choice(self, node: cst.CSTNode) -> bool:
        """`"cuda" if torch.cuda.is_available() else "cpu"` in library code: the CPU on a
        TPU host, as before (transformers' SageMaker arguments put the Trainer on XLA)."""
        return self.library_leaves(node, "cuda_or_cpu", lambda: self.say(
            "library_choice", code=self.ctx.short(node)))

    def visit_IfExp(self, node: cst.IfExp):
        if (
            is_availability_test(self.ctx, node.test)
            and is_accelerator_value(self.ctx, node.body)
            and is_cpu_device(node.orelse)
        ):
            self.choices.add(id(node))  # said here, whole: leave_IfExp leaves its parts
            if self._library_choice(node):
                return None
            kept = self._kept_as_string(node)
            return self._to_xla_device(node) if kept is None else self._string_choice(node, kept)
        return None

    # -- a device choice of strings that the script reads as a string ---------------------
    # `device = "cuda" if torch.cuda.is_available() else "cpu"` holds a string. Where the file
    # compares it as one (`if device == "cuda":`, which becomes `== "xla"`), it must stay a
    # string: `torch_xla.device() == "xla"` is False and the guarded code never runs.
    def _read_back_as(self, node: cst.IfExp) -> list[cst.BaseExpression]:
        """The variables a choice is read back as: what it is assigned to, and what the
        calls of a function that returns it are assigned to."""
        values = self.ctx.values
        found = list(values.assigned_to(node))
        function = self._returned.get(id(node))
        if isinstance(function, cst.FunctionDef):
            found += values.callers_targets(function)
        return found

    def visit_Return(self, node: cst.Return):
        if isinstance(node.value, cst.IfExp) and self.ctx.functions:
            self._returned[id(node.value)] = self.ctx.functions[-1]

    def visit_Arg(self, node: cst.Arg):
        if node.keyword is not None and isinstance(node.value, cst.IfExp):
            self._keywords[id(node.value)] = node.keyword.value

    def visit_DictElement(self, node: cst.DictElement):
        key = string_value(node.key)
        if key is not None and isinstance(node.value, cst.IfExp):
            self._keywords[id(node.value)] = key  # `{"device": ...}`, read as `cfg["device"]`

    def _kept_as_string(self, node: cst.IfExp) -> str | None:
        """Why this choice of device strings stays a string, or None when it may become the
        device object: an argparse default (what the command line gives is a string too), or
        a variable it is read back as that the file uses as a string."""
        if not isinstance(node.body, (cst.SimpleString, cst.FormattedString)):
            return None  # `torch.device("cuda") if ... else ...`: an object already
        if id(node) in self.argparse_defaults:
            return self.say("kept_default")
        values = self.ctx.values
        used = next((t for t in self._read_back_as(node) if values.used_as_string(t)), None)
        if used is not None:
            return self.say("kept_used", name=self.ctx.short(used))
        keyword = self._keywords.get(id(node))
        if keyword is not None and values.key_used_as_string(keyword):
            # `Config(device=...)` read back as `config.device`, `{"device": ...}` as
            # `cfg["device"]`, and compared as a string
            return self.say("kept_used", name=keyword)
        return None

    def _string_choice(self, node: cst.IfExp, why: str):
        def build():
            need_device_module(self.ctx)
            return device_string(self.ctx, node.body)

        return self.fix_or_report(
            node, self.say("kept_string", code=self.ctx.short(node), why=why), build)

    def visit_FormattedString(self, node: cst.FormattedString):
        if not _texts_around_a_device(node.parts):
            self.not_devices.update(id(p.expression) for p in node.parts
                                    if isinstance(p, cst.FormattedStringExpression))

    def visit_BinaryOperation(self, node: cst.BinaryOperation):
        # ("cuda" if c else "cpu") + "_time_total": a name built from it, not a device
        if isinstance(node.operator, cst.Add):
            for side, other in ((node.left, node.right), (node.right, node.left)):
                text = string_value(other)
                if text is not None and text not in ("", ":") and not text.startswith(":"):
                    self.not_devices.add(id(side))

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp):
        # `"cuda" if use_cuda else "cpu"`: the user's condition stays, the type becomes xla.
        if id(original) in self.not_devices or id(original) in self.choices:
            return None
        if isinstance(original.body, cst.SimpleString) and is_cuda_device_string(original.body):
            new_body = self._string_to_xla(original.body, self.say("in_choice"))
            if new_body is not None:
                return updated.with_changes(body=new_body)
        return None

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        ctx = self.ctx
        args = list(updated.args)
        changed = False
        is_to = isinstance(original.func, cst.Attribute) and original.func.attr.value == "to"
        is_add_argument = (
            isinstance(original.func, cst.Attribute) and original.func.attr.value == "add_argument"
        )
        for i, (old, new) in enumerate(zip(original.args, updated.args)):
            keyword = old.keyword.value if old.keyword else None
            if is_to and (keyword == "device" or (i == 0 and keyword is None)) \
                    and self._device_index(old.value):
                # `net.to(gpu_ids[0])`: torch reads a number given as a device as CUDA's index
                replacement = self.fix_or_report(old.value, self.say(
                    "index", code=ctx.short(original), index=ctx.short(old.value)),
                    ctx.device_expr)
                if replacement is not None:
                    args[i] = new.with_changes(value=replacement)
                    changed = True
                continue
            if not is_cuda_device_string(old.value):
                continue
            replacement = None
            if keyword == "device" or (is_to and i == 0 and keyword is None):
                replacement = self.fix_or_report(
                    old.value, self.say("argument", code=ctx.short(old.value)), ctx.device_expr)
            elif is_add_argument and keyword == "default" and self._option_holds_device(original):
                replacement = self._string_to_xla(old.value, self.say("in_default"))
            if replacement is not None:
                args[i] = new.with_changes(value=replacement)
                changed = True
        return updated.with_changes(args=args) if changed else None

    def _device_index(self, value: cst.BaseExpression) -> bool:
        """A number (an int literal, an option `type=int`, an element of a list of numbers or
        of what DataParallel is given as device_ids) that is no rank (TPU405 ports those)."""
        kinds = self.ctx.values.kinds(value)
        return K.NUMBER in kinds and not kinds & {
            K.RANK, K.WORLD, K.GPU_COUNT, K.DTYPE, K.TENSOR, K.DEVICE, K.STRING, K.MODULE}

    def _option_holds_device(self, call: cst.Call) -> bool:
        """An argparse option whose default is a CUDA device string holds a device string,
        unless the program gives it where a backend goes, or reads it as an attribute name."""
        dest = _option_destination(call)
        if dest is None or self.ctx.values.option_is_not_a_device(dest):
            return False
        uses = self.ctx.values.option_uses(dest)
        return K.DEVICE in uses or self.ctx.values.option_used_as_string(dest)

    def _assigned_string(self, targets, original_value, updated):
        if not isinstance(original_value, (cst.SimpleString, cst.FormattedString)):
            return None
        if not is_cuda_device_string(original_value):
            return None
        if not all(holds_a_device_string(self.ctx, t) for t in targets) or not any(
                self.ctx.values.used_as_device_string(t) for t in targets):
            return None  # not a device's name, or not used as one
        if self._names_a_module(original_value, targets):
            return None
        new_value = self._string_to_xla(original_value, self.say("in_setting"))
        return None if new_value is None else updated.with_changes(value=new_value)

    def _names_a_module(self, value: cst.BaseExpression, targets) -> bool:
        """`device = "cuda"` read by `getattr(torch, device)`: the string names torch.cuda;
        'xla' would name nothing. Left as it is, for a person."""
        used = [t for t in targets if self.ctx.values.used_as_attribute_name(t)]
        if used:
            self.ctx.report(self.rule, value, self.say(
                "attribute_name", name=self.ctx.short(used[0]), value=self.ctx.code(value)),
                applied=False, fix=FixKind.NONE)
        return bool(used)

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        return self._assigned_string([t.target for t in original.targets], original.value, updated)

    def leave_AnnAssign(self, original: cst.AnnAssign, updated: cst.AnnAssign):
        if original.value is None:
            return None
        return self._assigned_string([original.target], original.value, updated)

    def leave_Param(self, original: cst.Param, updated: cst.Param):
        if original.default is None or not is_cuda_device_string(original.default):
            return None
        if not holds_a_device_string(self.ctx, original.name) or not \
                self.ctx.values.used_as_device_string(original.name):
            return None
        if self._names_a_module(original.default, [original.name]):
            return None
        new_default = self._string_to_xla(original.default, self.say("in_parameter"))
        return None if new_default is None else updated.with_changes(default=new_default)
