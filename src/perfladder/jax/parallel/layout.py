"""Data parallelism by annotation: a 1-D mesh, replicated (or FSDP-sharded) state, sharded batch.

The training step is not touched: the arrays carry their layouts and the compiler (GSPMD)
inserts the collectives -- an allreduce of the gradients for plain data parallelism, and
all-gathers / reduce-scatters when the parameters themselves are sharded (FSDP).
"""
from __future__ import annotations

import time

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from perfladder.checks import check_int

AXIS = "data"


def make_data_mesh(k: int):
    """A ``('data',)`` mesh over the first ``k`` devices; a clear error if there are fewer."""
    n = jax.device_count()
    check_int("k", k)
    if k > n:
        raise ValueError(f"k={k} devices requested but only {n} are visible "
                         f"({jax.devices()[0].platform}); valid choices: 1..{n}")
    devices = jax.devices()[:k]
    axis_type = getattr(getattr(jax.sharding, "AxisType", None), "Auto", None)
    if axis_type is not None:
        try:   # Auto: the compiler infers every layout we do not annotate (GSPMD semantics)
            return jax.make_mesh((k,), (AXIS,), axis_types=(axis_type,), devices=devices)
        except TypeError:
            pass
    return jax.sharding.Mesh(np.array(devices), (AXIS,))


def batch_sharding(mesh) -> NamedSharding:
    """Split the batch axis over the mesh."""
    return NamedSharding(mesh, P(AXIS))


def fsdp_spec(shape, k: int) -> P:
    """Shard an array along its largest dimension divisible by ``k``; replicate it otherwise."""
    for d in sorted(range(len(shape)), key=lambda i: -shape[i]):
        if shape[d] % k == 0 and shape[d] >= k:
            spec = [None] * len(shape)
            spec[d] = AXIS
            return P(*spec)
    return P()


def place_state(mesh, *nodes, fsdp: bool = False) -> None:
    """R5: lay out the arrays of ``nodes`` (model, optimizer) on ``mesh``, in place.

    ``fsdp=False``: every array replicated (data parallelism). ``fsdp=True``: every array
    sharded along its largest ``k``-divisible dimension (parameters and Adam moments alike).
    """
    k = mesh.devices.size

    def put(x):
        if not hasattr(x, "shape"):
            return x
        spec = fsdp_spec(x.shape, k) if fsdp else P()
        return jax.device_put(x, NamedSharding(mesh, spec))

    for node in nodes:
        nnx.update(node, jax.tree.map(put, nnx.state(node)))


def shardings_of(node) -> dict[str, str]:
    """``{path: PartitionSpec}`` of every array in ``node`` (to show what FSDP did)."""
    out = {}
    for path, leaf in nnx.to_flat_state(nnx.state(node)):
        value = getattr(leaf, "value", leaf)
        s = getattr(value, "sharding", None)
        out["/".join(map(str, path))] = str(getattr(s, "spec", s))
    return out


# -- what the devices of a mesh measure ---------------------------------------------------------------
def peak_mem_bytes(devices) -> list:
    """``peak_bytes_in_use`` of each device (None where the backend does not report it)."""
    out = []
    for d in devices:
        stats = d.memory_stats() if hasattr(d, "memory_stats") else None
        out.append(int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None)
    return out


def allreduce_bus_bw(mesh, numel: int, iters: int = 5, warmup: int = 2) -> float:
    """Measured all-reduce bus bandwidth (bytes/s, busbw convention) of ``numel`` fp32 values
    per device: ``psum`` over the mesh's ``'data'`` axis, timed on the host."""
    k = mesh.devices.size
    sharding = NamedSharding(mesh, P(AXIS))
    ones = np.ones((1, numel), np.float32)
    x = jax.make_array_from_callback((k, numel), sharding, lambda idx: ones)   # (k, numel), a row each
    reduce = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, AXIS), mesh=mesh,
                                   in_specs=P(AXIS), out_specs=P(AXIS)))
    for _ in range(warmup):
        x = reduce(x) * (1.0 / k)            # keep the values bounded
    jax.block_until_ready(x)
    t0 = time.perf_counter()
    for _ in range(iters):
        x = reduce(x)
    jax.block_until_ready(x)
    dt = (time.perf_counter() - t0) / iters
    return 2 * (k - 1) / k * 4 * numel / dt
