"""The host time a JAX profile records is the host's cost of one step: each step issued with
nothing queued ahead of it, so a call that would wait on the device (the runtime bounds how
many steps may be in flight) never counts the device's time as the host's."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from perfladder.jax import profile as jp

HOST, DEVICE = 0.004, 0.017        # seconds: what Python takes to issue a step, what the device takes


class QueuedRuntime:
    """A fake device behind a fake clock: a call costs HOST; a call made while an earlier step
    is still in flight waits for it first (DEVICE), as a runtime with a bounded queue does."""

    def __init__(self):
        self.clock, self.in_flight, self.waited = 0.0, 0, 0

    def step(self, X, Y):
        self.clock += HOST
        if self.in_flight:
            self.clock += DEVICE
            self.waited += 1
        self.in_flight = 1
        return X

    def sync(self, out):
        self.clock += DEVICE * self.in_flight
        self.in_flight = 0


def test_issue_time_is_the_hosts_and_never_exceeds_the_step(monkeypatch):
    rt = QueuedRuntime()
    monkeypatch.setattr(jp, "time", SimpleNamespace(perf_counter=lambda: rt.clock))
    stream = iter(lambda: (0, 0), None)
    ms = jp.issue_ms(rt.step, stream, 6, sync=rt.sync)
    assert rt.waited == 0                              # every call found the device idle
    assert ms == pytest.approx(1e3 * HOST)             # the host's own cost of a step
    assert ms < 1e3 * max(HOST, DEVICE)                # the step it issues takes at least this


def test_host_overhead_reports_the_hosts_cost_beside_the_pace(monkeypatch):
    """``host_overhead`` (B3's evidence): the host's cost per step
    is measured with nothing queued; the back-to-back pace beside it may include the device."""
    rt = QueuedRuntime()
    monkeypatch.setattr(jp, "time", SimpleNamespace(perf_counter=lambda: rt.clock))
    h = jp.host_overhead(rt.step, iter(lambda: (0, 0), None), 4, sync=rt.sync)
    assert h["dispatch_ms_per_step"] == pytest.approx(1e3 * HOST)
    assert h["dispatch_ms_per_step"] <= h["unsynced_ms_per_step"]
