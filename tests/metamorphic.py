"""Spelling must change nothing: the same program under other names, or with more comments and
docstrings, migrates the same, up to that renaming.

Three variants of a source, each a program that means the same:
- `renamed(source, style)`: every name the program binds itself (module-level functions and
  classes, variables, parameters, import aliases, attributes it sets on `self` and reads only
  there) consistently renamed; `style` "neutral" gives `n1, n2, ...`, "cuda" gives names that
  sound like devices, GPUs and loaders (`use_cuda_1`, `gpu_loader_2`, `train_on_gpus_3`).
- `commented(source)`: a trailing comment on every simple statement, a comment line before
  every `def` and `class`, and a docstring in every function and class that has none, all
  speaking of CUDA, GPUs, NCCL and other vendors' types (`# unlike isinstance(m, HQQLinear)`).

The migration of a variant must equal the variant of the migration: `rename(migrate(x)) ==
migrate(rename(x))` (the renaming map applied to the migrated text), and
`strip(migrate(comment(x))) == migrate(x)` with the same findings. Names not renamed: method
names (a class's methods override the framework's: `forward`, `state_dict`), a parameter given
by keyword where the callee is not this file's function, anything the file reads as a string
(`getattr(x, "name")`), dunders and `self`/`cls`.

Used by tests/test_spelling.py (fixtures, rule examples) and benchmarks/spelling_corpus.py
(public scripts).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import libcst as cst

MARK = "tpkmeta"  # in every comment and docstring added: what strip() removes
COMMENTS = (
    f"# {MARK}: runs on cuda gpu with nccl; unlike isinstance(m, HQQLinear) or torch.xpu",
    f"# {MARK}: device loader optimizer mask batch rank backend fp16 half triton",
)
DOCSTRING = (f'"""{MARK}: Moves everything to the CUDA device (GPU only, NCCL backend).\n\n'
             'Raises ValueError("only CUDA device is supported") without a GPU."""')
CUDA_WORDS = ("use_cuda", "gpu_loader", "train_on_gpus", "cuda_device", "is_cuda", "nccl_backend",
              "num_gpus", "fp16_mask", "triton_kernel", "cuda_batch", "rank_of_gpu", "device",
              "optimizer_cuda", "half_state", "xla_device", "gpu_count", "dev", "loader",
              "device_type", "sampler", "fused_cuda", "ckpt_state")
_KEEP = {"self", "cls", "_", "__name__", "__file__", "main"}
# The functions and classes tpukit inserts (`_inputs_to_device`): their own code keeps its
# names when the user's are renamed.
_HELPERS = set(re.findall(r"^(?:def|class) (\w+)", (
    Path(__file__).resolve().parent.parent / "tpukit" / "migrate" / "helpers.py").read_text(),
    re.M))


def _names_read_as_strings(source: str) -> set[str]:
    return set(re.findall(r"""["']([A-Za-z_]\w*)["']""", source))


class _Collect(cst.CSTVisitor):
    """The names this file binds itself, and the names it must keep."""

    def __init__(self) -> None:
        self.bound: list[str] = []
        self.keep: set[str] = set()
        self.self_attrs: set[str] = set()  # assigned on self (`self.x = ...`)
        self.other_attrs: set[str] = set()  # read or set on anything but self
        self.methods: set[str] = set()
        self.keywords: set[str] = set()  # keywords of calls
        self.imported: set[str] = set()
        self._class_depth = 0
        self._function_depth = 0

    def _bind(self, name: str) -> None:
        if name not in self.bound:
            self.bound.append(name)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if self._class_depth and not self._function_depth:
            self.methods.add(node.name.value)  # a nested class is an attribute
        else:
            self._bind(node.name.value)
        self._class_depth += 1

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._class_depth -= 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if self._class_depth and not self._function_depth:
            self.methods.add(node.name.value)
        else:
            self._bind(node.name.value)
        self._function_depth += 1

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._function_depth -= 1

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._targets(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._targets(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._targets(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._targets(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._targets(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._targets(node.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._targets(node.target)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            if alias.asname is None:
                self.imported.add((cst.helpers.get_full_name_for_node(alias.name) or "").split(".")[0])

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            if alias.asname is None:
                self.imported.add(cst.helpers.get_full_name_for_node(alias.name) or "")

    def _targets(self, target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            self._bind(target.value)
        elif isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) \
                and target.value.value == "self":
            # an attribute the file sets on self is its own; one it only reads there
            # (`self.apply(...)`, `self.register_buffer(...)`) is the framework's
            self.self_attrs.add(target.attr.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._targets(element.value)
        elif isinstance(target, cst.StarredElement):
            self._targets(target.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if not (isinstance(node.value, cst.Name) and node.value.value == "self"):
            self.other_attrs.add(node.attr.value)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.keywords.add(node.keyword.value)

    def visit_Global(self, node: cst.Global) -> None:
        for item in node.names:
            self._bind(item.name.value)

    visit_Nonlocal = visit_Global


def rename_map(source: str, style: str) -> dict[str, str]:
    """The renaming `renamed(source, style)` applies: old name -> new name."""
    module = cst.parse_module(source)
    found = _Collect()
    module.visit(found)
    keep = _KEEP | found.methods | found.imported | _names_read_as_strings(source) | _HELPERS
    # A keyword names a parameter; one of this file's functions' parameters may be given by
    # keyword to a callee that is not (a method, an instance), so those parameters stay.
    keep |= found.keywords
    names = [n for n in found.bound if n not in keep and not n.startswith("__")]
    attrs = sorted(found.self_attrs - found.other_attrs - found.methods - keep)
    attrs = [a for a in attrs if not a.startswith("__") and a not in names]
    existing = set(re.findall(r"[A-Za-z_]\w*", source))
    counter = itertools.count(1)

    def fresh(i: int) -> str:
        while True:
            n = next(counter)
            word = f"n{n}" if style == "neutral" else f"{CUDA_WORDS[i % len(CUDA_WORDS)]}_{n}"
            if word not in existing:
                return word

    mapping = {name: fresh(i) for i, name in enumerate(names)}
    mapping.update({f".{a}": fresh(i) for i, a in enumerate(attrs)})
    return mapping


class _Rename(cst.CSTTransformer):
    def __init__(self, mapping: dict[str, str]) -> None:
        self.names = {k: v for k, v in mapping.items() if not k.startswith(".")}
        self.attrs = {k[1:]: v for k, v in mapping.items() if k.startswith(".")}
        self._skip: set[int] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node.name.value not in _HELPERS  # an inserted helper's code is tpukit's

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value not in _HELPERS

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._skip.add(id(node.attr))

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        # (an attribute renamed is read on `self` alone in the source; on another receiver
        # only in code tpukit wrote from it, `model.wte.weight = model.lm_head.weight`)
        if original.attr.value in self.attrs:
            return updated.with_changes(attr=cst.Name(self.attrs[original.attr.value]))
        return updated

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._skip.add(id(node.keyword))

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        for name in _walk_names(node.name):
            self._skip.add(id(name))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is not None:
            for name in _walk_names(node.module):
                self._skip.add(id(name))

    def leave_Name(self, original: cst.Name, updated: cst.Name):
        if id(original) in self._skip:
            return updated
        new = self.names.get(original.value)
        return updated.with_changes(value=new) if new else updated


def _walk_names(node: cst.CSTNode):
    if isinstance(node, cst.Name):
        yield node
    elif isinstance(node, cst.Attribute):
        yield from _walk_names(node.value)
        yield node.attr


# The code a tpukit comment quotes (`# tpukit: removed "scaler.update()": ...`).
_QUOTED = re.compile(r'(# tpukit: \w+ )"(.*?)"(:)')


def apply_renaming(source: str, mapping: dict[str, str]) -> str:
    """`source` with `mapping` applied to its code and to the code tpukit's comments quote."""
    code = cst.parse_module(source).visit(_Rename(mapping)).code
    if "# tpukit:" not in code:
        return code
    names = {k: v for k, v in mapping.items() if not k.startswith(".")}
    attrs = {k[1:]: v for k, v in mapping.items() if k.startswith(".")}

    def words(match: re.Match) -> str:
        quoted = re.sub(r"\bself\.(\w+)\b",
                        lambda m: f"self.{attrs.get(m.group(1), m.group(1))}", match.group(2))
        quoted = re.sub(r"(?<![\w.])([A-Za-z_]\w*)\b",
                        lambda m: names.get(m.group(1), m.group(1)), quoted)
        return f'{match.group(1)}"{quoted}"{match.group(3)}'

    return _QUOTED.sub(words, code)


def renamed(source: str, style: str) -> tuple[str, dict[str, str]]:
    mapping = rename_map(source, style)
    return apply_renaming(source, mapping), mapping


class _Comment(cst.CSTTransformer):
    def __init__(self) -> None:
        self.count = 0

    def _comment(self) -> str:
        self.count += 1
        return COMMENTS[self.count % len(COMMENTS)]

    def leave_SimpleStatementLine(self, original, updated):
        trailing = updated.trailing_whitespace
        if trailing.comment is not None or trailing.whitespace.value:
            return updated  # (a line's own trailing spaces stay as they are)
        return updated.with_changes(trailing_whitespace=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(self._comment())))

    def _def(self, updated):
        body = updated.body
        if isinstance(body, cst.IndentedBlock) and not _has_docstring(body):
            doc = cst.SimpleStatementLine([cst.Expr(cst.SimpleString(DOCSTRING))])
            body = body.with_changes(body=[doc, *body.body])
        leading = [*updated.leading_lines, cst.EmptyLine(comment=cst.Comment(self._comment()))]
        return updated.with_changes(body=body, leading_lines=leading)

    def leave_FunctionDef(self, original, updated):
        return self._def(updated)

    def leave_ClassDef(self, original, updated):
        return self._def(updated)


def _has_docstring(body: cst.IndentedBlock) -> bool:
    first = body.body[0] if body.body else None
    return isinstance(first, cst.SimpleStatementLine) and len(first.body) == 1 \
        and isinstance(first.body[0], cst.Expr) and isinstance(
            first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


def commented(source: str) -> str:
    return cst.parse_module(source).visit(_Comment()).code


class _Strip(cst.CSTTransformer):
    def _def(self, updated):
        body = updated.body
        if isinstance(body, cst.IndentedBlock) and body.body:
            first = body.body[0]
            if isinstance(first, cst.SimpleStatementLine) and len(first.body) == 1 \
                    and isinstance(first.body[0], cst.Expr) \
                    and isinstance(first.body[0].value, cst.SimpleString) \
                    and MARK in first.body[0].value.value:
                body = body.with_changes(body=body.body[1:])
        return updated.with_changes(body=body)

    def leave_FunctionDef(self, original, updated):
        return self._def(updated)

    def leave_ClassDef(self, original, updated):
        return self._def(updated)


_ADDED = re.compile(r"[ \t]*# " + MARK + r":[^\n]*")


def strip_text(text: str) -> str:
    """`text` (a message) without the comments `commented` added."""
    return _ADDED.sub("", text)


def strip(source: str) -> str:
    """`source` without what `commented` added, also where a rewrite carried a comment into
    its own (`# tpukit: removed ...  # tpkmeta: ...`) or onto a line of its own."""
    code = cst.parse_module(source).visit(_Strip()).code
    lines = []
    for line in code.splitlines(keepends=True):
        cut = _ADDED.sub("", line)
        if cut.strip() or not line.strip():
            lines.append(cut)
    return "".join(lines)


# A quote tpukit cut at its length limit (`"self.scaler = torch.amp.GradScaler(...": ...`): where
# it cuts depends on how long the names are.
_CUT = re.compile(r'(# tpukit: \w+ )"[^"\n]*"(:)')


def comparable(source: str) -> str:
    """`source` with the quotes tpukit's comments cut at a length replaced by a mark."""
    return _CUT.sub(r'\1"..."\2', source)
