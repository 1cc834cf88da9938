"""Fresh, constant-shape batches, shuffled and gathered on the device.

The whole split (a few MB of int32 token windows) is copied to the device once. Every
epoch draws a new ``jax.random.permutation``; each batch is one jitted gather of
``batch_size`` rows of that permutation, so producing a batch costs one dispatch and no
host work. Only whole batches are yielded (the ragged tail of an epoch is dropped), so a
jitted step sees one shape and compiles once.
"""
from __future__ import annotations

from functools import partial
from typing import Iterator

import jax
import jax.numpy as jnp

from ..data import TimeMachine, check_batch_size

SPLITS = ("train", "val")


@partial(jax.jit, static_argnames=("batch_size",))
def _gather(X, Y, perm, start, *, batch_size):
    idx = jax.lax.dynamic_slice_in_dim(perm, start, batch_size)  # (B,)
    return jnp.take(X, idx, axis=0), jnp.take(Y, idx, axis=0)      # (B, T) each


def batches(data: TimeMachine, batch_size: int, seed: int = 0, split: str = "train",
            sharding=None) -> Iterator[tuple[jax.Array, jax.Array]]:
    """Infinite stream of ``(X, Y)`` int32 batches of shape ``(batch_size, num_steps)``.

    ``sharding``: an optional ``jax.sharding.NamedSharding`` to lay every batch out with
    (e.g. split along a ``'data'`` mesh axis); the split is then staged replicated on the
    sharding's devices and each device gathers its own rows.
    Errors (bad split, a batch larger than the split) are raised here, not at first ``next``.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not valid; valid choices: {SPLITS}")
    X, Y = data.train_arrays() if split == "train" else data.val_arrays()
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
    return _stream(X, Y, gather, per_epoch, batch_size, seed)


def _stream(X, Y, gather, per_epoch, batch_size, seed):
    root, n, epoch = jax.random.key(seed), X.shape[0], 0
    while True:
        order = jax.random.permutation(jax.random.fold_in(root, epoch), n)  # (N,) this epoch's
        order = order.astype(jnp.int32)
        epoch += 1
        for b in range(per_epoch):
            yield gather(X, Y, order, b * batch_size)
