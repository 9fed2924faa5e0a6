"""Shape signatures of the tensors a step receives, and how two of them differ."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Shape = tuple[tuple[int, ...], str]  # (sizes, dtype)


def tensors_in(value: Any, name: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(name, tensor) for a tensor, or the tensors in a (nested) tuple, list or dict."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        yield name, value
    elif depth >= 2:
        return
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value[:16]):
            yield from tensors_in(item, f"{name}[{i}]", depth + 1)
    elif isinstance(value, dict):
        for key in list(value)[:16]:
            yield from tensors_in(value[key], f"{name}[{key!r}]", depth + 1)


def signature(value: Any, name: str) -> dict[str, Shape]:
    out = {}
    for key, tensor in tensors_in(value, name):
        out[key] = (tuple(int(s) for s in tensor.shape), str(tensor.dtype).replace("torch.", ""))
    return out


def diff(old: dict[str, Shape], new: dict[str, Shape]) -> list[dict]:
    """The inputs whose shape or dtype differ, e.g. {'name': 'x', 'old': [16, 52], 'new':
    [16, 57], 'dims': [1]} (`dims` empty when the rank changed)."""
    changes = []
    for name in sorted(set(old) & set(new)):
        (old_sizes, old_dtype), (new_sizes, new_dtype) = old[name], new[name]
        if old_sizes == new_sizes and old_dtype == new_dtype:
            continue
        dims = ([i for i, (a, b) in enumerate(zip(old_sizes, new_sizes)) if a != b]
                if len(old_sizes) == len(new_sizes) else [])
        changes.append({
            "name": name, "old": list(old_sizes), "new": list(new_sizes),
            "old_dtype": old_dtype, "new_dtype": new_dtype, "dims": dims,
        })
    return changes


def shape_text(dims) -> str:
    """`[16, 52]`."""
    return "[" + ", ".join(map(str, dims)) + "]"


def describe(change: dict) -> str:
    """`x: [16, 52] -> [16, 57] (dim 1)`."""
    old, new = shape_text(change["old"]), shape_text(change["new"])
    name = change["name"] + (f" (line {change['line']})" if change.get("line") else "")
    text = f"{name}: {old} -> {new}"
    if change["old_dtype"] != change["new_dtype"]:
        text = (f"{name}: {old} {change['old_dtype']} -> {new} {change['new_dtype']}"
                if old != new else f"{name}: {change['old_dtype']} -> {change['new_dtype']}")
    if change["dims"]:
        text += f" (dim {', '.join(map(str, change['dims']))})"
    elif len(change["old"]) != len(change["new"]):
        text += " (rank)"
    return text
