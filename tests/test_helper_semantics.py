"""The helpers TPU510-TPU512 insert compute what the code they replace computed: each is run
against the statement it stands for, on CPU tensors, over seeded random cases (bounds inside,
outside and negative, values that broadcast, cast or carry leading 1s). A case where the
original raises is one no script that trains can reach and is skipped."""

from __future__ import annotations

import random

import pytest

from tpukit.migrate import helpers

torch = pytest.importorskip("torch")


def _helper(name: str):
    namespace: dict = {}
    exec("import torch\n" + helpers.SOURCES[name], namespace)  # noqa: S102
    return namespace[name]


def _value(rng: random.Random, shape: tuple[int, ...]):
    """A value for a write into `shape`: that shape, a leading 1 added, a dimension of it
    broadcast from 1, a Python number, or another dtype."""
    shape = list(shape)
    pick = rng.randrange(5)
    if pick == 0 and shape:
        shape[rng.randrange(len(shape))] = 1
    elif pick == 1:
        shape = [1, *shape]
    elif pick == 2:
        return rng.choice([3, -1.5])
    value = torch.randn(shape) * 10
    return value.to(torch.int64) if pick == 3 else value


def _same(write, helper, buffer, *args):
    expected = buffer.clone()
    try:
        write(expected)
    except (IndexError, RuntimeError, ValueError):
        return None  # the original raises: not a case a training script reaches
    got = buffer.clone()
    helper(got, *args)
    return torch.equal(got, expected)


def test_put_slice_writes_what_the_slice_assignment_writes():
    put_slice = _helper("_xla_put_slice")
    rng = random.Random(48)
    compared = 0
    for _ in range(1500):
        shape = [rng.randint(1, 6) for _ in range(rng.randint(1, 3))]
        dim = rng.randrange(len(shape))
        start = rng.randint(-8, 8)
        stop = None if rng.random() < 0.25 else rng.randint(-8, 8)
        index = start if stop is None else slice(start, stop)
        key = (slice(None),) * dim + (index,)
        try:
            target = torch.empty(shape)[key].shape
        except IndexError:
            continue  # a position outside the buffer: the original raises
        value = _value(rng, tuple(target))
        buffer = torch.randn(shape)
        if rng.random() < 0.3:
            buffer = buffer.to(torch.int32)

        def write(b, key=key, value=value):
            b[key] = value
        bounds = (torch.tensor(start), None if stop is None else torch.tensor(stop))
        if rng.random() < 0.3 and stop is not None:  # one bound an int, the other a tensor
            bounds = (start, torch.tensor(stop))
        same = _same(write, put_slice, buffer, dim, *bounds, value)
        if same is None:
            continue
        assert same, (shape, dim, start, stop, getattr(value, "shape", value))
        compared += 1
    assert compared > 1000  # the cases the original accepts are most of them


def test_put_slice_with_int_bounds_assigns_as_written():
    put_slice = _helper("_xla_put_slice")
    buffer = torch.zeros(2, 5)
    put_slice(buffer, 1, 1, 3, torch.ones(2, 2))
    assert buffer.sum() == 4 and buffer[:, 1:3].eq(1).all()


def test_put_writes_what_the_index_assignment_writes():
    put = _helper("_xla_put")
    rng = random.Random(510)
    compared = 0
    for _ in range(600):
        shape = [rng.randint(1, 5) for _ in range(rng.randint(1, 3))]
        index = rng.randint(-shape[0] - 1, shape[0])  # one past each end too
        value = _value(rng, tuple(shape[1:]))
        buffer = torch.randn(shape)

        def write(b, index=index, value=value):
            b[index] = value
        same = _same(write, put, buffer, index, value)
        if same is None:
            continue
        assert same, (shape, index, getattr(value, "shape", value))
        compared += 1
    assert compared > 300


def test_pointer_is_an_int_on_the_host():
    pointer = _helper("_xla_pointer")
    got = pointer(torch.tensor([7]))
    assert type(got) is int and got == 7


def test_a_deferred_sum_reads_as_the_sum_of_its_reads():
    deferred, value = _helper("_xla_deferred"), _helper("_xla_value")
    losses = [torch.tensor(0.25), torch.tensor([1.5]), torch.tensor(2.0)]
    total = 0
    for loss in losses:
        total += deferred(loss)
    assert value(total) == sum(loss.item() for loss in losses)
    count = 0
    for n in (torch.tensor(3), torch.tensor(4)):
        count += deferred(n, int)
    assert value(count) == 7 and type(value(count)) is int
    assert value(2.5) == 2.5  # what is not a tensor is as it is
