"""The learning check that can fail (no framework imports).

A rung's step is trained from the initial weights for a few hundred steps; the check then
asks three things:

1. the training loss fell (mean of the first ``window`` losses > mean of the last ``window``);
2. the loss on the held-out validation windows fell;
3. that validation loss is at most ``threshold``, well under where it started;

and the validation loss is computed by the *reference* implementation (the plain eager fp32
model of the same framework, with the trained weights loaded), never by the candidate. A
candidate that cheats -- attention that sees the next token -- trains to a low loss on its own
terms, but its weights predict nothing once the model is causal again; a candidate that does
not learn (frozen blocks) stays near the loss of a model without context.

The threshold. Predicting each character without looking at the ones before it, the best any
model can do on this text is the entropy of the character frequencies (the unigram entropy of
the training split: 2.84 nats, against ln 28 = 3.33 for a uniform guess). Everything below it
has to come from the context, i.e. from the attention blocks working. The check asks for a
validation loss of at most ``THRESHOLD_FRACTION`` = 0.85 of it (2.41 nats): 15% of the way
from the character counts to a perfect predictor. Frozen blocks can do a little better than
the counts (the embedding and the frozen random attention still carry some context) and
land at 2.65; the threshold sits between that and what an honest step reaches.

Measured on CPU, smoke config (batch 32, lr 3e-3, bf16, validation evaluated by the reference
model), at 60 / 150 steps: honest 2.31 / 2.14 (PyTorch), 2.28 / 2.15 (JAX); frozen blocks
2.67 / 2.65 and 2.69 / 2.66; non-causal attention, which trains to 1.8 / 0.3 on its own terms,
3.27 / 4.27 and 3.15 / 3.73. At 150 steps the honest run clears the threshold by 0.26 nats
and frozen blocks miss it by 0.24; the smoke training split is only about 2,000 characters,
so much past 200 steps the honest model starts to overfit (2.07 at 200, 2.19 at 300).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from perfladder.measure.gates import GateError

THRESHOLD_FRACTION = 0.85


class LearningError(GateError):
    """The trained configuration did not learn the model: it is not the same model."""


def unigram_entropy(tokens, vocab_size: int) -> float:
    """Entropy (nats) of the token frequencies in ``tokens``: the loss of the best predictor
    that ignores the context."""
    counts = np.bincount(np.asarray(tokens).reshape(-1), minlength=vocab_size).astype(np.float64)
    if counts.sum() == 0:
        raise ValueError("unigram_entropy needs at least one token")
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def val_threshold(train_tokens, vocab_size: int, fraction: float = THRESHOLD_FRACTION) -> float:
    """``fraction`` x the unigram entropy of the training tokens (see the module docstring)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction!r} must be in (0, 1]")
    return fraction * unigram_entropy(train_tokens, vocab_size)


@dataclass
class LearningCheck:
    """What the learning check measured and decided (``to_dict`` / ``from_dict`` for the JSON)."""
    steps: int
    window: int
    train_first: float        # mean training loss of the first ``window`` steps
    train_last: float         # ... and of the last ``window``
    val_before: float         # held-out loss at the initial weights (reference model)
    val_after: float          # held-out loss at the trained weights (reference model)
    threshold: float          # val_after must be at most this
    passed: bool
    losses: list = field(default_factory=list)
    evaluated_with: str = ""  # which implementation computed the validation losses

    def reasons(self) -> list[str]:
        """What failed (empty when it passed)."""
        out = []
        if not self.train_last < self.train_first:
            out.append(f"training loss did not fall ({self.train_first:.3f} -> {self.train_last:.3f})")
        if not self.val_after < self.val_before:
            out.append(f"validation loss did not fall ({self.val_before:.3f} -> {self.val_after:.3f})")
        if not self.val_after <= self.threshold:
            out.append(f"validation loss {self.val_after:.3f} is above the threshold {self.threshold:.3f}")
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["losses"] = [float(x) for x in self.losses]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LearningCheck":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown LearningCheck field(s) {sorted(unknown)}; valid: {sorted(names)}")
        return cls(**d)

    def __str__(self) -> str:
        return (f"learning check over {self.steps} steps: train (mean of {self.window}) "
                f"{self.train_first:.3f} -> {self.train_last:.3f}; validation {self.val_before:.3f} -> "
                f"{self.val_after:.3f} (threshold {self.threshold:.3f}, evaluated with "
                f"{self.evaluated_with}): {'passed' if self.passed else 'FAILED'}")


def judge(losses, val_before: float, val_after: float, *, threshold: float, window: int,
          evaluated_with: str) -> LearningCheck:
    """The ``LearningCheck`` of a training curve and the validation losses around it."""
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"window={window!r} must be a positive integer")
    losses = [float(x) for x in losses]
    if len(losses) < 2 * window:
        raise ValueError(f"need at least {2 * window} losses for window={window}, got {len(losses)}")
    first = sum(losses[:window]) / window
    last = sum(losses[-window:]) / window
    nums = [first, last, float(val_before), float(val_after), float(threshold)]
    check = LearningCheck(steps=len(losses), window=window, train_first=first, train_last=last,
                          val_before=float(val_before), val_after=float(val_after),
                          threshold=float(threshold), passed=False, losses=losses,
                          evaluated_with=evaluated_with)
    check.passed = all(math.isfinite(x) for x in nums) and not check.reasons()
    return check


def check_learning(losses, val_before: float, val_after: float, *, threshold: float, window: int,
                   evaluated_with: str) -> LearningCheck:
    """``judge`` and raise ``LearningError`` (with the check at ``.check``) if it failed."""
    check = judge(losses, val_before, val_after, threshold=threshold, window=window,
                  evaluated_with=evaluated_with)
    if not check.passed:
        err = LearningError(f"speed that breaks the model is not speed: {check}; "
                            + "; ".join(check.reasons() or ["a loss is not finite"]),
                            gate="learning check")
        err.check = check
        raise err
    return check
