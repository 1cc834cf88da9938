"""Held-out loss by the reference implementation, and the learning check (PyTorch).

Whatever a rung's step does to be fast, its trained weights are judged by the plain eager
fp32 ``GPT`` (gather embedding, PyTorch's default attention, no checkpointing, fp32 matmuls
at full precision) with those weights loaded: a step that computed something else while
training (attention that sees the future) cannot pass by evaluating itself. The decision is
framework-free: ``perfladder.measure.learning``.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from perfladder.data import TimeMachine
from perfladder.measure.learning import LearningCheck, train_and_check
from perfladder.measure.timing import Stopwatch
from perfladder.torch.gates import true_fp32
from perfladder.torch.model import GPT

REFERENCE = ("the plain eager fp32 PyTorch GPT (gather embedding, default attention, no "
             "checkpointing, true fp32 matmuls) with the trained weights loaded")
EVAL_BATCH = 500          # windows per forward pass when evaluating


def reference_model(trained: nn.Module) -> GPT:
    """A plain GPT of ``trained``'s architecture, on its device, holding its weights (copied)."""
    src = getattr(trained, "module", trained)            # DDP wraps the GPT
    device = next(src.parameters()).device
    ref = GPT(src.config).to(device)
    ref.load_state_dict(src.state_dict())
    return ref.eval()


@torch.no_grad()
def mean_loss(model: nn.Module, X: np.ndarray, Y: np.ndarray, batch_size: int = EVAL_BATCH) -> float:
    """Mean cross entropy (nats per token) of ``model`` over every row of ``X`` / ``Y`` (int
    arrays (N, T)), in fp32 with no autocast and full-precision matmuls."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with true_fp32(), torch.autocast(device.type, enabled=False):
        for i in range(0, len(X), batch_size):
            # torch.tensor copies: the windows are read-only views of the corpus
            x = torch.tensor(X[i:i + batch_size], dtype=torch.long, device=device)      # (b, T)
            y = torch.tensor(Y[i:i + batch_size], dtype=torch.long, device=device)      # (b, T)
            logits = model(x).float()                                                     # (b, T, V)
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                     reduction="sum").item()
            count += y.numel()
    return total / count


def reference_val_loss(trained: nn.Module, data: TimeMachine) -> float:
    """The validation loss of ``trained``'s weights, computed by the reference model."""
    return mean_loss(reference_model(trained), *data.val_arrays())


def learning_check(step, stream, data: TimeMachine, *, steps: int, window: int = 20,
                   threshold: float | None = None, watch: Stopwatch | None = None) -> LearningCheck:
    """Train ``step`` (a ``TrainStep`` at its initial weights) for ``steps`` steps on ``stream``;
    the validation loss before and after, by the reference model; ``LearningCheck`` asserted
    (``LearningError`` if it fails). ``threshold`` defaults to ``perfladder.measure.learning.val_threshold``
    of the training split. The training losses stay on the device until the end (one read).
    ``watch`` (a ``Stopwatch``) records the seconds of each part. The rows trained on and
    evaluated are recorded (``split_rows``, read off the arrays evaluated) and must not
    overlap (``HeldOutRowsError``)."""
    X_val, Y_val = data.val_arrays()

    def train():
        losses = [step(*next(stream)) for _ in range(steps)]              # device scalars
        return torch.stack(losses).float().cpu().tolist()                  # one host read

    return train_and_check(train, lambda: mean_loss(reference_model(step.model), X_val, Y_val),
                           data, stream, window=window, threshold=threshold, watch=watch,
                           evaluated_with=REFERENCE)
