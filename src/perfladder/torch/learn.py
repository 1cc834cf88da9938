"""The learning check: train a configuration from a fresh init, then judge it on held-out text.

The losses of the training run stay on the device (no host read per step). Validation loss is
taken on the held-out split (the windows after the training windows) before and after, by the
*reference* model -- eager, fp32, gather embedding, PyTorch's own attention -- holding the
trained weights, so a configuration that cheats (attention that sees the next token) cannot
grade itself.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..learning import THRESHOLD_FRACTION, VAL_BATCHES, check_learning
from .recipe import Recipe

LEARN_SEED_OFFSET = 1000


@torch.no_grad()
def validation_loss(lab, state_dict, batch_size: int) -> float:
    """Mean loss of the reference model with ``state_dict`` over the first validation batches."""
    ref = lab.make_model(Recipe(batch_size=batch_size))
    ref.load_state_dict(state_dict)
    ref.eval()
    stream = lab.stream(batch_size, split="val")
    n = min(VAL_BATCHES, lab.data.num_val // batch_size)
    total = torch.zeros((), device=lab.device)
    with torch.autocast(lab.device.type, enabled=False):
        for _ in range(n):
            X, Y = next(stream)
            logits = ref(X)                                               # (B, T, V) fp32
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), Y.reshape(-1))
    return float(total.item() / n)


def learning_check(lab, recipe: Recipe, steps: int | None = None, window: int = 20):
    """Train ``recipe`` for ``steps`` (default ``config.learn_steps``) from a fresh init."""
    steps = lab.config.learn_steps if steps is None else steps
    step = lab.build_step(recipe)
    val_bs = min(recipe.batch_size, lab.data.num_val)
    before = validation_loss(lab, step.model.state_dict(), val_bs)
    stream = lab.stream(recipe.batch_size)
    losses = [step(*next(stream)) for _ in range(steps)]                  # device scalars
    curve = torch.stack(losses).float().cpu().tolist()                    # one host read
    after = validation_loss(lab, step.model.state_dict(), val_bs)
    del step
    return check_learning(curve, window=window, val_before=before, val_after=after,
                          threshold=THRESHOLD_FRACTION * math.log(len(lab.data.vocab)),
                          evaluated_with="reference model (eager, fp32, gather embedding) "
                                         "holding the trained weights")
