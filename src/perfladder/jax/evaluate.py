"""Held-out loss by the reference implementation, and the learning check (JAX).

Whatever a rung's step does to be fast, its trained weights are judged by the plain fp32
``GPT`` (gather embedding, XLA attention, no checkpointing, fp32 matmuls at full precision)
with those weights loaded: a step that computed something else while training (attention
that sees the future) cannot pass by evaluating itself. The decision is framework-free:
``perfladder.measure.learning``.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from perfladder.data import TimeMachine
from perfladder.jax.gate_programs import gate_jit
from perfladder.jax.model import GPT
from perfladder.measure.learning import LearningCheck, train_and_check
from perfladder.measure.timing import Stopwatch

REFERENCE = ("the plain fp32 JAX GPT (gather embedding, XLA attention, no checkpointing, "
             "'highest' matmul precision) with the trained weights loaded")
EVAL_BATCH = 500          # windows per forward pass when evaluating


def reference_model(trained) -> GPT:
    """A plain fp32 GPT of ``trained``'s architecture holding copies of its parameters (the fp32
    masters; ``trained`` may compute in bf16, look up one-hot, checkpoint, ...)."""
    ref = GPT(trained.config, rngs=nnx.Rngs(0))
    params = nnx.state(trained, nnx.Param)
    nnx.update(ref, jax.tree.map(lambda a: jnp.asarray(a, jnp.float32).copy(), params))
    return ref


def _summed_loss_of(model, X, Y):
    logits = model(X).astype(jnp.float32)                                    # (b, T, V)
    flat = logits.reshape(-1, logits.shape[-1])                              # (b*T, V)
    return optax.softmax_cross_entropy_with_integer_labels(flat, Y.reshape(-1)).sum()


# the judge's program, compiled once without autotuning: it is not what any rung times
_summed_loss = gate_jit(_summed_loss_of)


def mean_loss(model, X: np.ndarray, Y: np.ndarray, batch_size: int = EVAL_BATCH) -> float:
    """Mean cross entropy (nats per token) of ``model`` over every row of ``X`` / ``Y`` (int
    arrays (N, T)), with full-precision fp32 matmuls."""
    total, count = 0.0, 0
    with jax.default_matmul_precision("highest"):
        for i in range(0, len(X), batch_size):
            x, y = jnp.asarray(X[i:i + batch_size]), jnp.asarray(Y[i:i + batch_size])   # (b, T)
            total += float(_summed_loss(model, x, y))
            count += y.size
    return total / count


def reference_val_loss(trained, data: TimeMachine) -> float:
    """The validation loss of ``trained``'s weights, computed by the reference model."""
    return mean_loss(reference_model(trained), *data.val_arrays())


def learning_check(step: Callable, stream, data: TimeMachine, *, model, steps: int,
                   window: int = 20, commit: Callable | None = None,
                   threshold: float | None = None, watch: Stopwatch | None = None) -> LearningCheck:
    """Train with ``step(X, Y) -> loss`` for ``steps`` steps on ``stream``; ``model`` is the
    model it trains, at its initial weights now. ``commit`` (e.g. ``SplitStep.commit``) writes
    the trained state back into ``model`` afterwards. The validation loss before and after is
    computed by the reference model; ``LearningCheck`` asserted (``LearningError`` if it fails).
    ``threshold`` defaults to ``perfladder.measure.learning.val_threshold`` of the training split.
    ``watch`` (a ``Stopwatch``) records the seconds of each part. The rows trained on and
    evaluated are recorded (``split_rows``, read off the arrays evaluated) and must not
    overlap (``HeldOutRowsError``)."""
    X_val, Y_val = data.val_arrays()

    def train():
        losses = [step(*next(stream)) for _ in range(steps)]                   # device scalars
        curve = np.asarray(jax.device_get(jnp.stack(losses)), np.float64).tolist()
        if commit is not None:
            commit()
        return curve

    return train_and_check(train, lambda: mean_loss(reference_model(model), X_val, Y_val),
                           data, stream, window=window, threshold=threshold, watch=watch,
                           evaluated_with=REFERENCE)
