"""The learning check's rule (framework-free): a fast configuration must still learn.

Two conditions. The smoothed training loss falls (the mean of the last ``window`` steps is
below the first's), and the validation loss after training, on held-out text the run never
saw, is below ``THRESHOLD_FRACTION * ln(V)``: the loss of a uniform guess over the V
characters is ln(V), and a model that only learned the characters' frequencies stays near
0.86 ln(V) on this corpus (the unigram entropy), so a threshold of 0.8 ln(V) demands more than
frequencies: context.
"""
from __future__ import annotations

from .results import LearningCheck

THRESHOLD_FRACTION = 0.8
VAL_BATCHES = 4


def check_learning(losses, *, window: int, val_before: float, val_after: float,
                   threshold: float, evaluated_with: str) -> LearningCheck:
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"window={window!r} must be a positive integer")
    losses = [float(x) for x in losses]
    if len(losses) < 2 * window:
        raise ValueError(f"need at least {2 * window} losses for window={window}, got {len(losses)}")
    return LearningCheck(steps=len(losses), first=sum(losses[:window]) / window,
                         last=sum(losses[-window:]) / window, window=window, losses=losses,
                         val_before=val_before, val_after=val_after, threshold=threshold,
                         evaluated_with=evaluated_with)
