"""The sync that closes every timed window waits for the device (PyTorch).

On CPU ``perfladder.torch.timer.sync`` is a no-op, so the timer is driven here through a fake
CUDA device whose step work completes only when ``torch.cuda.synchronize`` is called: the
planted per-step times come back only if every window is closed by a real synchronize, and
a sync that only queried the stream is refused by the ``ready`` check. On a GPU, sleeping
kernels of a known (event-timed) length must not be under-timed."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from perfladder.measure import timing
from perfladder.measure.timing import SyncError
from perfladder.torch import timer

B, T, STEP_S = 4, 8, 0.05


class FakeCuda:
    """A device queue: a step enqueues ``STEP_S`` of work; the clock moves only at synchronize."""

    def __init__(self):
        self.now, self.pending, self.syncs = 0.0, 0.0, 0

    def enqueue(self):
        self.pending += STEP_S

    def synchronize(self, device=None):
        self.now, self.pending = self.now + self.pending, 0.0
        self.syncs += 1

    def perf_counter(self):
        return self.now


@pytest.fixture
def dev(monkeypatch):
    d = FakeCuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", d.synchronize)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: SimpleNamespace(query=lambda: d.pending == 0.0))
    monkeypatch.setattr(timing, "time", d)             # measure reads time.perf_counter()
    return d


def stream():
    i = 0
    while True:
        i += 1
        X = torch.arange(B * T).reshape(B, T) + i        # new content every batch
        yield X, X


def step_on(d):
    def step(X, Y):
        d.enqueue()                                      # returns at once, like a CUDA launch
        return torch.zeros(())
    return step


def test_every_window_closes_with_a_real_synchronize(dev):
    tp = timer.throughput(step_on(dev), stream(), warmup=2, timed=3, windows=3, target_spread=0.5)
    assert dev.syncs == 1 + len(tp.windows)              # after warm-up, then once per window
    assert tp.seconds == pytest.approx([3 * STEP_S] * len(tp.windows))   # the work, all of it
    assert tp.tokens_per_s == pytest.approx(3 * B * T / (3 * STEP_S))


def test_a_sync_that_only_queries_is_refused(dev, monkeypatch):
    """The planted kind: a window closed by a query of the stream instead of a wait."""
    import dataclasses
    monkeypatch.setattr(timer, "HOOKS", dataclasses.replace(
        timer.HOOKS, sync=lambda _out=None: torch.cuda.current_stream().query()))
    with pytest.raises(SyncError, match="still busy"):
        timer.throughput(step_on(dev), stream(), warmup=2, timed=3, windows=3, target_spread=0.5)


GRADS_S, UPDATE_S = 0.02, 0.03


class Loss:
    """The loss a step returns: reading it (``item()``) waits for the work queued before it --
    the gradients -- and not for the optimizer's update queued after it."""

    def __init__(self, d):
        self.d = d

    def item(self):
        d = self.d
        d.now, d.pending = d.now + d.pending - UPDATE_S, UPDATE_S
        return 3.0


def test_the_update_queued_after_the_loss_is_inside_every_window(dev, monkeypatch):
    def step(X, Y):
        dev.pending += GRADS_S                           # forward and backward
        loss = Loss(dev)
        dev.pending += UPDATE_S                          # the optimizer step, after the loss
        return loss
    real, left = timing.Window.close, []

    def close(window, steps, what):                      # what the window left on the device
        left.append(dev.pending)
        return real(window, steps, what)
    monkeypatch.setattr(timing.Window, "close", close)
    tp = timer.throughput(step, stream(), warmup=2, timed=3, windows=3, target_spread=0.5)
    assert tp.seconds == pytest.approx([3 * (GRADS_S + UPDATE_S)] * len(tp.windows))
    assert left == [0.0] * len(tp.windows)


@pytest.mark.planted
def test_a_sync_on_the_loss_alone_is_refused(dev, monkeypatch):
    """The planted kind: the window closed by reading the loss (``loss.item()``), which waits
    for the gradients and not for the update."""
    import dataclasses
    monkeypatch.setattr(timer, "HOOKS", dataclasses.replace(timer.HOOKS, sync=lambda out: out.item()))

    def step(X, Y):
        dev.pending += GRADS_S + UPDATE_S
        return Loss(dev)
    with pytest.raises(SyncError, match="timed window 1 closed while the device was still busy"):
        timer.throughput(step, stream(), warmup=2, timed=3, windows=3, target_spread=0.5)


@pytest.mark.gpu
def test_a_window_of_sleeping_kernels_is_not_under_timed():
    """Each step launches sleeping kernels whose length CUDA events measured beforehand; the
    timer's windows must hold all of it (an asynchronous launch returns in microseconds)."""
    torch.cuda.init()
    cycles, per_step = 20_000_000, 4
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    start.record()
    for _ in range(per_step):
        torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    device_s = start.elapsed_time(end) / 1e3                 # one step's device work, seconds

    def step(X, Y):
        for _ in range(per_step):
            torch.cuda._sleep(cycles)
        return X

    def cuda_stream():
        for X, Y in stream():
            yield X.cuda(), Y.cuda()
    tp = timer.throughput(step, cuda_stream(), warmup=1, timed=3, windows=3, target_spread=0.5)
    # the host cost of a step is microseconds; the device's is device_s: a window that did not
    # wait would read about nothing
    assert min(tp.seconds) >= 0.9 * 3 * device_s, (tp.seconds, device_s)
