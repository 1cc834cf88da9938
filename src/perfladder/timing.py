"""The measurement loop both frameworks share (no framework imports).

``measure`` is the chapter's discipline in one function:

1. warm up for ``warmup`` steps (past compilation, autotuning, allocator growth), sync;
2. run ``windows`` timed windows of ``timed`` steps each, every one closed by a device
   sync, counting the tokens of every batch actually fed (end-to-end tokens/s: the
   stream's own cost is inside the window, as in a real training run);
3. refuse to time the same batch twice in a row (a cached batch flatters the number);
4. raise ``RecompileError`` if the framework compiled anything inside a timed window;
5. raise ``BatchShapeError`` if the batch shape changes between timed steps (a ragged
   tail that was not dropped: eager code would not recompile, so the guard of 4 misses it);
6. report the median window and the spread of all of them.

Each framework supplies ``sync`` (``torch.cuda.synchronize`` / ``jax.block_until_ready``)
and ``compile_count`` (dynamo's counters / XLA compile events).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator


class RecompileError(RuntimeError):
    """Compilation happened inside a timed window: the number would be a lie."""


class StaleBatchError(RuntimeError):
    """The stream handed the timer the same batch twice in a row."""


class BatchShapeError(RuntimeError):
    """The timed batches do not all have one shape."""


@dataclass
class Throughput:
    """What one ``throughput(...)`` call measured."""
    tokens_per_s: float                 # median over windows
    windows: list[float]                # tokens/s of every window, in order
    seconds: list[float]                # wall seconds of every window
    steps_per_window: int
    tokens_per_window: int
    warmup: int
    batch_shape: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def spread(self) -> float:
        """(max - min) / median of the windows: the run-to-run noise of this number."""
        return (max(self.windows) - min(self.windows)) / self.tokens_per_s

    @property
    def step_time_s(self) -> float:
        """Median seconds per step."""
        return statistics.median(self.seconds) / self.steps_per_window

    def to_dict(self) -> dict:
        d = asdict(self)
        d["batch_shape"] = list(self.batch_shape)
        d["spread"] = self.spread
        return d

    def __str__(self) -> str:
        return (f"{self.tokens_per_s:,.0f} tokens/s (median of {len(self.windows)} windows, "
                f"spread {100 * self.spread:.1f}%)")


def measure(step: Callable, stream: Iterator, *, warmup: int, timed: int, windows: int,
            sync: Callable[[Any], None], compile_count: Callable[[], int],
            num_tokens: Callable[[Any], int], shape_of: Callable[[Any], tuple]) -> Throughput:
    """Time ``step(X, Y)`` over batches drawn from ``stream``; see the module docstring."""
    for name, v, lo in (("warmup", warmup, 0), ("timed", timed, 1), ("windows", windows, 1)):
        if not isinstance(v, int) or v < lo:
            raise ValueError(f"{name}={v!r} must be an integer >= {lo}")
    prev = None
    out = None
    for _ in range(warmup):
        X, Y = next(stream)
        out = step(X, Y)
        prev = X
    sync(out)
    shape = None
    rates, secs = [], []
    tokens = 0
    for w in range(windows):
        before = compile_count()
        tokens = 0
        t0 = time.perf_counter()
        for _ in range(timed):
            X, Y = next(stream)
            if X is prev:
                raise StaleBatchError("the stream yielded the same batch object twice in a row; "
                                      "time fresh batches, not one cached batch")
            this_shape = tuple(shape_of(X))
            if shape is None:
                shape = this_shape
            elif this_shape != shape:
                raise BatchShapeError(f"batch shape changed from {shape} to {this_shape} inside "
                                      f"timed window {w + 1}/{windows}; keep one shape "
                                      "(drop ragged tails)")
            out = step(X, Y)
            tokens += num_tokens(X)
            prev = X
        sync(out)
        dt = time.perf_counter() - t0
        compiled = compile_count() - before
        if compiled:
            raise RecompileError(
                f"{compiled} compilation(s) happened inside timed window {w + 1}/{windows} "
                f"(batch shape {shape}); a changed shape or dtype retraced the step. "
                "Keep one batch shape (drop ragged tails) and warm up past compilation.")
        rates.append(tokens / dt)
        secs.append(dt)
    return Throughput(tokens_per_s=statistics.median(rates), windows=rates, seconds=secs,
                      steps_per_window=timed, tokens_per_window=tokens, warmup=warmup,
                      batch_shape=shape or ())
