"""R5's all-reduce gate in JAX (the rule: ``perfladder.measure.allreduce``).

On a mesh the step is the single-device one and the compiler inserts the collectives, so the
gradient is checked as the laid-out state computes it: ``nnx.grad`` of the step's loss,
compiled over the placed model (replicated or FSDP-sharded, on one process's devices or on
every process's: ``jax.distributed``) and the global batch sharded on ``'data'``. What each
device holds of that gradient -- every array's shard on it -- is compared with the same part
of the single-device gradient of the whole global batch, computed by a fresh model of the
same recipe and seed one device's rows at a time (so only the reduction differs).
"""
from __future__ import annotations

from typing import Callable

import jax
import numpy as np
from flax import nnx

from perfladder.jax.step import loss_fn
from perfladder.measure.allreduce import allreduce_gate
from perfladder.measure.evidence import Gate

__all__ = ["mesh_grads", "reference_grads", "host_rows", "check_allreduce", "precision_of",
           "allreduce_at_start"]


@nnx.jit
def _grads(model, X, Y):
    return nnx.grad(loss_fn)(model, X, Y)


def mesh_grads(model, X, Y) -> list:
    """The gradient of the mean loss over the global batch ``(X, Y)``, as the laid-out
    ``model`` computes it: one array per parameter, sharded as the compiler placed it."""
    return jax.tree.leaves(_grads(model, X, Y))


def host_rows(X) -> np.ndarray:
    """A global array's rows on this host: every process's (gathered) when it spans several."""
    if X.is_fully_addressable:
        return np.asarray(X)
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(X, tiled=True))


def reference_grads(model, X: np.ndarray, Y: np.ndarray, chunks: int) -> list[np.ndarray]:
    """The single-device gradient of all rows of ``X`` / ``Y`` (host arrays) by ``model``, as
    the mean of ``chunks`` equal chunks' gradients (each device's share: the same shapes the
    devices compute, and no k-times batch on one device)."""
    total = None
    for Xc, Yc in zip(np.split(X, chunks), np.split(Y, chunks)):
        g = [np.asarray(a, np.float64) for a in jax.tree.leaves(_grads(model, Xc, Yc))]
        total = g if total is None else [t + a for t, a in zip(total, g)]
    return [t / chunks for t in total]


def compare(got: list, want: list[np.ndarray], *, precision: str, ranks: int) -> list[Gate]:
    """The gate for every local device: what it holds of ``got`` (its shard of each array)
    against the same part of ``want``. ``AllReduceGateError`` at the first device past
    tolerance."""
    sums: dict = {}
    for g, w in zip(got, want):
        for shard in g.addressable_shards:
            a, b = np.asarray(shard.data, np.float64).ravel(), w[shard.index].ravel()
            s = sums.setdefault(shard.device, [0.0, 0.0, 0.0])
            s[0] += float(a @ b)
            s[1] += float(b @ b)
            s[2] += float((a - b) @ (a - b))
    return [allreduce_gate(gr, rr, np.sqrt(dd), precision=precision, ranks=ranks,
                           who=f"device {d.id}")
            for d, (gr, rr, dd) in sorted(sums.items(), key=lambda kv: kv[0].id)]


def precision_of(recipe) -> str:
    """The tolerance's precision of a recipe: its compute dtype (fp32 matmuls as TF32 on a GPU)."""
    if str(recipe.dtype) == "bfloat16":
        return "bf16"
    return "tf32" if jax.devices()[0].platform == "gpu" else "fp32"


def check_allreduce(model, X, Y, reference: Callable[[], object], *, precision: str) -> list[Gate]:
    """R5's all-reduce gate at the start of a mesh run, before the first step: ``model`` (laid
    out) on the global batch ``(X, Y)`` against ``reference()`` (a fresh, unplaced model of the
    same recipe and initial weights). Returns each local device's evidence;
    ``AllReduceGateError`` if any local device's gradient is not the combined batch's."""
    k = len(X.sharding.device_set)
    want = reference_grads(reference(), host_rows(X), host_rows(Y), k)
    return compare(mesh_grads(model, X, Y), want, precision=precision, ranks=k)


def allreduce_at_start(rep, X, Y) -> list[dict]:
    """The gate for a launch's ``Replica`` ``rep`` (laid out, not yet stepped) on the global
    batch ``(X, Y)``, against ``rep.fresh_model()``: each local device's evidence, as dicts."""
    return [g.to_dict() for g in check_allreduce(rep.model, X, Y, rep.fresh_model,
                                                 precision=precision_of(rep.recipe))]
