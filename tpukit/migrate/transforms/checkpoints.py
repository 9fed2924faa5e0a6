"""Checkpoints: state dicts are saved with xm.save (to CPU, on the master only); loads map
CUDA storage to the CPU."""

from __future__ import annotations

import ast
import re

import libcst as cst

from tpukit.findings import FixKind, Severity
from tpukit.migrate.context import is_cuda_device_string, keyword_arg, terminal_name
from tpukit.migrate.transforms.base import Transform, transform
from tpukit.migrate.transforms.devices import names_a_device

_DICT_ASSIGN = re.compile(r"(\w+)\s*=\s*\{")
_STATE_ASSIGN = re.compile(r"(\w+)\s*=\s*[\w.]+\.state_dict\s*\(")  # ckp = m.module.state_dict()
STATE_WORDS = ("state", "checkpoint", "ckpt", "snapshot")
# A path built from the process's rank (f"rng_state_{rank}.pth", args.process_index, a name
# assigned such a path): every process writes its own file.
_RANK_WORDS = r"rank|process_index|ordinal|local_process|worker_id|proc_id|getpid"
_RANK = re.compile(_RANK_WORDS, re.I)
_ASSIGN_LINE = re.compile(r"^[ \t]*([\w.]+)[ \t]*=(?!=)([^\n]*)", re.M)


def _assignments(source: str) -> list[tuple[str, str]]:
    """(target, value's code) of each assignment to a name or attribute, the value whole
    however many lines it spans (accelerate's fsdp_utils: `weights_name = (` then the rank's
    f-string on the next line)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # syntax libcst reads and this Python does not
        return _ASSIGN_LINE.findall(source)  # each assignment's first line
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = ast.get_source_segment(source, node.value) or ""
            found += [(ast.unparse(t), value) for t in targets
                      if isinstance(t, (ast.Name, ast.Attribute))]
    return found


def rank_path_names(source: str) -> set[str]:
    """Names assigned a path built from the rank, directly or through other such names
    (accelerate: states_name = f"{RNG_STATE_NAME}_{process_index}.pkl", then
    output_states_file = output_dir.joinpath(states_name))."""
    assigns = _assignments(source)
    names = {name for name, value in assigns if _RANK.search(value)}
    while True:
        words = re.compile(r"\b(?:" + "|".join(map(re.escape, names)) + r")\b") if names else None
        more = {name for name, value in assigns if name not in names and words and words.search(value)}
        if not more:
            return names
        names |= more
# loc = 'cuda:{}'.format(args.gpu) / device = "cuda" / dev = torch.device("cuda", rank)
_CUDA_ASSIGN = re.compile(r"""(\w+)\s*=\s*(?:torch\.device\(\s*)?f?['"]cuda\b""")


# random.getstate(), np.random.get_state(): RNG states that are tuples.
_HOST_RNG = re.compile(r"\brandom\.getstate\(\)|\brandom\.get_state\(\)")


def _has_state_dict(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        return expr.func.attr.value == "state_dict"
    if isinstance(expr, cst.Dict):
        return any(isinstance(e, cst.DictElement) and _has_state_dict(e.value) for e in expr.elements)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "dict":
        return any(_has_state_dict(a.value) for a in expr.args)
    return False


def _is_container(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, (cst.Dict, cst.List, cst.Tuple)):
        return True
    return (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name)
            and expr.func.value in ("dict", "list", "tuple"))


@transform("TPU304")
class CheckpointSave(Transform):
    def leave_Call(self, node: cst.Call, updated: cst.Call):
        # A leave hook, so what the arguments hold is rewritten first (a GradScaler's state
        # leaves the checkpoint dict before the dict is saved).
        if self.ctx.qualify(node.func) != "torch.save" or not node.args:
            return None
        obj = node.args[0].value
        extra = [a for a in node.args[2:]] + [a for a in node.args[:2] if a.keyword and a.keyword.value not in ("obj", "f")]
        name = terminal_name(obj).lower()
        dict_names = self.ctx.memo("dict_names", lambda: {
            *_DICT_ASSIGN.findall(self.ctx.source), *_STATE_ASSIGN.findall(self.ctx.source)})
        # A container written in the call (`{"images": t, "labels": u}`, `[a, b]`): xm.save
        # moves the XLA tensors of nested dicts, lists and tuples to the CPU, the rest as is.
        state = _has_state_dict(obj) or _is_container(obj) or (
            isinstance(obj, (cst.Name, cst.Attribute))
            and (terminal_name(obj) in dict_names or any(w in name for w in STATE_WORDS))
        )
        if not state:
            self.ctx.report(self.rule, node, self.say("object", code=self.ctx.short(node)),
                            applied=False, fix=None)
            return None
        if extra:
            return None  # pickle options xm.save does not take: leave it to a person
        if self._saves_host_rng():
            # accelerate's save_accelerator_state: xm.save turns tuples into lists on the way
            # to the CPU, and random.setstate() / np.random.set_state() refuse the list when
            # the file is loaded back (accelerate then silently restores no RNG at all)
            self.ctx.report(self.rule, node, self.say("rng_tuples", code=self.ctx.short(node)),
                            applied=False, fix=FixKind.NONE)
            return None
        if self.ctx.library_code:
            # library code saves as it decides who writes (peft's save_pretrained takes
            # is_main_process; transformers' Trainer has its own XLA branch): xm.save would
            # start the runtime for a model on the CPU (timm's repghost_model_convert, peft,
            # jukebox's alignments) and write on the master only; torch.save writes XLA
            # tensors too
            self.ctx.report(self.rule, node, self.say("library", code=self.ctx.short(node)),
                            applied=False, fix=FixKind.NONE, severity=Severity.INFO)
            return None
        if self._per_rank(node):
            # xm.save writes on the master only: the other ranks' files would never be written.
            return self.fix_or_report(node, self.say("per_rank", code=self.ctx.short(node)),
                                      lambda: self._save_everywhere(node, updated))
        return self.fix_or_report(
            node, self.say("save", code=self.ctx.short(node)),
            lambda: self.ctx.with_func(node, updated, self.ctx.expr("xm.save")))

    def _saves_host_rng(self) -> bool:
        """Does the enclosing function (or the module) read Python's or NumPy's RNG state (a
        tuple) for what it saves?"""
        return bool(_HOST_RNG.search(self.ctx.scope_text()))

    def _per_rank(self, node: cst.Call) -> bool:
        path = node.args[1].value if len(node.args) > 1 else None
        if path is None:
            return False
        if _RANK.search(self.ctx.code(path)):
            return True
        names = self.ctx.memo("rank_paths", lambda: rank_path_names(self.ctx.source))
        return self.ctx.code(path) in names

    def _save_everywhere(self, node: cst.Call, updated: cst.Call) -> cst.Call:
        call = self.ctx.with_func(node, updated, self.ctx.expr("xm.save"))
        args = list(call.args)
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return call.with_changes(args=[*args, keyword_arg("master_only", cst.Name("False"))])


@transform("TPU305")
class LoadMapLocation(Transform):
    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) != "torch.load":
            return None
        for i, arg in enumerate(original.args):
            keyword = arg.keyword.value if arg.keyword else None
            if keyword != "map_location" and not (keyword is None and i == 1):
                continue
            value = arg.value
            if isinstance(value, cst.IfExp) and is_cuda_device_string(value.body):
                value_is_cuda = True  # "cuda" if use_cuda else "cpu": the CPU is right for both
            else:
                value_is_cuda = False
            cuda = value_is_cuda or is_cuda_device_string(value) or isinstance(value, (cst.Dict, cst.Lambda)) or (
                isinstance(value, cst.Call) and self.ctx.qualify(value.func) == "torch.device"
                and value.args and is_cuda_device_string(value.args[0].value))
            held = not cuda and self._holds_device(value)
            if not (cuda or held):
                return None

            def build(i=i):
                args = list(updated.args)
                args[i] = args[i].with_changes(value=cst.SimpleString('"cpu"'))
                return updated.with_changes(args=args)

            where = self.say("held_device") if held else self.say("cuda_device")
            return self.fix_or_report(
                value, self.say("map_location", code=self.ctx.short(value), where=where), build)
        return None

    def _holds_device(self, value: cst.BaseExpression) -> bool:
        """A variable holding the device: named so (`device`, `dev`), or assigned a CUDA device
        string in this file (`loc = "cuda:{}".format(gpu)`). After the port it holds the TPU,
        which torch.load cannot map storage to."""
        if not isinstance(value, (cst.Name, cst.Attribute)):
            return False
        cuda_names = self.ctx.memo("cuda_string_names",
                                   lambda: set(_CUDA_ASSIGN.findall(self.ctx.source)))
        return names_a_device(value) or terminal_name(value) in cuda_names
