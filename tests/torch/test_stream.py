"""perfladder.torch.stream.batches: fresh, constant-shape, shuffled, int64 batches."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from perfladder.data import TimeMachine
from perfladder.torch import batches
from perfladder.torch.stream import Batches

B, T = 16, 8


@pytest.fixture(scope="module")
def data():
    # 50 training windows: 3 whole batches of 16 per epoch, a ragged tail of 2
    return TimeMachine(batch_size=B, num_steps=T, num_train=50, num_val=20)


def test_shape_and_dtype_constant_across_epochs(data):
    for X, Y in itertools.islice(batches(data, B, "cpu"), 12):       # 4 epochs
        assert X.shape == Y.shape == (B, T)                          # the tail of 2 never shows
        assert X.dtype == Y.dtype == torch.int64
        assert torch.equal(X[:, 1:], Y[:, :-1])                      # Y is X shifted by one


class Numbered:
    """Stand-in data whose row i is all i's, so a batch row names its example."""

    def __init__(self, n):
        self.X = np.repeat(np.arange(n, dtype=np.int32)[:, None], T, axis=1)   # (n, T)

    def train_arrays(self):
        return self.X, self.X + 1


def test_each_epoch_is_a_permutation_without_the_tail():
    stream = batches(Numbered(50), B, "cpu", seed=1)
    for _ in range(3):                                               # three epochs
        ids = torch.cat([next(stream)[0][:, 0] for _ in range(3)]).tolist()
        assert len(set(ids)) == 3 * B                                # no example twice in an epoch
    epochs = [torch.cat([next(stream)[0][:, 0] for _ in range(3)]) for _ in range(2)]
    assert not torch.equal(epochs[0], epochs[1])                     # a fresh shuffle every epoch


def test_fresh_objects_and_no_repeat_in_a_row(data):
    got = list(itertools.islice(batches(data, B, "cpu"), 7))
    assert len({id(X) for X, _ in got}) == len(got)
    for (a, _), (b, _) in zip(got, got[1:]):
        assert not torch.equal(a, b)


def test_seed_decides_the_order(data):
    first = lambda s: next(batches(data, B, "cpu", seed=s))[0]      # noqa: E731
    assert torch.equal(first(0), first(0))
    assert not torch.equal(first(0), first(1))


def test_val_split(data):
    X, _ = next(batches(data, 8, "cpu", split="val"))
    val = torch.tensor(data.val_arrays()[0]).long()           # a copy: the split is a read-only view
    assert all((val == r).all(dim=1).any() for r in X)


def test_batch_larger_than_data_is_an_error(data):
    with pytest.raises(ValueError, match="larger than the data"):
        batches(data, 51, "cpu")
    with pytest.raises(ValueError, match="larger than the data"):
        batches(data, 21, "cpu", split="val")


def test_bad_split_lists_choices(data):
    with pytest.raises(ValueError, match="'test'.*train.*val"):
        batches(data, B, "cpu", split="test")


# -- the Batches iterator and its position (what the timer's stale-batch guard reads) ---------------
def test_batches_is_an_iterator_with_a_moving_position(data):
    stream = batches(data, B, "cpu", seed=7)
    assert isinstance(stream, Batches) and iter(stream) is stream
    assert stream.position is None                                   # nothing handed out yet
    seen = []
    for _ in range(7):                                               # 3 batches per epoch
        next(stream)
        seen.append(stream.position)
    assert seen == [(7, e, i) for e in range(3) for i in range(3)][:7]
    assert len(set(seen)) == len(seen)                               # never the same twice


def test_position_tells_streams_apart(data):
    a, b = batches(data, B, "cpu", seed=1), batches(data, B, "cpu", seed=2)
    next(a), next(b)
    assert a.position != b.position


def test_a_stuck_stream_is_refused_by_position(data):
    """A stream that hands out new tensors but never advances is caught by its position."""
    from perfladder.measure.timing import StaleBatchError
    from perfladder.torch import throughput
    stream = batches(data, B, "cpu")

    class Stuck:
        position = None

        def __iter__(self):
            return self

        def __next__(self):
            X, Y = next(stream)
            self.position = stream.position[:2]                      # ignores the index: stuck
            return X, Y
    with pytest.raises(StaleBatchError, match="same batch twice"):
        throughput(lambda X, Y: X.sum(), Stuck(), warmup=1, timed=2, windows=1)
    assert throughput(lambda X, Y: X.sum(), batches(data, B, "cpu"), warmup=1, timed=2, windows=1,
                      target_spread=0.9).tokens_per_s > 0
