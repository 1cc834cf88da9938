"""What the chapter's idiom needs in both frameworks (no framework imports).

The chapter's code is written against ``d2l``: ``d2l.TimeMachine(...)`` with its
``train_dataloader()``, ``d2l.GPT(vocab_size, ...)``, ``d2l.try_gpu()``, ``d2l.num_gpus()``
and ``d2l.plt``. ``perfladder.torch`` and ``perfladder.jax`` provide those names (see their
``idiom`` modules); this module holds the part they share: the minibatch loader, and the
lazy ``plt``.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from perfladder.checks import check_int


class BatchLoader:
    """Minibatches ``(X, Y)`` of a split, like the data loaders of d2l's ``TimeMachine``.

    Each pass (each ``iter()``) visits every example once: in a new random order when
    ``shuffle`` (the order comes from ``permutation(n)``, so each framework draws it from its
    own seeded generator), in order otherwise. The last batch holds the remainder and may be
    shorter than ``batch_size``, as with d2l; a compiled step wants whole batches only
    (``perfladder.torch.batches`` / ``perfladder.jax.batches`` give those).
    ``convert(array)`` turns each gathered int32 numpy batch into the framework's array.
    """

    def __init__(self, X: np.ndarray, Y: np.ndarray, batch_size: int, shuffle: bool,
                 permutation: Callable[[int], np.ndarray], convert: Callable[[np.ndarray], object]):
        if len(X) != len(Y):
            raise ValueError(f"X and Y hold different numbers of examples: {len(X)} and {len(Y)}")
        self.X, self.Y = X, Y
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.shuffle, self.permutation, self.convert = bool(shuffle), permutation, convert

    def __len__(self) -> int:
        return math.ceil(len(self.X) / self.batch_size)

    def __iter__(self):
        n, B = len(self.X), self.batch_size
        order = np.asarray(self.permutation(n)) if self.shuffle else np.arange(n)   # (n,)
        for start in range(0, n, B):
            idx = order[start:start + B]                                            # (<= B,)
            yield self.convert(self.X[idx]), self.convert(self.Y[idx])              # (<= B, T) each


def lazy_attribute(module: str, name: str):
    """A framework subpackage's ``__getattr__``: ``plt`` is matplotlib.pyplot, imported on
    first use (it is slow to import and most uses of the package never plot)."""
    if name == "plt":
        import matplotlib.pyplot as plt
        return plt
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
