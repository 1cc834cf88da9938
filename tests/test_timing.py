"""perfladder.timing.measure with a fake, asynchronous device and a fake clock.

The fake device works like a GPU queue: ``step`` only *enqueues* work and returns at
once; the clock advances only when ``sync`` drains the queue. So a window that were not
closed by a sync would read (almost) no time -- the planted window times are recovered
only if ``measure`` syncs before it reads the clock.
"""
from __future__ import annotations

import statistics

import pytest

from perfladder import timing
from perfladder.timing import (BatchShapeError, RecompileError, StaleBatchError, Throughput,
                               measure)

B, T = 4, 8


class Batch:
    """A fresh object per batch (the timer checks identity, not contents)."""

    def __init__(self, shape=(B, T)):
        self.shape = shape


class FakeDevice:
    def __init__(self, step_costs):
        self.now = 0.0
        self.pending = 0.0
        self.costs = iter(step_costs)      # seconds of device work per step, in call order
        self.compiles = 0
        self.compile_at = set()            # step numbers (1-based) that trigger a compile
        self.steps = 0
        self.log = []                      # ('step', n) / ('sync', steps so far)

    # the framework-side hooks measure() takes
    def step(self, X, Y):
        self.steps += 1
        self.pending += next(self.costs)
        if self.steps in self.compile_at:
            self.compiles += 1
        self.log.append(("step", self.steps))
        return self.steps

    def sync(self, out):
        self.now += self.pending
        self.pending = 0.0
        self.log.append(("sync", self.steps))

    def compile_count(self):
        return self.compiles

    def perf_counter(self):
        return self.now


def stream(shapes=None):
    i = 0
    while True:
        shape = shapes[i] if shapes and i < len(shapes) else (B, T)
        i += 1
        yield Batch(shape), Batch(shape)


def run(dev, monkeypatch, warmup=2, timed=3, windows=3, source=None):
    monkeypatch.setattr(timing, "time", dev)          # measure reads time.perf_counter()
    return measure(dev.step, source or stream(), warmup=warmup, timed=timed, windows=windows,
                   sync=dev.sync, compile_count=dev.compile_count,
                   num_tokens=lambda X: X.shape[0] * X.shape[1], shape_of=lambda X: X.shape)


def test_median_and_spread_of_planted_windows(monkeypatch):
    warm = [5.0, 5.0]                      # slow warm-up (compilation): must not count
    per_window = [0.2, 0.1, 0.4]           # seconds per step in windows 1..3
    dev = FakeDevice(warm + [c for c in per_window for _ in range(3)])
    tp = run(dev, monkeypatch)
    tokens = 3 * B * T
    rates = [tokens / (3 * c) for c in per_window]
    assert isinstance(tp, Throughput)
    assert tp.seconds == pytest.approx([3 * c for c in per_window])
    assert tp.windows == pytest.approx(rates)
    assert tp.tokens_per_s == pytest.approx(statistics.median(rates)) == pytest.approx(tokens / 0.6)
    assert tp.spread == pytest.approx((max(rates) - min(rates)) / (tokens / 0.6))
    assert tp.step_time_s == pytest.approx(0.2)
    assert (tp.steps_per_window, tp.tokens_per_window, tp.warmup) == (3, tokens, 2)
    assert tp.batch_shape == (B, T)
    d = tp.to_dict()
    assert d["batch_shape"] == [B, T] and d["spread"] == pytest.approx(tp.spread)
    assert "median of 3 windows" in str(tp)


def test_one_sync_after_warmup_and_one_per_window(monkeypatch):
    dev = FakeDevice([0.1] * 20)
    run(dev, monkeypatch, warmup=2, timed=3, windows=3)
    syncs = [n for kind, n in dev.log if kind == "sync"]
    assert syncs == [2, 5, 8, 11]          # after warm-up, then at the end of each window
    assert dev.steps == 11


def test_no_warmup_still_syncs_before_the_first_window(monkeypatch):
    dev = FakeDevice([0.1] * 10)
    tp = run(dev, monkeypatch, warmup=0, timed=2, windows=2)
    assert [n for kind, n in dev.log if kind == "sync"] == [0, 2, 4]
    assert tp.windows == pytest.approx([2 * B * T / 0.2] * 2)


def test_compile_during_warmup_is_fine(monkeypatch):
    dev = FakeDevice([0.1] * 20)
    dev.compile_at = {1, 2}
    assert run(dev, monkeypatch).tokens_per_s > 0


def test_compile_inside_a_window_raises(monkeypatch):
    dev = FakeDevice([0.1] * 20)
    dev.compile_at = {7}                   # warm-up 1-2, window 1: 3-5, window 2: 6-8
    with pytest.raises(RecompileError, match=r"1 compilation\(s\).*window 2/3"):
        run(dev, monkeypatch)


def test_same_batch_twice_raises(monkeypatch):
    dev = FakeDevice([0.1] * 20)
    one = Batch()

    def cached():
        while True:
            yield one, one
    with pytest.raises(StaleBatchError, match="same batch"):
        run(dev, monkeypatch, source=cached())


def test_warmup_batch_replayed_in_window_raises(monkeypatch):
    dev = FakeDevice([0.1] * 20)
    last = Batch()

    def replay():
        yield Batch(), Batch()
        yield last, last                   # last warm-up batch ...
        yield last, last                   # ... timed again
        while True:
            yield Batch(), Batch()
    with pytest.raises(StaleBatchError):
        run(dev, monkeypatch, source=replay())


def test_ragged_batch_inside_windows_raises(monkeypatch):
    dev = FakeDevice([0.1] * 20)
    shapes = [(B, T)] * 6 + [(B - 1, T)]   # the 5th timed batch is a ragged tail
    with pytest.raises(BatchShapeError, match=r"\(4, 8\) to \(3, 8\)"):
        run(dev, monkeypatch, source=stream(shapes))


@pytest.mark.parametrize("kw, name", [(dict(warmup=-1), "warmup"), (dict(timed=0), "timed"),
                                      (dict(windows=1.5), "windows")])
def test_bad_counts(monkeypatch, kw, name):
    dev = FakeDevice([0.1] * 20)
    with pytest.raises(ValueError, match=name):
        run(dev, monkeypatch, **kw)


def test_drive_runs_steps_in_order_and_reports_progress():
    from perfladder.driver import drive
    events = []
    out = drive([("a", lambda: 1), ("b", lambda: 2)], lambda *e: events.append(e))
    assert out == [1, 2]
    assert events == [("start", "a", None), ("end", "a", 1), ("start", "b", None), ("end", "b", 2)]
    assert drive([("c", lambda: 3)]) == [3]               # no progress callback
