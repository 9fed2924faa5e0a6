"""A sampler that grows its sequence with `torch.cat` (TPU503's port).

minGPT's, nanoGPT's and makemore's `generate` run

    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]
        ...                                   # the model on idx_cond, the next token
        idx = torch.cat((idx, idx_next), dim=1)

`idx` is longer every iteration, so on XLA every iteration is a graph of a new shape (the
crop reads the whole of `idx`): one compile per token, or with no barrier one lazy graph of
every token that never finishes compiling. The port keeps what the loop computes and changes
where the tokens are kept: the model reads a window of at most `block_size` tokens that
stops growing once full, the new tokens are collected, and `idx` is made once after the loop:

    _tpukit_window = idx
    _tpukit_parts = [idx]
    for _ in range(max_new_tokens):
        idx_cond = _tpukit_window if _tpukit_window.size(1) <= block_size else ...
        ...
        _tpukit_parts.append(idx_next)
        _tpukit_window = torch.cat((_tpukit_window, idx_next), dim=1)
        _tpukit_window = _tpukit_window if _tpukit_window.size(1) <= block_size else _tpukit_window[:, -block_size:]
        torch_xla.sync()
    idx = torch.cat(_tpukit_parts, dim=1)

The same operations on the same values: the same tokens for the same seed. The graphs: one
per context length until the window is full (at most `block_size` of them, however many
tokens are drawn), then one. Only this shape is ported: the grown tensor read nowhere in
the loop but by the crop and the `cat`, the crop `x[:, -B:]` (alone or behind `x.size(1) <=
B`), the `cat` the loop's last statement. Any other growing `cat` is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from tpukit.migrate.analysis.steps import is_barrier
from tpukit.migrate.nodes import children, walk

CATS = frozenset({"torch.cat", "torch.concat", "torch.concatenate"})
WINDOW, PARTS = "_tpukit_window", "_tpukit_parts"
_EMPTY = cst.Module(body=[])


@dataclass
class Sampler:
    grown: str  # the sequence's variable (`idx`)
    token: str  # what each iteration appends (`idx_next`)
    bound: cst.BaseExpression  # the crop's length (`block_size`)
    crop: cst.BaseExpression  # `idx if idx.size(1) <= B else idx[:, -B:]` or `idx[:, -B:]`
    bare: bool  # the crop is a whole assigned value or argument (needs no parentheses)
    cat: cst.SimpleStatementLine  # `idx = torch.cat((idx, idx_next), dim=1)`


def _single_assign(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 \
            and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1 \
            and isinstance(stmt.body[0].targets[0].target, cst.Name):
        return stmt.body[0].targets[0].target.value, stmt.body[0].value
    return None


def _is_int(expr: cst.BaseExpression | None, value: int) -> bool:
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        return _is_int(expr.expression, -value)
    return isinstance(expr, cst.Integer) and expr.evaluated_value == value


def _grows(call: cst.BaseExpression, qualify) -> tuple[str, str] | None:
    """`torch.cat((x, y), dim=1)` (or `[x, y]`, `1` given by position): (x, y)."""
    if not (isinstance(call, cst.Call) and qualify(call.func) in CATS and call.args):
        return None
    parts, *rest = call.args
    if parts.keyword is not None or parts.star or not isinstance(parts.value, (cst.Tuple, cst.List)):
        return None
    elements = parts.value.elements
    if len(elements) != 2 or any(isinstance(e, cst.StarredElement) for e in elements) \
            or not all(isinstance(e.value, cst.Name) for e in elements):
        return None
    if len(rest) != 1 or rest[0].star or (rest[0].keyword is not None
                                          and rest[0].keyword.value != "dim") \
            or not _is_int(rest[0].value, 1):
        return None
    grown, token = elements[0].value.value, elements[1].value.value
    return (grown, token) if grown != token else None


def _stable(expr: cst.BaseExpression) -> bool:
    """A bound read the same wherever it is written: a name, an attribute chain, a number."""
    if isinstance(expr, cst.Attribute):
        return _stable(expr.value)
    return isinstance(expr, (cst.Name, cst.Integer))


def _tail_slice(expr: cst.BaseExpression, grown: str) -> cst.BaseExpression | None:
    """`x[:, -B:]`: B."""
    if not (isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Name)
            and expr.value.value == grown and len(expr.slice) == 2):
        return None
    rows, columns = (s.slice for s in expr.slice)
    if not (isinstance(rows, cst.Slice) and rows.lower is None and rows.upper is None
            and rows.step is None and isinstance(columns, cst.Slice) and columns.upper is None
            and columns.step is None and isinstance(columns.lower, cst.UnaryOperation)
            and isinstance(columns.lower.operator, cst.Minus)):
        return None
    bound = columns.lower.expression
    return bound if _stable(bound) else None


def _length_of(expr: cst.BaseExpression, grown: str) -> bool:
    """`x.size(1)`, `x.shape[1]`."""
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) \
            and expr.func.attr.value == "size" and isinstance(expr.func.value, cst.Name) \
            and expr.func.value.value == grown and len(expr.args) == 1 \
            and expr.args[0].keyword is None and _is_int(expr.args[0].value, 1):
        return True
    return isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Attribute) \
        and expr.value.attr.value == "shape" and isinstance(expr.value.value, cst.Name) \
        and expr.value.value.value == grown and len(expr.slice) == 1 \
        and isinstance(expr.slice[0].slice, cst.Index) and _is_int(expr.slice[0].slice.value, 1)


def _crop(expr: cst.BaseExpression, grown: str) -> cst.BaseExpression | None:
    """The bound of `x[:, -B:]` or `x if x.size(1) <= B else x[:, -B:]`."""
    if not isinstance(expr, cst.IfExp):
        return _tail_slice(expr, grown)
    bound = _tail_slice(expr.orelse, grown)
    test = expr.test
    if bound is None or not (isinstance(expr.body, cst.Name) and expr.body.value == grown
                             and isinstance(test, cst.Comparison) and len(test.comparisons) == 1
                             and isinstance(test.comparisons[0].operator, cst.LessThanEqual)
                             and _length_of(test.left, grown)):
        return None
    compared = test.comparisons[0].comparator
    return bound if _same(compared, bound) else None


def _barrier(stmt: cst.CSTNode, qualify) -> bool:
    """A graph barrier alone on its line (steps.is_barrier)."""
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 \
        and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.Call) \
        and is_barrier(stmt.body[0].value, qualify)


def _same(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return _EMPTY.code_for_node(a) == _EMPTY.code_for_node(b)


def _reads(node: cst.CSTNode, name: str) -> int:
    return sum(1 for n in walk(node) if isinstance(n, cst.Name) and n.value == name)


def growing_sampler(loop: cst.For, qualify) -> Sampler | None:
    """The loop's sampler, where the loop is the shape this module ports; else None."""
    if loop.orelse is not None or not isinstance(loop.body, cst.IndentedBlock):
        return None
    statements = list(loop.body.body)
    while statements and _barrier(statements[-1], qualify):
        statements.pop()  # the step barrier TPU303 puts after the cat, or the user's own
    if len(statements) < 2:
        return None
    *body, last = statements
    assigned = _single_assign(last)
    grows = _grows(assigned[1], qualify) if assigned else None
    if grows is None or assigned[0] != grows[0]:
        return None
    grown, token = grows
    if _reads(loop.target, grown) or _reads(loop.iter, grown):
        return None
    # the one crop of the sequence, and no other read of it (in the loop, before the cat)
    crops, bare, stack = [], set(), [(stmt, None) for stmt in reversed(body)]
    while stack:
        node, parent = stack.pop()
        if isinstance(node, (cst.IfExp, cst.Subscript)) and _crop(node, grown) is not None:
            crops.append(node)
            if isinstance(parent, (cst.Assign, cst.Arg)):
                bare.add(id(node))
            continue
        stack.extend((child, node) for child in reversed(children(node)))
    if len(crops) != 1 or sum(_reads(stmt, grown) for stmt in body) != _reads(crops[0], grown):
        return None
    crop = crops[0]
    bound = _crop(crop, grown)
    if _reads(bound, grown) or _reads(bound, token):
        return None
    return Sampler(grown, token, bound, crop, id(crop) in bare, last)


def bounded_cats(loop: cst.For | cst.While, qualify) -> set[int]:
    """id() of the growing cats of the loop's body that the next statement crops back
    (`w = torch.cat((w, t), dim=1)` then `w = w if w.size(1) <= B else w[:, -B:]`: what the
    port writes): the tensor stops growing at B."""
    body = list(loop.body.body) if isinstance(loop.body, cst.IndentedBlock) else []
    found = set()
    for stmt, after in zip(body, body[1:]):
        grows, cropped = _single_assign(stmt), _single_assign(after)
        if grows and cropped and grows[0] == cropped[0] \
                and (_grows(grows[1], qualify) or ("", ""))[0] == grows[0] \
                and _crop(cropped[1], grows[0]) is not None:
            found.add(id(stmt.body[0]))
    return found


class _Rename(cst.CSTTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value=self.new) if updated.value == self.old else updated


def _cropped(name: str, bound: str) -> str:
    """`x if x.size(1) <= B else x[:, -B:]`: on XLA a slice from -B of a shorter tensor is an
    error ("Value out of range"), where eager PyTorch gives the whole tensor."""
    return f"{name} if {name}.size(1) <= {bound} else {name}[:, -{bound}:]"


def crop(updated: cst.BaseExpression, sampler: Sampler) -> cst.BaseExpression:
    """The crop of the window: as the user wrote it when it tests the length, else with the
    test (`idx[:, -B:]` of a shorter window fails on XLA)."""
    if isinstance(updated, cst.IfExp):
        return updated.visit(_Rename(sampler.grown, WINDOW))
    made = cst.parse_expression(_cropped(WINDOW, _EMPTY.code_for_node(sampler.bound)))
    return made if sampler.bare else made.with_changes(
        lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def cat_lines(original: cst.SimpleStatementLine, sampler: Sampler, statement) -> cst.FlattenSentinel:
    """`idx = torch.cat((idx, idx_next), dim=1)` -> the token kept, the window moved on.
    `statement(code)` parses a statement line and notes the imports it needs."""
    bound = _EMPTY.code_for_node(sampler.bound)
    return cst.FlattenSentinel([
        cst.parse_statement(f"{PARTS}.append({sampler.token})\n").with_changes(
            leading_lines=original.leading_lines),
        statement(f"{WINDOW} = torch.cat(({WINDOW}, {sampler.token}), dim=1)"),
        cst.parse_statement(f"{WINDOW} = {_cropped(WINDOW, bound)}\n")])


def around(updated: cst.For, sampler: Sampler, statement, qualify) -> cst.FlattenSentinel:
    """The loop (its lines ported by crop and cat_lines) between the window's and the
    parts' start and the sequence made once after it; a barrier ends each iteration (the
    step-barrier rule's, where it added one)."""
    loop = updated
    body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
    if not (body and _barrier(body[-1], qualify)):
        loop = loop.with_changes(body=loop.body.with_changes(
            body=[*body, statement("torch_xla.sync()")]))
    return cst.FlattenSentinel([
        cst.parse_statement(f"{WINDOW} = {sampler.grown}\n").with_changes(
            leading_lines=updated.leading_lines),
        cst.parse_statement(f"{PARTS} = [{sampler.grown}]\n"),
        loop.with_changes(leading_lines=()),
        statement(f"{sampler.grown} = torch.cat({PARTS}, dim=1)")])
