"""The chapter's idiom on the JAX side: ``from perfladder import jax as d2l``.

    data = d2l.TimeMachine(tokenization='char', num_steps=128, batch_size=64)
    V = len(data.vocab)
    model = d2l.GPT(V, num_blks=6, num_hiddens=512, rngs=nnx.Rngs(0))
    for X, Y in data.train_dataloader():           # int32 jax arrays, (B, T) each
        ...
    d2l.plt.bar(...)                               # matplotlib.pyplot

``d2l.GPT`` is ``perfladder.jax.GPT``, which takes the chapter's ``vocab_size`` and keywords
as well as a ``GPTConfig``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from perfladder import data as _data
from perfladder.checks import check_int
from perfladder.idiom import BatchLoader


class TimeMachine(_data.TimeMachine):
    """``perfladder.data.TimeMachine`` with d2l's loaders: batches of int32 jax arrays.

    ``X``, ``Y``, ``vocab``, ``num_train``, ``num_val``, ``batch_size`` are those of
    ``perfladder.data.TimeMachine`` (``X``/``Y`` numpy views of every window).
    ``seed`` seeds the training loader's shuffles: each pass draws a new order from it.
    """

    def __init__(self, batch_size: int, num_steps: int, num_train: int = 10000,
                 num_val: int = 5000, tokenization: str = "char", path=None, seed: int = 0):
        super().__init__(batch_size, num_steps, num_train=num_train, num_val=num_val,
                         tokenization=tokenization, path=path)
        self._rng = np.random.default_rng(check_int("seed", seed, 0))

    def train_dataloader(self) -> BatchLoader:
        """The training split in ``batch_size`` minibatches, reshuffled on every pass."""
        X, Y = self.train_arrays()
        return BatchLoader(X, Y, self.batch_size, True, self._rng.permutation, jnp.asarray)

    def val_dataloader(self) -> BatchLoader:
        """The validation split in ``batch_size`` minibatches, in order."""
        X, Y = self.val_arrays()
        return BatchLoader(X, Y, self.batch_size, False, self._rng.permutation, jnp.asarray)


def _gpus() -> list:
    try:
        return jax.devices("gpu")
    except RuntimeError:      # no GPU backend in this jaxlib, or none initialised
        return []


def num_gpus() -> int:
    """How many GPUs JAX sees."""
    return len(_gpus())


def try_gpu(i: int = 0):
    """GPU ``i`` if there is one, else the first CPU device."""
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        raise ValueError(f"i={i!r} must be a device index >= 0")
    gpus = _gpus()
    return gpus[i] if len(gpus) > i else jax.devices("cpu")[0]
