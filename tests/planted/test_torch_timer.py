"""Planted bugs around the PyTorch timer that only tests caught before Gates III, each now
refused at run time by a named check.

    bug                                                 caught by
    a stream re-yielding its first epoch (tensors)      Draws: the batches an epoch apart, at once
    the same, as clones (new tensors, same content)     Draws: their fingerprints, after the windows
    (a window closed by reading the loss:               SyncError, tests/torch/test_sync.py)
"""
from __future__ import annotations

import pytest
from _torch_gate_helpers import CFG, DATA

from perfladder.measure.timing import StaleBatchError
from perfladder.torch import timer
from perfladder.torch.stream import Batches, batches

pytestmark = pytest.mark.planted


class Replaying(Batches):
    """The planted stream: its first epoch drawn, then re-yielded (``clones``: as new tensors)."""
    clones = False

    def __next__(self):
        n = self.drawn = getattr(self, "drawn", -1) + 1
        if n < self.per_epoch:
            self.cache = getattr(self, "cache", []) + [super().__next__()]
            return self.cache[-1]
        epoch, i = divmod(n, self.per_epoch)
        self.position = (self.seed, epoch, i)              # it says it moves on
        X, Y = self.cache[i]
        return (X.clone(), Y.clone()) if self.clones else (X, Y)


def planted(clones):
    s = batches(DATA, CFG.big_batch, "cpu", seed=11)
    s.__class__ = type("Replaying", (Replaying,), {"clones": clones})
    return s


def step(X, Y):
    return (X - Y).sum()


@pytest.mark.parametrize("clones, said", [(False, "the same tensor object"), (True, "the same content")])
def test_a_stream_re_yielding_its_first_epoch_is_refused(clones, said):
    honest = batches(DATA, CFG.big_batch, "cpu", seed=11)
    t = timer.throughput(step, honest, warmup=1, timed=2, windows=2, target_spread=0.9)
    assert t.windows and honest.epoch == 1                       # drawn on past the boundary
    s = planted(clones)
    with pytest.raises(StaleBatchError, match=f"stream.per_epoch={s.per_epoch}.*are {said}"):
        timer.throughput(step, s, warmup=1, timed=2, windows=2, target_spread=0.9)
