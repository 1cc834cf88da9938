"""A stream's freshness across epochs (``perfladder.measure.draws.Draws``), by object and by content.

A stream that declares ``per_epoch`` (as perfladder's do) and re-yields its first epoch's
batches from the second on passes every check of consecutive batches -- each batch differs
from the one before -- and is refused by comparing the batches one epoch apart: the same
objects at once, the same content (new objects) after the last window. A measurement shorter
than an epoch draws on to the boundary, untimed, once per stream.
"""
from __future__ import annotations

import pytest

from perfladder.measure import timing
from perfladder.measure.draws import Draws
from perfladder.measure.timing import StaleBatchError, TimerHooks, measure, window_settings


class Batch:
    shape = (2, 3)

    def __init__(self, content):
        self.content = content


class Epochs:
    """``per_epoch`` batches an epoch, each epoch's content new (``replay``: the first epoch's
    batches again from the second on, as the same objects or as copies)."""

    def __init__(self, per_epoch=4, replay=None):
        self.per_epoch, self.replay, self.position, self.cache = per_epoch, replay, -1, []

    def __iter__(self):
        return self

    def __next__(self):
        self.position += 1
        epoch, i = divmod(self.position, self.per_epoch)
        if epoch and self.replay == "objects":
            X = self.cache[i]
        elif epoch and self.replay == "copies":
            X = Batch(self.cache[i].content)
        else:
            X = Batch((epoch, i))
            self.cache.append(X)
        return X, X


class Clock:
    now = 0.0

    def perf_counter(self):
        return self.now


def run(stream, monkeypatch, *, fingerprint=lambda X: repr(X.content).encode(), warmup=2, timed=3,
        windows=3):
    clock, steps = Clock(), []
    monkeypatch.setattr(timing, "time", clock)

    def step(X, Y):
        clock.now += 0.1
        steps.append(X)
    hooks = TimerHooks(sync=lambda out: None, compile_count=lambda: 0, num_tokens=lambda X: 6,
                       shape_of=lambda X: X.shape, fingerprint=fingerprint)
    tp = measure(step, stream, hooks,
                 window_settings(warmup=warmup, timed=timed, windows=windows, target_spread=0.5))
    return tp, steps


def test_an_honest_stream_passes_and_its_epoch_boundary_is_compared(monkeypatch):
    s = Epochs(per_epoch=4)
    tp, steps = run(s, monkeypatch)
    assert len(steps) == 2 + 3 * len(tp.windows) and s.position + 1 == len(steps)   # crossed inside


@pytest.mark.planted
@pytest.mark.parametrize("replay, said", [("objects", "the same tensor object"),
                                          ("copies", "the same content")])
def test_a_stream_replaying_its_first_epoch_is_refused(monkeypatch, replay, said):
    with pytest.raises(StaleBatchError, match=f"4 draws apart \\(stream.per_epoch=4.*are {said}"):
        run(Epochs(per_epoch=4, replay=replay), monkeypatch)


def test_without_a_fingerprint_the_objects_are_still_compared(monkeypatch):
    """A sharded JAX batch is not read on the host: identity is what is left."""
    assert run(Epochs(per_epoch=4, replay="copies"), monkeypatch, fingerprint=None)
    with pytest.raises(StaleBatchError, match="the same tensor object"):
        run(Epochs(per_epoch=4, replay="objects"), monkeypatch, fingerprint=None)


def test_a_measurement_shorter_than_an_epoch_draws_on_to_its_boundary_once(monkeypatch):
    with pytest.raises(StaleBatchError, match="the same content"):
        run(Epochs(per_epoch=30, replay="copies"), monkeypatch)
    s = Epochs(per_epoch=30)
    _, steps = run(s, monkeypatch)
    assert len(steps) == 11 and s.position + 1 == 31          # 20 draws more, none of them timed
    _, steps = run(s, monkeypatch)                            # the same stream again: not twice
    assert len(steps) == 11 and s.position + 1 == 31 + 11


def test_streams_without_epochs_are_compared_as_before(monkeypatch):
    def fresh():
        i = 0
        while True:
            i += 1
            yield Batch(i), Batch(i)
    d = Draws(fresh(), fingerprint=lambda X: X.content)
    assert d.per_epoch is None
    d()
    d()
    d.finish()
    assert d.count == 2
    for bad in (0, True, 2.0, "4"):
        assert Draws(Epochs(per_epoch=bad)).per_epoch is None
