"""The learning check of the fastest configuration: speed that breaks the model is not speed.

``learning_check`` trains the configuration from a fresh init on the training split and
reads the held-out validation loss before and after with the plain reference model (fp32,
``nnx.jit``, gather embedding, XLA attention) holding the same weights. It is one function,
so a stronger check can replace it.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..results import LearningCheck, smoothed_check
from .lab import JaxLab
from .recipe import Recipe
from .steps import loss_fn
from .stream import batches

LEARN_SEED_OFFSET = 1000   # the learning check's stream, away from the timed streams
VAL_FRACTION = 0.8         # trained validation loss must be under 0.8 ln(V); a uniform guess scores ln(V)
VAL_WINDOWS = 1024         # held-out windows evaluated, at most

_val_loss = nnx.jit(loss_fn)


def reference_model(lab: JaxLab):
    """The plain model: fp32, gather embedding, XLA attention, no remat; the lab's init."""
    return lab.model(Recipe(batch_size=1, dtype="float32"))


def val_loss(model, X: np.ndarray, Y: np.ndarray, chunk: int) -> float:
    """Mean loss over ``X`` in whole chunks of ``chunk`` windows (each (chunk, T))."""
    n = (len(X) // chunk) * chunk
    losses = [_val_loss(model, jnp.asarray(X[i:i + chunk]), jnp.asarray(Y[i:i + chunk]))
              for i in range(0, n, chunk)]
    return float(jnp.mean(jnp.stack(losses)))


def learning_check(lab: JaxLab, recipe: Recipe, steps: int | None = None,
                   window: int = 20) -> LearningCheck:
    """Train ``recipe`` for ``steps`` (default ``config.learn_steps``) from a fresh init.

    Raises ``AssertionError`` when the smoothed training loss does not fall or the
    validation loss does not end under the threshold. Losses stay on the device until the
    end (no host read per step).
    """
    steps = lab.config.learn_steps if steps is None else steps
    Xv, Yv = lab.data.val_arrays()
    Xv, Yv = Xv[:VAL_WINDOWS], Yv[:VAL_WINDOWS]
    chunk = min(len(Xv), recipe.batch_size)
    step = lab.build_step(recipe)
    stream = batches(lab.data, recipe.batch_size, seed=lab.config.seed + LEARN_SEED_OFFSET)
    losses = [step(*next(stream)) for _ in range(steps)]
    check = smoothed_check(jax.device_get(jnp.stack(losses)), window=window)   # raises: no fall
    reference = reference_model(lab)                          # the same init as the trained model
    check.val_before = val_loss(reference, Xv, Yv, chunk)
    model, _ = step.commit()
    nnx.update(reference, nnx.state(model, nnx.Param))       # the trained weights, plain model
    check.val_after = val_loss(reference, Xv, Yv, chunk)
    check.threshold = VAL_FRACTION * math.log(lab.gpt_config.vocab_size)
    check.evaluated_with = (f"reference model (fp32, nnx.jit, gather embedding, xla attention) with "
                            f"the trained weights; {len(Xv) // chunk * chunk} held-out windows")
    if not check.passed:
        raise AssertionError(f"speed that breaks the model is not speed: {check}")
    return check
