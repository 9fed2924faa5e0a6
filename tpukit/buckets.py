"""Shape buckets: pad variable dimensions to a few sizes, so that XLA compiles one graph per
bucket instead of one per size.

Import this in training code; it costs nothing at import (torch is imported only when a tensor
is padded, and no other part of tpukit is loaded)::

    from tpukit.buckets import BucketCollate, optimal_buckets

    buckets = optimal_buckets(lengths, k=4)              # or the list `tpukit run` advised
    loader = DataLoader(ds, batch_size=16, collate_fn=BucketCollate(buckets))

`BucketCollate` pads every sample of a batch along `dim` to the smallest bucket that holds the
longest sample, inputs with `pad_value` and labels with `label_pad_value` (-100, which
`cross_entropy` ignores), then collates as the DataLoader would have. `pad_to_bucket` does the
same to one tensor. `optimal_buckets` is exact: the boundaries that minimise the padded
elements for at most k buckets, over the observed sizes and how often each occurs.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["BucketCollate", "bucket_for", "optimal_buckets", "pad_to_bucket", "padding_overhead"]

LABEL_KEYS = ("labels", "label", "targets", "target", "y")
OVERFLOW = ("multiple", "error", "truncate")


def bucket_for(size: int, buckets: Sequence[int], overflow: str = "multiple") -> int:
    """The smallest bucket >= size. Past the largest bucket, `overflow` decides: "multiple"
    rounds up to a multiple of the largest bucket (one more compile, with a warning), "error"
    raises ValueError, "truncate" returns the largest bucket (the caller cuts the tensor)."""
    ordered = _checked(buckets)
    for bucket in ordered:
        if size <= bucket:
            return bucket
    largest = ordered[-1]
    if overflow == "error":
        raise ValueError(f"size {size} is larger than the largest bucket {largest}")
    if overflow == "truncate":
        return largest
    if overflow != "multiple":
        raise ValueError(f"overflow must be one of {', '.join(OVERFLOW)}, not {overflow!r}")
    grown = -(-size // largest) * largest
    warnings.warn(f"tpukit.buckets: size {size} is past the largest bucket {largest}; padded to "
                  f"{grown} (a new graph for XLA to compile)", stacklevel=3)
    return grown


def pad_to_bucket(tensor, dim: int, buckets: Sequence[int], value: float = 0,
                  overflow: str = "multiple"):
    """`tensor` padded on the right of `dim` with `value` up to its bucket (or cut to the
    largest bucket with overflow="truncate")."""
    size = tensor.shape[dim]
    target = bucket_for(size, buckets, overflow)
    return _resize(tensor, dim, target, value)


def _resize(tensor, dim: int, target: int, value: float):
    import torch.nn.functional as F

    dim = dim % tensor.dim()
    size = tensor.shape[dim]
    if target < size:
        return tensor.narrow(dim, 0, target)
    if target == size:
        return tensor
    pad = [0, 0] * (tensor.dim() - dim - 1) + [0, target - size]
    return F.pad(tensor, pad, value=value)


class BucketCollate:
    """A DataLoader `collate_fn` that pads a batch's variable dimension to a bucket.

    Each sample is a tensor, a tuple/list or a dict of tensors. Every tensor with more than
    `dim` dimensions is padded along `dim` (in sample coordinates, before batching) to
    the bucket of the longest such tensor in the batch, so inputs, masks and labels stay
    aligned. Labels (dict keys in `labels`, or tuple positions in `labels`; by default the
    keys labels/label/targets/target/y, and position 1 of a pair) get `label_pad_value`,
    everything else `pad_value`. `collate` is what runs afterwards (default_collate).
    """

    def __init__(self, buckets: Sequence[int], dim: int = 0, pad_value: float = 0,
                 label_pad_value: float = -100, labels: Iterable[Any] | None = None,
                 overflow: str = "multiple", collate: Callable | None = None) -> None:
        self.buckets = _checked(buckets)
        if overflow not in OVERFLOW:
            raise ValueError(f"overflow must be one of {', '.join(OVERFLOW)}, not {overflow!r}")
        self.dim = dim
        self.pad_value = pad_value
        self.label_pad_value = label_pad_value
        self.labels = None if labels is None else set(labels)
        self.overflow = overflow
        self.collate = collate

    def __call__(self, samples: Sequence[Any]) -> Any:
        longest = max((size for s in samples for size in self._sizes(s)), default=None)
        if longest is not None:
            target = bucket_for(longest, self.buckets, self.overflow)
            samples = [self._pad(s, target) for s in samples]
        collate = self.collate
        if collate is None:
            from torch.utils.data import default_collate as collate
        return collate(samples)

    def _is_label(self, key: Any, pair: bool) -> bool:
        if self.labels is not None:
            return key in self.labels
        return key in LABEL_KEYS if isinstance(key, str) else (pair and key == 1)

    def _variable(self, value: Any) -> bool:
        return hasattr(value, "shape") and len(value.shape) > self.dim

    def _sizes(self, sample: Any) -> list[int]:
        if isinstance(sample, Mapping):
            values = list(sample.values())
        elif isinstance(sample, (tuple, list)):
            values = list(sample)
        else:
            values = [sample]
        return [int(v.shape[self.dim]) for v in values if self._variable(v)]

    def _pad(self, sample: Any, target: int) -> Any:
        def pad(value: Any, label: bool) -> Any:
            if not self._variable(value):
                return value
            return _resize(value, self.dim, target,
                           self.label_pad_value if label else self.pad_value)

        if isinstance(sample, Mapping):
            return type(sample)({k: pad(v, self._is_label(k, False)) for k, v in sample.items()})
        if isinstance(sample, (tuple, list)):
            pair = len(sample) == 2
            padded = [pad(v, self._is_label(i, pair)) for i, v in enumerate(sample)]
            return type(sample)(padded) if isinstance(sample, list) else tuple(padded)
        return pad(sample, False)


def _checked(buckets: Sequence[int]) -> list[int]:
    ordered = sorted({int(b) for b in buckets})
    if not ordered or ordered[0] < 1:
        raise ValueError(f"buckets must be positive sizes, got {list(buckets)!r}")
    return ordered


def optimal_buckets(sizes: Iterable[int] | Mapping[int, float], k: int) -> list[int]:
    """The at most k bucket boundaries that minimise the padded elements over `sizes`.

    `sizes` is the observed sizes (one per sample or batch), or a mapping size -> weight (how
    many elements one unit of this dimension stands for, summed over its occurrences: e.g. the
    batch size times the other dims). Exact: the best boundaries are observed sizes, and the
    cost of a bucket (its boundary times the weight it holds, minus the elements it holds) is
    a Monge array, so the split points of the dynamic programme are monotone and a
    divide-and-conquer pass per bucket finds the optimum in O(k n log n) for n distinct sizes.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    weights = _weights(sizes)
    if not weights:
        return []
    values = sorted(weights)
    if len(values) <= k:
        return values
    n = len(values)
    weight_sum = [0.0] * (n + 1)  # prefix sums of weight and of weight * size
    element_sum = [0.0] * (n + 1)
    for i, v in enumerate(values):
        weight_sum[i + 1] = weight_sum[i] + weights[v]
        element_sum[i + 1] = element_sum[i] + weights[v] * v

    def cost(a: int, b: int) -> float:  # values[a..b] padded to values[b]
        held = weight_sum[b + 1] - weight_sum[a]
        return values[b] * held - (element_sum[b + 1] - element_sum[a])

    previous = [cost(0, b) for b in range(n)]  # one bucket over values[0..b]
    splits: list[list[int]] = [[0] * n]
    for _ in range(1, k):
        previous, choice = _add_bucket(previous, cost, n)
        splits.append(choice)
    boundaries = []
    b, level = n - 1, k - 1
    while b >= 0 and level >= 0:
        a = splits[level][b]
        if a == -1:  # this level added nothing
            level -= 1
            continue
        boundaries.append(values[b])
        b, level = a - 1, level - 1
    return sorted(boundaries)


def _add_bucket(previous: list[float], cost: Callable[[int, int], float],
                n: int) -> tuple[list[float], list[int]]:
    """One more bucket: best[b] = min over a of previous[a-1] + cost(a, b), the last bucket
    being values[a..b]; choice[b] = a, or -1 where one bucket fewer is as good."""
    inf = float("inf")
    best = [inf] * n
    choice = [0] * n

    def solve(lo: int, hi: int, opt_lo: int, opt_hi: int) -> None:
        if lo > hi:
            return
        mid = (lo + hi) // 2
        value, split = inf, opt_lo
        for a in range(max(opt_lo, 1), min(mid, opt_hi) + 1):
            candidate = previous[a - 1] + cost(a, mid)
            if candidate < value:
                value, split = candidate, a
        best[mid], choice[mid] = value, split
        solve(lo, mid - 1, opt_lo, split)
        solve(mid + 1, hi, split, opt_hi)

    solve(1, n - 1, 1, n - 1)
    for b in range(n):  # fewer buckets may be as good (never worse to allow it)
        if previous[b] <= best[b]:
            best[b], choice[b] = previous[b], -1
    return best, choice


def padding_overhead(sizes: Iterable[int] | Mapping[int, float], buckets: Sequence[int]) -> float:
    """Padded elements as a fraction of real elements when `sizes` are padded to `buckets`
    (0.1 = 10% more elements); sizes past the largest bucket count as padded to a multiple."""
    weights = _weights(sizes)
    real = sum(w * v for v, w in weights.items())
    padded = 0.0
    ordered = _checked(buckets)
    for v, w in weights.items():
        target = next((b for b in ordered if v <= b), -(-v // ordered[-1]) * ordered[-1])
        padded += w * (target - v)
    return padded / real if real else 0.0


def _weights(sizes: Iterable[int] | Mapping[int, float]) -> dict[int, float]:
    if isinstance(sizes, Mapping):
        return {int(v): float(w) for v, w in sizes.items() if w > 0}
    return {int(v): float(w) for v, w in Counter(sizes).items()}
