"""perfladder.measure.timing.measure with a fake, asynchronous device and a fake clock.

The fake device works like a GPU queue: ``step`` only *enqueues* work and returns at
once; the clock advances only when ``sync`` drains the queue. So a window that were not
closed by a sync would read (almost) no time -- the planted window times are recovered
only if ``measure`` syncs before it reads the clock.
"""
from __future__ import annotations

import statistics

import pytest

from perfladder.measure import timing
from perfladder.measure.timing import (
    MIN_MAX_WINDOWS,
    BatchShapeError,
    RecompileError,
    StaleBatchError,
    Throughput,
    measure,
    measure_settled,
)

B, T = 4, 8
TOKENS = B * T


class Batch:
    """A fresh object per batch (the timer checks identity; content only through a fingerprint)."""

    def __init__(self, shape=(B, T), content=None):
        self.shape = shape
        self.content = content if content is not None else id(self)


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


def windows_of(per_step_seconds, timed=3):
    """Step costs for windows whose steps each take the given seconds."""
    return [c for c in per_step_seconds for _ in range(timed)]


def run(dev, monkeypatch, warmup=2, timed=3, windows=3, source=None, **kw):
    monkeypatch.setattr(timing, "time", dev)          # measure reads time.perf_counter()
    hooks = timing.TimerHooks(sync=dev.sync, compile_count=dev.compile_count,
                              num_tokens=lambda X: X.shape[0] * X.shape[1], shape_of=lambda X: X.shape,
                              **{k: kw.pop(k) for k in ("fingerprint", "ready") if k in kw})
    return measure(dev.step, source or stream(), hooks,
                   timing.window_settings(warmup=warmup, timed=timed, windows=windows, **kw))


def test_median_and_spread_of_planted_windows(monkeypatch):
    warm = [5.0, 5.0]                      # slow warm-up (compilation): must not count
    per_window = [0.2, 0.18, 0.22]         # seconds per step in windows 1..3 (spread ~20%)
    dev = FakeDevice(warm + windows_of(per_window))
    tp = run(dev, monkeypatch, target_spread=0.25)
    tokens = 3 * TOKENS
    rates = [tokens / (3 * c) for c in per_window]
    assert isinstance(tp, Throughput) and tp.stable and tp.settled == 3
    assert tp.seconds == pytest.approx([3 * c for c in per_window])
    assert tp.windows == pytest.approx(rates)
    assert tp.tokens_per_s == pytest.approx(statistics.median(rates)) == pytest.approx(tokens / 0.6)
    assert tp.spread == pytest.approx((max(rates) - min(rates)) / (tokens / 0.6))
    assert tp.step_time_s == pytest.approx(0.2)
    assert (tp.steps_per_window, tp.tokens_per_window, tp.warmup) == (3, tokens, 2)
    assert tp.batch_shape == (B, T) and tp.target_spread == 0.25
    assert "median of the last 3 of 3 windows" in str(tp) and "settled" in str(tp)


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
    assert tp.windows == pytest.approx([2 * TOKENS / 0.2] * 2)


# -- settling: a disturbed start is waited out; a step that never settles says so ----------------------
def test_a_disturbed_start_is_waited_out(monkeypatch):
    """Two slow windows (a clock ramping up, another process finishing), then steady ones:
    the timer keeps opening windows until the last three agree, reports their median, and
    keeps every window in the record."""
    per_window = [0.5, 0.3, 0.100, 0.101, 0.099]
    dev = FakeDevice([0.1, 0.1] + windows_of(per_window) + [0.1] * 30)
    tp = run(dev, monkeypatch, target_spread=0.03)
    tokens = 3 * TOKENS
    assert tp.stable is True and tp.settled == 3
    assert tp.windows == pytest.approx([tokens / (3 * c) for c in per_window])   # all kept, in order
    assert tp.settled_windows == pytest.approx(tp.windows[-3:])
    assert tp.tokens_per_s == pytest.approx(tokens / 0.3)                        # median of the settled
    assert tp.tokens_per_s > statistics.median(tp.windows)         # the plain median of all would lie
    assert tp.spread <= 0.03 and tp.step_time_s == pytest.approx(0.1)
    assert dev.steps == 2 + 3 * len(per_window)                    # stopped as soon as it settled


def test_a_step_that_never_settles_is_reported_unstable(monkeypatch):
    per_window = [0.1, 0.2] * 10                                   # 2x apart, forever
    dev = FakeDevice([0.1, 0.1] + windows_of(per_window))
    tp = run(dev, monkeypatch, target_spread=0.03, max_windows=6)
    assert tp.stable is False and len(tp.windows) == 6 and tp.settled == 3
    assert tp.tokens_per_s == pytest.approx(statistics.median(tp.windows[-3:]))
    assert tp.spread > 0.03 and "DID NOT SETTLE" in str(tp)


def test_default_max_windows(monkeypatch):
    dev = FakeDevice([0.1, 0.1] + windows_of([0.1, 0.2] * 20))
    tp = run(dev, monkeypatch, windows=2)
    assert not tp.stable and len(tp.windows) == MIN_MAX_WINDOWS
    dev = FakeDevice([0.1, 0.1] + windows_of([0.1, 0.2] * 40, timed=1))
    tp = run(dev, monkeypatch, timed=1, windows=5)
    assert not tp.stable and len(tp.windows) == 3 * 5                # max(10, 3 * windows)


def test_measure_settled_measures_once_more_when_unsettled():
    class T:
        def __init__(self, stable):
            self.stable = stable
    calls = []

    def measure_(*outcomes):
        it = iter(outcomes)
        return lambda: calls.append(1) or next(it)
    t, again = measure_settled(measure_(T(True), T(True)))
    assert t.stable and again is False and len(calls) == 1
    calls.clear()
    first, second = T(False), T(True)
    t, again = measure_settled(measure_(first, second))
    assert t is second and again is True and len(calls) == 2
    calls.clear()
    last = T(False)                           # still unsettled: reported as such, no third try
    t, again = measure_settled(measure_(T(False), last, T(True)))
    assert t is last and again is True and len(calls) == 2


# -- the guards --------------------------------------------------------------------------------------------
def test_compile_during_warmup_is_fine(monkeypatch):
    dev = FakeDevice([0.1] * 20)
    dev.compile_at = {1, 2}
    assert run(dev, monkeypatch).tokens_per_s > 0


def test_compile_inside_a_window_raises(monkeypatch):
    dev = FakeDevice([0.1] * 20)
    dev.compile_at = {7}                   # warm-up 1-2, window 1: 3-5, window 2: 6-8
    with pytest.raises(RecompileError, match=r"1 compilation\(s\).*timed window 2 "):
        run(dev, monkeypatch)


def test_compile_in_a_window_opened_to_settle_raises(monkeypatch):
    dev = FakeDevice([0.1, 0.1] + windows_of([0.5, 0.1, 0.1, 0.1, 0.1, 0.1]))
    dev.compile_at = {2 + 3 * 3 + 1}       # first step of window 4 (opened because 1-3 did not settle)
    with pytest.raises(RecompileError, match="timed window 4 "):
        run(dev, monkeypatch)


def test_same_batch_twice_raises(monkeypatch):
    dev = FakeDevice([0.1] * 20)
    one = Batch()

    def cached():
        while True:
            yield one, one
    with pytest.raises(StaleBatchError, match="same batch twice"):
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


class Positioned:
    """A stream that says where it is (as perfladder's streams do) -- and can get stuck."""

    def __init__(self, stuck_after=None):
        self.n, self.stuck_after, self.position = 0, stuck_after, None

    def __iter__(self):
        return self

    def __next__(self):
        self.n += 1
        at = self.n if self.stuck_after is None else min(self.n, self.stuck_after)
        self.position = (0, 0, at)
        return Batch(), Batch()            # new objects every time: identity cannot tell


def test_stale_batch_by_position(monkeypatch):
    dev = FakeDevice([0.1] * 30)
    assert run(dev, monkeypatch, source=Positioned()).tokens_per_s > 0
    dev = FakeDevice([0.1] * 30)
    with pytest.raises(StaleBatchError, match=r"position \(0, 0, 4\)"):
        run(dev, monkeypatch, source=Positioned(stuck_after=4))   # stuck inside window 1


def same_content():
    while True:
        yield Batch(content="the one batch"), Batch()


def test_stale_batch_by_content_fingerprint_in_warmup(monkeypatch):
    """One cached batch served under new objects (no position): its content is the same; the
    fingerprint (a host read) is taken in warm-up and after the last window, never inside a
    timed window."""
    dev = FakeDevice([0.1] * 30)
    with pytest.raises(StaleBatchError, match="same content"):
        run(dev, monkeypatch, source=same_content(), fingerprint=lambda X: X.content)
    reads = []
    dev = FakeDevice([0.1] * 30)
    tp = run(dev, monkeypatch, warmup=4, fingerprint=lambda X: reads.append(len(dev.log)) or X.content)
    syncs = [i for i, (kind, _) in enumerate(dev.log) if kind == "sync"]
    assert tp.stable and len(reads) == 4 + 2                   # 4 in warm-up, the last two after
    assert all(r <= syncs[0] or r > syncs[-1] for r in reads)  # none inside a window


@pytest.mark.parametrize("warmup", [0, 1])
def test_stale_content_is_refused_whatever_the_warmup(monkeypatch, warmup):
    """Too short a warm-up to compare two batches (JAX's un-jitted R0 warms up one step): the
    last two batches of the measurement are compared after its last window."""
    dev = FakeDevice([0.1] * 30)
    with pytest.raises(StaleBatchError, match="last two batches"):
        run(dev, monkeypatch, warmup=warmup, source=same_content(), fingerprint=lambda X: X.content)
    dev = FakeDevice([0.1] * 30)
    assert run(dev, monkeypatch, warmup=warmup, fingerprint=lambda X: X.content).stable


def test_ragged_batch_inside_windows_raises(monkeypatch):
    dev = FakeDevice([0.1] * 20)
    shapes = [(B, T)] * 6 + [(B - 1, T)]   # the 5th timed batch is a ragged tail
    with pytest.raises(BatchShapeError, match=r"\(4, 8\) to \(3, 8\) inside timed window 2"):
        run(dev, monkeypatch, source=stream(shapes))


@pytest.mark.parametrize("kw, name", [
    (dict(warmup=-1), "warmup=-1"), (dict(timed=0), "timed=0"), (dict(windows=1.5), "windows=1.5"),
    (dict(windows=True), "windows=True"), (dict(max_windows=2), "max_windows=2"),
    (dict(target_spread=0), "target_spread=0"), (dict(target_spread=1.0), "target_spread=1.0"),
    (dict(target_spread=True), "target_spread=True"),
])
def test_bad_arguments(monkeypatch, kw, name):
    dev = FakeDevice([0.1] * 20)
    with pytest.raises(ValueError, match=name.replace("(", r"\(")):
        run(dev, monkeypatch, **kw)


# -- window_s: a slow step gets shorter windows, priced by a pilot after the warm-up -------------
def test_window_s_shortens_the_windows_of_a_slow_step_after_a_synced_pilot(monkeypatch):
    dev = FakeDevice([0.5] * 200)                  # 0.5 s per step: 20 steps would take 10 s
    tp = run(dev, monkeypatch, warmup=2, timed=20, windows=3, window_s=2.0)
    assert tp.steps_per_window == 4 and tp.seconds == pytest.approx([2.0] * 3)
    assert tp.extra["pilot"] == {"steps": 3, "step_s": pytest.approx(0.5), "window_s": 2.0,
                                 "timed_asked": 20}
    syncs = [n for kind, n in dev.log if kind == "sync"]
    assert syncs == [2, 5, 9, 13, 17]              # warm-up, pilot, then each 4-step window
    assert tp.tokens_per_window == 4 * TOKENS and tp.warmup == 2 + 3     # the pilot warmed up too
    from perfladder.measure.evidence import Timing
    assert Timing.of(tp).window_s == 2.0 and Timing.of(run(FakeDevice([0.1] * 50), monkeypatch)).window_s is None


def test_window_s_never_lengthens_a_window_nor_cuts_it_below_the_minimum(monkeypatch):
    fast = run(FakeDevice([0.01] * 200), monkeypatch, timed=5, window_s=2.0)
    assert fast.steps_per_window == 5 and fast.extra["pilot"]["timed_asked"] == 5
    slow = run(FakeDevice([3.0] * 200), monkeypatch, timed=5, window_s=2.0)
    assert slow.steps_per_window == timing.MIN_WINDOW_STEPS
    assert "pilot" not in run(FakeDevice([0.5] * 200), monkeypatch, timed=20).extra   # off by default


@pytest.mark.parametrize("bad", [0, -1.0, True, "2"])
def test_window_s_must_be_positive_seconds(monkeypatch, bad):
    with pytest.raises((ValueError, TypeError), match="window_s"):
        run(FakeDevice([0.1] * 50), monkeypatch, window_s=bad)


def test_window_settings_are_one_checked_record_with_the_timers_defaults():
    s = timing.WindowSettings()
    assert (s.warmup, s.timed, s.windows) == (timing.WARMUP, timing.TIMED, timing.WINDOWS)
    assert s.target_spread == timing.DEFAULT_TARGET_SPREAD and s.most_windows == timing.MIN_MAX_WINDOWS
    assert timing.window_settings(s, windows=5).most_windows == 15      # derived from windows
    with pytest.raises(TypeError, match="warmpu: not a window setting; valid: warmup, timed"):
        timing.window_settings(warmpu=3)

    class Config:                                   # what WindowSettings.of reads of a LadderConfig
        windows, target_spread, max_windows, timing_budget_s, window_s = 4, 0.02, 20, 60.0, 1.5

        def warmup_steps(self, b):
            return b // 2

        def timed_steps(self, b):
            return b
    got = timing.WindowSettings.of(Config(), 16, timed=3)
    assert got == timing.WindowSettings(warmup=8, timed=3, windows=4, target_spread=0.02,
                                        max_windows=20, budget_s=60.0, window_s=1.5)
