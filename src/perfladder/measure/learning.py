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

The rows. The check records which windows it trained on and which it evaluated (``rows``:
``{'train': [start, stop), 'val': [start, stop)}``, read off the arrays themselves by
``TimeMachine.rows_of``), and a check whose evaluated rows overlap its training rows fails
by the ``held-out rows`` gate (``HeldOutRowsError``): a "validation" loss computed on
training rows reads about 0.17 lower than the true one and can pass a model that learned
nothing general. Rows are windows: neighbouring windows share tokens, so the first
``num_steps`` validation windows hold text the last training windows also hold, as in d2l's
split; no window is in both.

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
import numbers
from dataclasses import dataclass, field, fields

import numpy as np

from perfladder.checks import check_int
from perfladder.measure.gates import GateError
from perfladder.measure.timing import Stopwatch, phase

THRESHOLD_FRACTION = 0.85
DEFAULT_WINDOW = 20          # steps averaged at each end of the training curve


HELD_OUT_GATE = "held-out rows"


class LearningError(GateError):
    """The trained configuration did not learn the model: it is not the same model."""


class HeldOutRowsError(LearningError):
    """The learning check's validation rows are not held out: they overlap its training rows."""


def rows_overlap(a, b) -> bool:
    """Whether the row ranges ``a`` and ``b`` (``[start, stop)`` each) share a row."""
    return max(a[0], b[0]) < min(a[1], b[1])


def split_rows(data, stream, X_val) -> dict:
    """``{'train': [start, stop), 'val': [start, stop)}`` of a learning check: the rows
    ``stream`` draws from (its ``rows``; a stream that does not say is taken to draw ``data``'s
    training split) and the rows of ``X_val``, the array evaluated (``TimeMachine.rows_of``)."""
    train = getattr(stream, "rows", None)
    train = data.rows_of(data.train_arrays()[0]) if train is None else [int(r) for r in train]
    return {"train": train, "val": data.rows_of(X_val)}


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
    """What the learning check measured and decided, in the layout of the results JSON
    (``learning`` in ``results-v2.schema.json``); ``passed`` is derived from the numbers.

    A diverged run's losses are not finite: ``to_dict`` writes them as null (JSON holds finite
    numbers only) and a check with a missing or non-finite loss never passes. A check without
    ``threshold`` (a version-1 file) asks only that the training loss fell.
    """
    steps: int
    first: float | None       # mean training loss of the first ``window`` steps
    last: float | None        # ... and of the last ``window``
    window: int
    losses: list = field(default_factory=list)
    val_before: float | None = None   # held-out loss at the initial weights (reference model)
    val_after: float | None = None    # held-out loss at the trained weights (reference model)
    threshold: float | None = None    # val_after must be at most this
    evaluated_with: str = ""          # which implementation computed the validation losses
    configuration: str = ""           # which rung's configuration was trained
    seconds: float | None = None      # wall seconds the check took (build, compile, train, judge)
    phases: dict = field(default_factory=dict)  # where those seconds went: data, build, val, train
    rows: dict | None = None          # {'train': [start, stop), 'val': [start, stop)} (split_rows)

    def reasons(self) -> list[str]:
        """What failed (empty when it passed); a missing or non-finite loss fails what it is in."""
        out = []
        if not (_finite(self.first) and _finite(self.last) and self.last < self.first):
            out.append(f"training loss did not fall ({_num(self.first)} -> {_num(self.last)})")
        if self.rows is not None and rows_overlap(self.rows["train"], self.rows["val"]):
            out.append(f"validation rows {self.rows['val']} overlap the training rows "
                       f"{self.rows['train']}: not held out")
        if self.threshold is not None:
            if not (_finite(self.val_before) and _finite(self.val_after) and self.val_after < self.val_before):
                out.append(f"validation loss did not fall ({_num(self.val_before)} -> {_num(self.val_after)})")
            if not (_finite(self.val_after) and self.val_after <= self.threshold):
                out.append(f"validation loss {_num(self.val_after)} is above the threshold {self.threshold:.3f}")
        return out

    @property
    def passed(self) -> bool:
        return not self.reasons()

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in _FIELDS}
        for k in ("first", "last", "val_before", "val_after", "threshold"):
            d[k] = _finite_or_none(d[k])
        d["losses"] = [_finite_or_none(x) for x in self.losses]
        if self.rows is None:
            del d["rows"]                 # a check without rows writes what version-2 files hold
        d["passed"] = self.passed
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> "LearningCheck | None":
        """The check a results file holds (``passed`` is derived again, not read)."""
        if d is None:
            return None
        unknown = set(d) - set(_FIELDS) - {"passed"}
        if unknown:
            raise ValueError(f"unknown LearningCheck field(s) {sorted(unknown)}; valid: {sorted(_FIELDS)}")
        return cls(**{k: v for k, v in d.items() if k in _FIELDS})

    def __str__(self) -> str:
        s = (f"training loss over {self.steps} steps: first {self.window} {_num(self.first)} -> "
             f"last {self.window} {_num(self.last)}")
        if self.threshold is not None:
            s += (f"; validation loss {_num(self.val_before)} -> {_num(self.val_after)} "
                  f"(must be < {self.threshold:.3f}"
                  + (f", evaluated with {self.evaluated_with}" if self.evaluated_with else "") + ")")
        return s + (" -- passed" if self.passed else " -- FAILED")


_FIELDS = tuple(f.name for f in fields(LearningCheck))


def _finite(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _num(x) -> str:
    return f"{x:.3f}" if _finite(x) else "nan"


def _finite_or_none(x):
    """JSON holds finite numbers only: a diverged loss (NaN, inf) is written as null."""
    return float(x) if _finite(x) else None


def judge(losses, val_before: float | None = None, val_after: float | None = None, *,
          threshold: float | None = None, window: int = DEFAULT_WINDOW,
          evaluated_with: str = "", rows: dict | None = None) -> LearningCheck:
    """The ``LearningCheck`` of a training curve (and, with ``threshold``, the validation
    losses around it; with ``rows``, the rows trained on and evaluated: ``split_rows``)."""
    window = check_int("window", window)
    losses = [float(x) for x in losses]
    if len(losses) < 2 * window:
        raise ValueError(f"need at least {2 * window} losses for window={window}, got {len(losses)}")
    opt = lambda x: None if x is None else float(x)  # noqa: E731
    return LearningCheck(steps=len(losses), first=sum(losses[:window]) / window,
                         last=sum(losses[-window:]) / window, window=window, losses=losses,
                         val_before=opt(val_before), val_after=opt(val_after),
                         threshold=opt(threshold), evaluated_with=evaluated_with,
                         rows=None if rows is None else {k: [int(r) for r in rows[k]]
                                                         for k in ("train", "val")})


def check_learning(losses, val_before: float | None = None, val_after: float | None = None, *,
                   threshold: float | None = None, window: int = DEFAULT_WINDOW,
                   evaluated_with: str = "", rows: dict | None = None) -> LearningCheck:
    """``judge`` and raise ``LearningError`` (with the check at ``.check``) if it failed:
    ``HeldOutRowsError`` (gate ``held-out rows``) when its validation rows overlap its
    training rows, whatever the losses say."""
    check = judge(losses, val_before, val_after, threshold=threshold, window=window,
                  evaluated_with=evaluated_with, rows=rows)
    if not check.passed:
        held_out = rows is not None and rows_overlap(check.rows["train"], check.rows["val"])
        err = (HeldOutRowsError if held_out else LearningError)(
            f"speed that breaks the model is not speed: {check}; " + "; ".join(check.reasons()),
            gate=HELD_OUT_GATE if held_out else "learning check")
        err.check = check
        raise err
    return check


def train_and_check(train, val_loss, data, stream, *, window: int = DEFAULT_WINDOW,
                    threshold: float | None = None, watch: Stopwatch | None = None,
                    evaluated_with: str = "") -> LearningCheck:
    """The learning check's order, the same for both frameworks: the threshold (``val_threshold``
    of the training split unless given), the rows trained on and evaluated (``split_rows``),
    ``val_loss()`` before, ``train()`` (the training losses, host floats), ``val_loss()`` after,
    then ``check_learning``. ``watch`` records each part's seconds."""
    if threshold is None:
        with phase(watch, "data"):
            threshold = val_threshold(data.train_arrays()[1], len(data.vocab))
    rows = split_rows(data, stream, data.val_arrays()[0])
    with phase(watch, "val before"):
        before = val_loss()
    with phase(watch, "train"):
        curve = train()
    with phase(watch, "val after"):
        after = val_loss()
    return check_learning(curve, before, after, threshold=threshold, window=window,
                          evaluated_with=evaluated_with, rows=rows)
