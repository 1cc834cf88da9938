"""What a timed window holds (``perfladder.measure.timing.Window``): every step's draw from the
stream, the steps, and the wait for the device -- its end stamp read after the sync returned.

A fake clock that only the test moves: each draw from the stream costs ``DRAW_S`` of host
time, each step ``STEP_S`` to dispatch and ``WORK_S`` of device work that only the sync waits
out. A window's seconds are then known exactly; a timer that drew its batches before opening
the window, or read its end stamp before the sync, would report fewer. The planted loops
below use the timer's own ``Window`` and ``Draws`` the wrong way round, and are refused.
"""
from __future__ import annotations

import pytest

from perfladder.measure import timing
from perfladder.measure.draws import Draws
from perfladder.measure.timing import SyncError, TimerHooks, Window, WindowError, measure

B, T = 4, 8
DRAW_S, STEP_S, WORK_S = 0.004, 0.001, 0.02


class Clock:
    """Host time moves with draws and dispatches; device work waits in ``pending`` for a sync."""

    def __init__(self):
        self.now, self.pending, self.syncs = 0.0, 0.0, 0

    def perf_counter(self):
        return self.now

    def stream(self):
        while True:
            self.now += DRAW_S                     # gathering and shipping a batch
            yield Batch(), Batch()

    def step(self, X, Y):
        self.now += STEP_S
        self.pending += WORK_S
        return self.pending

    def sync(self, out):
        self.now, self.pending = self.now + self.pending, 0.0
        self.syncs += 1


class Batch:
    shape = (B, T)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(timing, "time", c)
    return c


def hooks(c):
    return TimerHooks(sync=c.sync, compile_count=lambda: 0, num_tokens=lambda X: B * T,
                      shape_of=lambda X: X.shape)


@pytest.mark.parametrize("window_s", [None, 0.1])
def test_a_window_holds_every_draw_every_step_and_the_wait(clock, window_s):
    tp = measure(clock.step, clock.stream(), hooks(clock),
                 timing.window_settings(warmup=2, timed=6, windows=3, window_s=window_s))
    per_step = DRAW_S + STEP_S + WORK_S
    assert tp.seconds == pytest.approx([tp.steps_per_window * per_step] * len(tp.windows))
    assert tp.tokens_per_s == pytest.approx(B * T / per_step)
    if window_s is not None:                       # the pilot is priced the same way
        assert tp.extra["pilot"]["step_s"] == pytest.approx(per_step)


def planted(clock, order):
    """One window of 3 steps timed with the timer's own pieces, in ``order``."""
    draws = Draws(clock.stream())
    w = Window(clock.sync, draws)
    if order == "drawn before the window opened":
        batches = [draws() for _ in range(3)]
        w.open()
        for X, Y in batches:
            out = clock.step(X, Y)
        w.sync(out)
        return w.close(3, "timed window 1")
    w.open()
    for _ in range(3):
        out = clock.step(*draws())
    if order == "end stamp before the sync":
        dt = w.close(3, "timed window 1")
        w.sync(out)
        return dt
    if order == "sync before the last step":
        w.sync(out)
        out = clock.step(*draws())
        return w.close(3, "timed window 1")
    w.sync(out)
    return w.close(3, "timed window 1")


def test_the_honest_order_is_timed_whole(clock):
    assert planted(clock, "honest") == pytest.approx(3 * (DRAW_S + STEP_S + WORK_S))


@pytest.mark.planted
def test_batches_drawn_before_the_window_opened_are_refused(clock):
    with pytest.raises(WindowError, match="timed window 1 timed 3 steps but drew 0 batches inside it"):
        planted(clock, "drawn before the window opened")


@pytest.mark.planted
@pytest.mark.parametrize("order, said", [("end stamp before the sync", "never called"),
                                         ("sync before the last step", "followed by more draws")])
def test_an_end_stamp_read_before_the_sync_returned_is_refused(clock, order, said):
    with pytest.raises(SyncError, match=f"timed window 1: its end stamp was read before its sync returned \\(sync {said}"):
        planted(clock, order)


def test_a_window_closed_without_being_opened_is_refused(clock):
    with pytest.raises(WindowError, match="closed without being opened"):
        Window(clock.sync, Draws(clock.stream())).close(1, "the pilot")
