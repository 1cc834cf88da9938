"""The timer's draws from a stream, each one checked fresh (no framework imports).

A timed step must be fed a new batch, as a training run is: a stream that serves one cached
batch would time a step without the cost of producing its batch, and on a device a cached
batch may even be resident where a fresh one is not. ``Draws`` is how ``measure`` draws:

* every draw, by object identity and by the stream's own position (``stream.position``, which
  perfladder's streams advance per batch): the same batch twice in a row is refused;
* by content (``fingerprint``: a few rows of a batch as bytes, a host read), only where nothing
  is timed: each warm-up batch against the one before it (``check_content``), and the last
  two batches of the measurement (``finish``);
* across an epoch boundary, where the stream says how many batches an epoch holds
  (``stream.per_epoch``, as perfladder's streams do): the batch drawn first and the one drawn
  ``per_epoch`` draws later hold the same place in two epochs, and a stream that re-yields
  its first epoch's tensors serves the same batch there. They must be different objects
  (checked when drawn) and hold different content (checked after the last window). A
  measurement shorter than an epoch draws on, untimed, up to the boundary the first time it
  meets a stream, so the check runs whatever the measurement's length.

Each refusal is a ``StaleBatchError`` naming what was the same.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator


class StaleBatchError(RuntimeError):
    """The stream handed the timer the same batch twice in a row."""


class StreamEndedError(RuntimeError):
    """The stream ran out of batches before the measurement was done."""


# streams whose epoch boundary was already drawn to: a second measurement on one stream (JAX's
# labs keep one per batch size) does not draw a second untimed epoch
_CROSSED: "weakref.WeakSet" = weakref.WeakSet()


def _per_epoch(stream) -> int | None:
    n = getattr(stream, "per_epoch", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


class Draws:
    """``draw()`` -> the next ``(X, Y)`` of ``stream``, checked as the module docstring says;
    ``count``: batches drawn so far. ``fingerprint`` (None: content is not compared) reads a
    batch on the host; ``need`` is said when the stream ends too soon."""

    def __init__(self, stream: Iterator, fingerprint: Callable[[Any], bytes] | None = None,
                 need: str = ""):
        self.stream, self.fingerprint, self.need = stream, fingerprint, need
        self.count = 0
        self.per_epoch = _per_epoch(stream)
        self._prev = self._prev_pos = self._before_prev = self._prev_print = None
        self._first = self._boundary = None       # the first draw, and the one an epoch later

    def __call__(self):
        try:
            X, Y = next(self.stream)
        except StopIteration:
            raise StreamEndedError(f"the batch stream ended after {self.count} batches; {self.need}") from None
        self.count += 1
        pos = getattr(self.stream, "position", None)
        if X is self._prev or (pos is not None and pos == self._prev_pos):
            raise StaleBatchError("the stream yielded the same batch twice in a row "
                                  f"(position {pos}); time fresh batches, not one cached batch")
        self._before_prev, self._prev, self._prev_pos = self._prev, X, pos
        if self.count == 1:
            self._first = X
        elif self.per_epoch is not None and self.count == self.per_epoch + 1:
            if X is self._first:
                raise StaleBatchError(self._across_epochs("the same tensor object"))
            self._boundary = X
        return X, Y

    def check_content(self, X) -> None:
        """A warm-up batch's content against the warm-up batch before it (a host read)."""
        if self.fingerprint is None:
            return
        fp = self.fingerprint(X)
        if fp == self._prev_print:
            raise StaleBatchError("two consecutive batches have the same content; the stream "
                                  "serves one cached batch under new objects")
        self._prev_print = fp

    def finish(self) -> None:
        """After the last window (nothing timed any more): the last two batches' content, and
        the batches an epoch apart (drawn to, untimed, when the measurement was shorter)."""
        fp = self.fingerprint
        if fp is not None and self._before_prev is not None and fp(self._before_prev) == fp(self._prev):
            raise StaleBatchError("the last two batches of the measurement have the same content; "
                                  "the stream serves one cached batch under new objects")
        if self.per_epoch is None:
            return
        if self._boundary is None:
            if self.stream in _CROSSED:
                return
            while self.count <= self.per_epoch:
                self()
        first, boundary = self._first, self._boundary
        self._first = self._boundary = None
        if fp is not None and fp(first) == fp(boundary):
            raise StaleBatchError(self._across_epochs("the same content"))
        try:
            _CROSSED.add(self.stream)
        except TypeError:                          # a stream that takes no weak reference
            pass

    def _across_epochs(self, what: str) -> str:
        return (f"the batches {self.per_epoch} draws apart (stream.per_epoch={self.per_epoch}: the "
                f"same place in two epochs) are {what}: the stream re-yields an earlier epoch's "
                "cached batches instead of drawing a fresh permutation every epoch")
