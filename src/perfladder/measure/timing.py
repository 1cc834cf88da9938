"""The measurement loop both frameworks share (no framework imports).

``measure`` is the chapter's discipline in one function:

1. warm up for ``warmup`` steps (past compilation, autotuning, allocator growth), sync;
   every batch is drawn through ``perfladder.measure.draws.Draws``, which refuses a stale
   one: the same object or stream position twice in a row, the same content in warm-up
   (a host read is allowed there: nothing is timed yet) and in the last two batches, and
   the same batch an epoch apart (a stream that re-yields its first epoch's tensors);
2. run timed windows of ``timed`` steps each (with ``window_s``, fewer where ``timed`` steps
   would take longer than that: a few more warm-up steps, closed by a sync, price one step,
   and a window holds the steps that fill ``window_s``, at least ``MIN_WINDOW_STEPS``; a
   slow step gains nothing from a long window but wall time), every one closed by a device sync, counting
   the tokens of every batch actually fed (end-to-end tokens/s: the stream's own cost is
   inside the window, as in a real training run). A ``Window`` holds that to account: its
   end stamp is read only after its sync returned, past its last draw (``SyncError``), and
   every step it timed drew its batch inside it (``WindowError``);
3. keep opening windows until the last ``windows`` of them agree within
   ``target_spread`` ((max - min) / median), up to ``max_windows``: a disturbed start
   (a clock ramping, another process finishing) is waited out, and the number reported is
   the median of the windows that settled. Every window stays in the record. A step that
   never settles is reported with ``stable=False``: the caller must not credit it;
4. refuse a stale batch wherever the timer can see one (``StaleBatchError``, step 1);
5. raise ``RecompileError`` if the framework compiled anything inside a timed window;
6. raise ``BatchShapeError`` if the batch shape changes between timed steps (a ragged
   tail that was not dropped: eager code would not recompile, so the guard of 5 misses it).

``measure(step, stream, hooks, settings)`` takes two records. ``TimerHooks`` is what a
framework is to the timer (each side's timer module holds one, ``HOOKS``): ``sync``
(``torch.cuda.synchronize`` / ``jax.block_until_ready`` on the output and every live array: the
whole step, its update included), ``compile_count`` (dynamo's counters /
XLA compile events), ``num_tokens`` and ``shape_of`` (of a batch), ``fingerprint`` (a few rows
of a batch as bytes) and ``ready`` (is the device done with the window's work? asked right
after ``sync``, without waiting: a sync that only queried would leave work running past the
clock, and ``SyncError`` refuses the measurement). ``WindowSettings`` is how long and how
settled the windows are (steps 1-3 above): one home for the timer's defaults, and
``WindowSettings.of(config, batch_size)`` a ladder config's.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterator

from perfladder.checks import check_int
from perfladder.measure.draws import Draws, StaleBatchError, StreamEndedError  # noqa: F401 (importable here)

DEFAULT_TARGET_SPREAD = 0.03   # windows within 3% of each other count as settled
WARMUP, TIMED, WINDOWS = 30, 40, 3   # the full config's defaults (a LadderConfig says its own)
LEGACY_TARGET_SPREAD = 0.05    # what files written before the timer settled windows are held to
MIN_MAX_WINDOWS = 10           # never give up before this many windows
PILOT_STEPS = 3                # warm-up steps that price one step for ``window_s``
MIN_WINDOW_STEPS = 2           # a window shortened to ``window_s`` keeps at least this many steps


class RecompileError(RuntimeError):
    """Compilation happened inside a timed window: the number would be a lie."""


class BatchShapeError(RuntimeError):
    """The timed batches do not all have one shape."""


class SyncError(RuntimeError):
    """A window was closed while the device still had its work: the sync did not wait, or
    its end stamp was read before the sync returned."""


class WindowError(RuntimeError):
    """A timed window does not hold what the chapter says it holds: every step it times,
    each with the draw of its batch from the stream."""


def spread_of(rates) -> float:
    """(max - min) / median: how far apart a set of windows is."""
    rates = list(rates)
    if not rates:
        raise ValueError("spread_of needs at least one window")
    return (max(rates) - min(rates)) / statistics.median(rates)


def settles(rates, target_spread: float) -> bool:
    """The settle rule: windows agree when their spread is at most ``target_spread``."""
    return spread_of(rates) <= target_spread


def did_settle(t) -> bool | None:
    """Did a measurement settle? ``t``: a ``Throughput`` or a recorded ``Timing`` (None: no
    measurement, None back). The timer's own verdict (``stable``); a file written before the
    timer settled windows has none, and its windows are judged by ``settles`` against
    ``LEGACY_TARGET_SPREAD``."""
    if t is None:
        return None
    if t.stable is not None:
        return bool(t.stable)
    return settles(t.settled_windows, LEGACY_TARGET_SPREAD)


def measure_settled(measure: Callable[[], Any], settled: Callable[[Any], bool] = did_settle, *,
                    budget_s: float | None = None) -> tuple[Any, bool]:
    """``measure()``; once more when it did not settle (``settled(t)``: the timer's verdict
    unless told otherwise), unless its windows already took more than half of ``budget_s``.
    ``(the last measurement, remeasured)``."""
    t = measure()
    if settled(t) or (budget_s is not None and sum(getattr(t, "seconds", ())) > budget_s / 2):
        return t, False
    return measure(), True


class SettledWindows:
    """What a set of timed windows says, read the same way from the timer's live measurement
    (``Throughput``) and from a rung's stored record (``perfladder.measure.evidence.Timing``):
    both hold ``windows`` (tokens/s), ``seconds``, ``settled`` and ``steps_per_window``."""

    @property
    def settled_windows(self) -> list[float]:
        return self.windows[-self.settled:]

    @property
    def spread(self) -> float:
        """Spread of the settled windows: the noise of the reported number."""
        return spread_of(self.settled_windows)

    @property
    def low(self) -> float:
        return min(self.settled_windows)

    @property
    def high(self) -> float:
        return max(self.settled_windows)

    @property
    def step_time_s(self) -> float:
        """Median seconds per step over the settled windows."""
        return statistics.median(self.seconds[-self.settled:]) / self.steps_per_window


@dataclass
class Throughput(SettledWindows):
    """What one ``throughput(...)`` call measured."""
    tokens_per_s: float                 # median of the settled windows
    windows: list[float]                # tokens/s of every window, in order (all kept)
    seconds: list[float]                # wall seconds of every window
    steps_per_window: int
    tokens_per_window: int
    warmup: int
    batch_shape: tuple[int, ...] = ()
    settled: int = 0                    # how many trailing windows the median is taken over
    stable: bool = True                 # did the last ``settled`` windows agree within target?
    target_spread: float = DEFAULT_TARGET_SPREAD
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not self.settled:
            self.settled = len(self.windows)

    def __str__(self) -> str:
        state = "settled" if self.stable else "DID NOT SETTLE"
        return (f"{self.tokens_per_s:,.0f} tokens/s (median of the last {self.settled} of "
                f"{len(self.windows)} windows, spread {100 * self.spread:.1f}%, {state})")


@dataclass(frozen=True)
class TimerHooks:
    """What a framework is to the timer: how to wait for the device (``sync``), whether it is
    done (``ready``, None: not asked), how many compilations so far (``compile_count``), the
    tokens and shape of a batch, and a batch's first rows as bytes (``fingerprint``, None: the
    content is not compared)."""
    sync: Callable[[Any], None]
    compile_count: Callable[[], int]
    num_tokens: Callable[[Any], int]
    shape_of: Callable[[Any], tuple]
    fingerprint: Callable[[Any], bytes] | None = None
    ready: Callable[[Any], bool] | None = None


@dataclass(frozen=True)
class WindowSettings:
    """How long and how settled a measurement's windows are (the module docstring's steps 1-3):
    ``warmup`` steps, windows of ``timed`` steps until the last ``windows`` agree within
    ``target_spread``, at most ``max_windows`` (None: ``max(MIN_MAX_WINDOWS, 3 x windows)``),
    no new window past ``budget_s`` of timed windows once ``windows`` ran, and windows cut to
    about ``window_s`` seconds (None: ``timed`` steps whatever they take). Checked when made:
    a bad value is one line naming it and what is valid."""
    warmup: int = WARMUP
    timed: int = TIMED
    windows: int = WINDOWS
    target_spread: float = DEFAULT_TARGET_SPREAD
    max_windows: int | None = None
    budget_s: float | None = None
    window_s: float | None = None

    def __post_init__(self):
        check_int("warmup", self.warmup, 0)
        check_int("timed", self.timed, 1)
        check_int("windows", self.windows, 1)
        check_int("max_windows", self.most_windows, self.windows)
        if isinstance(self.target_spread, bool) or not 0 < float(self.target_spread) < 1:
            raise ValueError(f"target_spread={self.target_spread!r} must be a fraction in (0, 1)")
        if self.window_s is not None and (isinstance(self.window_s, bool)
                                          or not isinstance(self.window_s, (int, float))
                                          or not self.window_s > 0):
            raise ValueError(f"window_s={self.window_s!r} must be a number of seconds > 0, or None")

    @property
    def most_windows(self) -> int:
        """``max_windows``, or when None, ``max(MIN_MAX_WINDOWS, 3 x windows)``."""
        return max(MIN_MAX_WINDOWS, 3 * self.windows) if self.max_windows is None else self.max_windows

    @classmethod
    def of(cls, config, batch_size: int, **changes) -> WindowSettings:
        """A ``LadderConfig``'s settings for a step of ``batch_size`` rows (its warm-up and
        window steps scale with the batch), with ``changes`` on top."""
        return cls(**{**dict(warmup=config.warmup_steps(batch_size), timed=config.timed_steps(batch_size),
                             windows=config.windows, target_spread=config.target_spread,
                             max_windows=config.max_windows, budget_s=config.timing_budget_s,
                             window_s=config.window_s), **changes})


def window_settings(settings: WindowSettings | None = None, **changes) -> WindowSettings:
    """``settings`` (default: ``WindowSettings()``) with ``changes`` (field names) on top: what
    each side's ``throughput`` makes of its caller's arguments."""
    names = [f.name for f in fields(WindowSettings)]
    bad = sorted(set(changes) - set(names))
    if bad:
        raise TypeError(f"{', '.join(bad)}: not a window setting; valid: {', '.join(names)}")
    return replace(settings or WindowSettings(), **changes)


class Window:
    """The clock of one timed window (``measure``'s, and its pilot's), drawing through ``draws``:
    ``open()`` stamps its start, ``sync(out)`` waits for the device (``hooks.sync``), and
    ``close(steps, what)`` stamps its end and returns its seconds. ``close`` refuses a window
    whose end stamp would be read before its sync returned, or before a sync that followed
    its last draw (``SyncError``), and one whose ``steps`` did not each draw their batch
    inside it (``WindowError``): the stream's cost and the device's work are the window's."""

    def __init__(self, sync: Callable[[Any], None], draws: Draws):
        self._sync, self._draws = sync, draws
        self._t0, self._drawn, self._synced = None, 0, None

    def open(self) -> None:
        self._t0, self._drawn, self._synced = time.perf_counter(), self._draws.count, None

    def sync(self, out) -> None:
        self._sync(out)
        self._synced = self._draws.count          # the sync returned after this many draws

    def close(self, steps: int, what: str) -> float:
        t1 = time.perf_counter()
        t0, self._t0 = self._t0, None
        if t0 is None:
            raise WindowError(f"{what} was closed without being opened")
        if self._synced != self._draws.count:
            raise SyncError(f"{what}: its end stamp was read before its sync returned (sync "
                            f"{'never called' if self._synced is None else 'followed by more draws'}"
                            "): the window would close while the device still had its steps")
        drawn = self._draws.count - self._drawn
        if drawn != steps:
            raise WindowError(f"{what} timed {steps} steps but drew {drawn} batches inside it: every "
                              "step's draw from the stream belongs in its window (end-to-end tokens/s)")
        return t1 - t0


def measure(step: Callable, stream: Iterator, hooks: TimerHooks,
            settings: WindowSettings = WindowSettings()) -> Throughput:
    """Time ``step(X, Y)`` over batches drawn from ``stream`` with the framework's ``hooks`` and
    the window ``settings``; see the module docstring.

    ``settings.budget_s``: wall seconds of timed windows after which no new window is opened
    once ``windows`` have run (a measurement that has not settled by then is reported
    unsettled): what bounds a rung's time when its windows wander. ``settings.window_s``: the
    longest a window should take (step 2 of the module docstring); the pilot's price is in
    ``extra['pilot']``."""
    warmup, timed, windows = settings.warmup, settings.timed, settings.windows
    max_windows, target_spread = settings.most_windows, settings.target_spread
    budget_s, window_s = settings.budget_s, settings.window_s
    sync, compile_count, ready = hooks.sync, hooks.compile_count, hooks.ready
    num_tokens, shape_of, fingerprint = hooks.num_tokens, hooks.shape_of, hooks.fingerprint

    draw = Draws(stream, fingerprint, need=(
        f"a measurement needs warmup={warmup} + at least windows={windows} x timed={timed} = "
        f"{warmup + windows * timed} (up to {warmup + max_windows * timed}): give an endless "
        "stream such as perfladder.torch.batches / perfladder.jax.batches"))
    window = Window(sync, draw)
    out = None
    for _ in range(warmup):
        X, Y = draw()
        draw.check_content(X)
        out = step(X, Y)
    sync(out)
    extra: dict[str, Any] = {} if budget_s is None else {"budget_s": budget_s}
    if window_s is not None and timed > MIN_WINDOW_STEPS:
        pilot = min(PILOT_STEPS, timed)
        window.open()
        for _ in range(pilot):
            out = step(*draw())
        window.sync(out)
        step_s = window.close(pilot, "the pilot") / pilot
        fits = int(window_s / step_s) if step_s > 0 else timed
        extra["pilot"] = {"steps": pilot, "step_s": step_s, "window_s": float(window_s),
                          "timed_asked": timed}
        timed = max(MIN_WINDOW_STEPS, min(timed, fits))
        warmup += pilot                    # warm-up steps too: none of them is timed

    shape = None
    rates, secs = [], []
    tokens = 0
    while True:
        w = len(rates)
        before = compile_count()
        tokens = 0
        window.open()
        for _ in range(timed):
            X, Y = draw()
            this_shape = tuple(shape_of(X))
            if shape is None:
                shape = this_shape
            elif this_shape != shape:
                raise BatchShapeError(f"batch shape changed from {shape} to {this_shape} inside "
                                      f"timed window {w + 1}; keep one shape (drop ragged tails)")
            n = num_tokens(X)
            if n <= 0:
                raise ValueError(f"a batch of shape {this_shape} holds {n} tokens; timing needs "
                                 "batches of at least one token")
            out = step(X, Y)
            tokens += n
        window.sync(out)
        dt = window.close(timed, f"timed window {w + 1}")
        if ready is not None and not ready(out):
            raise SyncError(f"timed window {w + 1} closed while the device was still busy: its "
                            f"sync ({getattr(sync, '__name__', sync)}) did not wait for the work")
        compiled = compile_count() - before
        if compiled:
            raise RecompileError(
                f"{compiled} compilation(s) happened inside timed window {w + 1} "
                f"(batch shape {shape}); a changed shape or dtype retraced the step. "
                "Keep one batch shape (drop ragged tails) and warm up past compilation.")
        rates.append(tokens / dt)
        secs.append(dt)
        if len(rates) >= windows and settles(rates[-windows:], target_spread):
            stable = True
            break
        if len(rates) >= max_windows or (budget_s is not None and sum(secs) >= budget_s
                                         and len(rates) >= windows):
            stable = False
            break
    draw.finish()
    return Throughput(tokens_per_s=statistics.median(rates[-windows:]), windows=rates,
                      seconds=secs, steps_per_window=timed, tokens_per_window=tokens,
                      warmup=warmup, batch_shape=shape or (), settled=windows, stable=stable,
                      target_spread=float(target_spread), extra=extra)


class Stopwatch:
    """Wall seconds per phase of one rung (``with watch("gates"): ...``): where a rung's time
    goes outside its timed windows, so the ladder's own cost can be read and bounded."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0


def phase(watch: Stopwatch | None, name: str):
    """``watch(name)``, or a block that records nothing when there is no ``watch``."""
    return contextlib.nullcontext() if watch is None else watch(name)
