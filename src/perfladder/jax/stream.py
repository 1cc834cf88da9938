"""Fresh, constant-shape batches, shuffled and gathered on the device.

The whole split (a few MB of int32 token windows) is copied to the device once. Every
epoch draws a new ``jax.random.permutation``; each batch is one jitted gather of
``batch_size`` rows of that permutation, so producing a batch costs one dispatch and no
host work. Only whole batches are yielded (the ragged tail of an epoch is dropped), so a
jitted step sees one shape and compiles once. ``Batches.position`` counts the batches
yielded, so the timer can tell a fresh batch from a repeated one without reading it.
"""
from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import jax
import jax.numpy as jnp

from perfladder.data import TimeMachine, check_batch_size

SPLITS = ("train", "val")


@partial(jax.jit, static_argnames=("batch_size",))
def _gather(X, Y, perm, start, *, batch_size):
    idx = jax.lax.dynamic_slice_in_dim(perm, start, batch_size)  # (B,)
    return jnp.take(X, idx, axis=0), jnp.take(Y, idx, axis=0)      # (B, T) each


def batches(data: TimeMachine, batch_size: int, seed: int = 0, split: str = "train",
            sharding=None) -> "Batches":
    """Infinite stream of ``(X, Y)`` int32 batches of shape ``(batch_size, num_steps)``.

    ``sharding``: an optional ``jax.sharding.NamedSharding`` to lay every batch out with
    (e.g. split along a ``'data'`` mesh axis); the split is then staged replicated on the
    sharding's devices and each device gathers its own rows.
    Errors (bad split, a batch larger than the split) are raised here, not at first ``next``.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not valid; valid choices: {SPLITS}")
    X, Y = data.train_arrays() if split == "train" else data.val_arrays()
    # the windows it draws from: the learning check's record
    rows = data.rows_of(X) if hasattr(data, "rows_of") else None
    per_epoch = check_batch_size(batch_size, len(X))
    batch_size = int(batch_size)
    if sharding is None:
        gather = partial(_gather, batch_size=batch_size)
        X, Y = jnp.asarray(X), jnp.asarray(Y)                       # staged once, (N, T)
    else:
        mesh = getattr(sharding, "mesh", None)
        if mesh is None or not hasattr(sharding, "shard_shape"):
            raise ValueError(f"sharding must be a jax.sharding.NamedSharding, got {sharding!r}")
        try:
            sharding.shard_shape((batch_size,) + X.shape[1:])
        except ValueError as e:   # IndivisibleError subclasses ValueError
            raise ValueError(f"batch_size={batch_size} does not split evenly over {sharding}: {e}") from e
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        X, Y = jax.device_put(X, replicated), jax.device_put(Y, replicated)
        gather = jax.jit(partial(_gather.__wrapped__, batch_size=batch_size),
                         out_shardings=(sharding, sharding))
    stream = Batches(X, Y, gather, per_epoch, batch_size, seed)
    stream.rows = rows
    return stream


class Batches(Iterator):
    """The infinite ``(X, Y)`` stream of ``batches``; ``position`` = batches yielded so far."""

    def __init__(self, X, Y, gather, per_epoch: int, batch_size: int, seed: int):
        self._X, self._Y, self._gather = X, Y, gather
        self.per_epoch, self.batch_size = per_epoch, batch_size
        self._root, self._order = jax.random.key(seed), None
        self.position = 0

    def __next__(self) -> tuple[jax.Array, jax.Array]:
        epoch, b = divmod(self.position, self.per_epoch)
        if b == 0:   # a fresh permutation of the split every epoch, (N,)
            perm = jax.random.permutation(jax.random.fold_in(self._root, epoch), self._X.shape[0])
            self._order = perm.astype(jnp.int32)
        self.position += 1
        return self._gather(self._X, self._Y, self._order, b * self.batch_size)

    def __repr__(self) -> str:
        return (f"Batches(batch_size={self.batch_size}, per_epoch={self.per_epoch}, "
                f"position={self.position})")
