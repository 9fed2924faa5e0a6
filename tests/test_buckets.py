"""tpukit.buckets: the exact bucket DP against brute force, the padding helpers, and that
importing it costs user code nothing of tpukit's."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpukit.buckets import bucket_for, optimal_buckets, padding_overhead


def padded_elements(weights: dict[int, int], buckets: list[int]) -> int:
    return sum(w * (min(b for b in buckets if b >= v) - v) for v, w in weights.items())


def brute_force(weights: dict[int, int], k: int) -> int:
    """The least padding over every choice of at most k boundaries among the sizes (the
    largest size must be one of them)."""
    values = sorted(weights)
    best = None
    for count in range(1, min(k, len(values)) + 1):
        for rest in itertools.combinations(values[:-1], count - 1):
            cost = padded_elements(weights, [*rest, values[-1]])
            best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(1, 300), st.integers(1, 50), min_size=1, max_size=9),
       st.integers(1, 5))
def test_optimal_buckets_pad_as_little_as_brute_force(weights, k):
    buckets = optimal_buckets(weights, k)
    assert len(buckets) <= k
    assert max(buckets) == max(weights)
    assert set(buckets) <= set(weights)
    assert padded_elements(weights, buckets) == brute_force(weights, k)


def test_optimal_buckets_beat_powers_of_two_on_a_skewed_distribution():
    lengths = [17] * 50 + [33] * 40 + [65] * 5 + [90] * 5
    buckets = optimal_buckets(lengths, 4)
    assert buckets == [17, 33, 65, 90]
    assert padding_overhead(lengths, buckets) == 0.0
    assert padding_overhead(lengths, [32, 64, 128]) > 0.4


def test_optimal_buckets_with_few_sizes_returns_them_all():
    assert optimal_buckets([5, 9, 9, 5], 8) == [5, 9]
    assert optimal_buckets([], 3) == []
    with pytest.raises(ValueError, match="k must be at least 1"):
        optimal_buckets([4], 0)


def test_padding_overhead_counts_padded_over_real_elements():
    assert padding_overhead([10, 20], [20]) == pytest.approx(10 / 30)
    assert padding_overhead({10: 4}, [16]) == pytest.approx(6 / 10)


def test_bucket_for_picks_the_smallest_bucket_that_holds_the_size():
    assert bucket_for(1, [64, 16, 32]) == 16
    assert bucket_for(32, [16, 32, 64]) == 32
    assert bucket_for(33, [16, 32, 64]) == 64


def test_bucket_for_past_the_largest_bucket():
    with pytest.warns(UserWarning, match="past the largest bucket 64; padded to 128"):
        assert bucket_for(65, [16, 64]) == 128
    with pytest.raises(ValueError, match="larger than the largest bucket 64"):
        bucket_for(65, [16, 64], overflow="error")
    assert bucket_for(65, [16, 64], overflow="truncate") == 64
    with pytest.raises(ValueError, match="buckets must be positive"):
        bucket_for(3, [])


torch = pytest.importorskip("torch")


def test_pad_to_bucket_pads_the_dim_on_the_right_with_the_value():
    from tpukit.buckets import pad_to_bucket

    x = torch.ones(2, 5, dtype=torch.long)
    y = pad_to_bucket(x, 1, [4, 8], value=7)
    assert y.shape == (2, 8)
    assert y[:, :5].eq(1).all() and y[:, 5:].eq(7).all()
    assert pad_to_bucket(x, -2, [4], value=0).shape == (4, 5)
    assert pad_to_bucket(x, 1, [4], overflow="truncate").shape == (2, 4)


def test_bucket_collate_pads_inputs_and_labels_of_pairs_to_one_bucket():
    from tpukit.buckets import BucketCollate

    samples = [(torch.arange(1, 4), torch.arange(1, 4)), (torch.arange(1, 7), torch.arange(1, 7))]
    tokens, labels = BucketCollate([4, 8, 16])(samples)
    assert tokens.shape == labels.shape == (2, 8)
    assert tokens[0].tolist() == [1, 2, 3, 0, 0, 0, 0, 0]
    assert labels[0].tolist() == [1, 2, 3, -100, -100, -100, -100, -100]


def test_bucket_collate_on_dicts_pads_label_keys_and_leaves_scalars():
    from tpukit.buckets import BucketCollate

    samples = [{"input_ids": torch.ones(3, dtype=torch.long), "labels": torch.ones(3),
                "id": torch.tensor(i)} for i in range(2)]
    batch = BucketCollate([5], pad_value=9)(samples)
    assert batch["input_ids"][0].tolist() == [1, 1, 1, 9, 9]
    assert batch["labels"][0].tolist() == [1, 1, 1, -100, -100]
    assert batch["id"].tolist() == [0, 1]


def test_bucket_collate_pads_along_the_given_sample_dim():
    from tpukit.buckets import BucketCollate

    images = [torch.zeros(3, 10, 7), torch.zeros(3, 12, 7)]
    assert BucketCollate([16], dim=1)(images).shape == (2, 3, 16, 7)


def test_importing_buckets_loads_nothing_heavy():
    code = ("import sys, tpukit.buckets; heavy = [m for m in ('torch', 'libcst', 'rich', "
            "'typer', 'tpukit.run', 'tpukit.migrate') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
