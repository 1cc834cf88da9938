"""One typed record for a data-parallel measurement, shared by both frameworks (no framework imports).

A multi-GPU number means little alone; ``DataParallelMeasurement`` keeps beside it what it
is judged against: the cost model's prediction (made before the launch), the all-reduce
bandwidth the ranks measured, and the single-device baseline in the same form.

The baseline must be *settled*: ``settle_baseline`` re-measures once when its windows spread
by more than ``SETTLE_SPREAD``, and a baseline unsettled twice gives no efficiency at all
(``efficiency_vs_linear`` is ``None`` with the reason) rather than a noisy ratio.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

SETTLE_SPREAD = 0.05
FORMS = ("seed", "fast")          # seed: eager/jitted fp32 at batch 64; fast: the fastest recipe
FRAMEWORKS = ("torch", "jax")
# how the ranks are put together
# 'independent': k copies of the single-device step at once, no gradient exchange -- a control
# that prices running k devices together apart from communicating between them
MECHANISMS = ("ddp", "fsdp2", "mesh", "mesh-fsdp", "jax.distributed", "independent")
STATUSES = ("measured", "skipped", "failed")


def check_form(form) -> str:
    if form not in FORMS:
        raise ValueError(f"form={form!r} is not valid; valid choices: {FORMS}")
    return form


def spread_of(windows) -> float:
    """(max - min) / median of the windows' tokens/s."""
    windows = list(windows)
    if not windows:
        raise ValueError("spread_of needs at least one window")
    return (max(windows) - min(windows)) / statistics.median(windows)


@dataclass
class Baseline:
    """The single-device rate a multi-device run is judged against, and whether it settled."""
    tokens_per_s: float              # the last attempt's median
    windows: list[float]
    spread: float
    settled: bool
    attempts: list[dict] = field(default_factory=list)   # every attempt: tokens_per_s, windows, spread
    max_spread: float = SETTLE_SPREAD
    peak_mem_bytes: int | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Baseline":
        return cls(**d)


def settle_baseline(measure: Callable[[], Any], max_spread: float = SETTLE_SPREAD) -> Baseline:
    """Measure the single-device baseline; once more if its windows spread > ``max_spread``.

    ``measure()`` returns an object with ``tokens_per_s`` and ``windows`` (a
    ``perfladder.measure.timing.Throughput``) or a ``(tokens_per_s, windows)`` pair. The second
    attempt, if taken, is the one reported; ``settled`` says whether it came in under the bar.
    """
    attempts = []
    for _ in range(2):
        got = measure()
        rate, windows = (got if isinstance(got, tuple) else (got.tokens_per_s, got.windows))
        windows = [float(w) for w in windows]
        attempts.append({"tokens_per_s": float(rate), "windows": windows, "spread": spread_of(windows)})
        if attempts[-1]["spread"] <= max_spread:
            break
    last = attempts[-1]
    return Baseline(tokens_per_s=last["tokens_per_s"], windows=last["windows"],
                    spread=last["spread"], settled=last["spread"] <= max_spread,
                    attempts=attempts, max_spread=max_spread)


def baseline_from_windows(windows, max_spread: float = SETTLE_SPREAD) -> Baseline:
    """A ``Baseline`` from one measurement already taken (e.g. a ladder rung's windows);
    whoever took it re-measures once if ``settled`` comes back False."""
    windows = [float(w) for w in windows]
    spread = spread_of(windows)
    rate = statistics.median(windows)
    return Baseline(tokens_per_s=rate, windows=windows, spread=spread, settled=spread <= max_spread,
                    attempts=[{"tokens_per_s": rate, "windows": windows, "spread": spread}],
                    max_spread=max_spread)


def efficiency(measured_tokens_per_s: float, k: int, baseline: Baseline | None
               ) -> tuple[float | None, str | None]:
    """``(measured / (k x baseline), None)``, or ``(None, reason)`` when there is no trustworthy baseline."""
    if baseline is None:
        return None, "no single-device baseline was measured"
    if not baseline.settled:
        spreads = ", ".join(f"{100 * a['spread']:.1f}%" for a in baseline.attempts)
        return None, (f"single-device baseline did not settle: window spread {spreads} "
                      f"(over {100 * baseline.max_spread:.0f}% in every attempt), so no "
                      "efficiency is computed from it")
    return measured_tokens_per_s / (k * baseline.tokens_per_s), None


@dataclass
class DataParallelMeasurement:
    """One k-device data-parallel measurement with its prediction and its baseline."""
    framework: str                        # 'torch' | 'jax'
    mechanism: str                        # MECHANISMS
    form: str                             # 'seed' | 'fast'
    k: int                                # devices (= ranks for torch)
    per_rank_batch: int
    seq_len: int
    status: str = "measured"              # 'measured' | 'skipped' | 'failed'
    reason: str | None = None             # why skipped / failed
    processes: int = 1
    nodes: int = 1
    recipe: dict = field(default_factory=dict)
    prediction: dict | None = None        # costmodel.Prediction.to_dict(), made before the launch
    predicted_tokens_per_s: float | None = None
    predicted_at_measured_bw_tokens_per_s: float | None = None
    measured_tokens_per_s: float | None = None
    windows: list[float] = field(default_factory=list)   # summed over ranks, per window
    spread: float | None = None
    bus_bw_measured: float | None = None  # bytes/s, busbw convention, timed on the ranks
    bus_bw_assumed: float | None = None
    efficiency_vs_linear: float | None = None
    efficiency_note: str | None = None
    peak_mem_bytes_per_gpu: list = field(default_factory=list)
    baseline: dict | None = None          # Baseline.to_dict()
    device: str = ""
    notes: list[str] = field(default_factory=list)
    ranks: list[dict] = field(default_factory=list)      # per-rank raw records

    def __post_init__(self):
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"framework={self.framework!r} is not valid; valid choices: {FRAMEWORKS}")
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism={self.mechanism!r} is not valid; valid choices: {MECHANISMS}")
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is not valid; valid choices: {STATUSES}")
        check_form(self.form)

    @property
    def global_batch(self) -> int:
        return self.k * self.per_rank_batch

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["global_batch"] = self.global_batch
        return d

    def line(self) -> str:
        head = f"{self.framework} {self.mechanism} {self.form} k={self.k}"
        if self.status != "measured":
            return f"{head}: {self.status} -- {self.reason}"
        eff = ("efficiency n/a" if self.efficiency_vs_linear is None
               else f"{100 * self.efficiency_vs_linear:.1f}% of linear")
        pred = ("" if self.predicted_tokens_per_s is None
                else f" (predicted floor {self.predicted_tokens_per_s:,.0f})")
        bw = "" if self.bus_bw_measured is None else f", all-reduce {self.bus_bw_measured / 1e9:.3g} GB/s"
        return (f"{head}: {self.measured_tokens_per_s:,.0f} tokens/s{pred}, {eff}, spread "
                f"{100 * (self.spread or 0):.1f}%{bw}")


def record(*, framework: str, mechanism: str, form: str, k: int, per_rank_batch: int,
           seq_len: int, windows, baseline: Baseline | None, prediction=None,
           bus_bw_measured: float | None = None, peak_mem_bytes_per_gpu=(), recipe=None,
           processes: int = 1, nodes: int = 1, device: str = "", notes=(),
           ranks=()) -> DataParallelMeasurement:
    """A measured ``DataParallelMeasurement``: median and spread from ``windows`` (tokens/s of
    every window, summed over ranks), efficiency against ``baseline``, and -- when the ranks
    timed their all-reduce -- the prediction recomputed with the bandwidth they measured."""
    windows = [float(w) for w in windows]
    rate = statistics.median(windows)
    eff, why = efficiency(rate, k, baseline)
    pred = prediction.to_dict() if hasattr(prediction, "to_dict") else prediction
    at_measured = None
    if pred is not None and bus_bw_measured and k > 1:
        from perfladder.multigpu.costmodel import ring_allreduce_seconds
        t_comm = ring_allreduce_seconds(pred["grad_bytes"], k, bus_bw_measured)
        at_measured = k * per_rank_batch * seq_len / (pred["t_compute_s"] + t_comm)
    return DataParallelMeasurement(
        framework=framework, mechanism=mechanism, form=form, k=k, per_rank_batch=per_rank_batch,
        seq_len=seq_len, processes=processes, nodes=nodes, recipe=dict(recipe or {}),
        prediction=pred, predicted_tokens_per_s=None if pred is None else pred["predicted_tokens_per_s"],
        predicted_at_measured_bw_tokens_per_s=at_measured, measured_tokens_per_s=rate,
        windows=windows, spread=spread_of(windows), bus_bw_measured=bus_bw_measured,
        bus_bw_assumed=None if pred is None else pred["bus_bytes_per_s"],
        efficiency_vs_linear=eff, efficiency_note=why,
        peak_mem_bytes_per_gpu=list(peak_mem_bytes_per_gpu),
        baseline=None if baseline is None else baseline.to_dict(), device=device,
        notes=list(notes), ranks=list(ranks))


def not_measured(*, status: str, reason: str, framework: str, mechanism: str, form: str, k: int,
                 per_rank_batch: int, seq_len: int, **kw) -> DataParallelMeasurement:
    """A skipped or failed measurement, with the reason (never a made-up number)."""
    if status not in ("skipped", "failed"):
        raise ValueError(f"status={status!r} is not valid here; valid choices: ('skipped', 'failed')")
    return DataParallelMeasurement(framework=framework, mechanism=mechanism, form=form, k=k,
                                   per_rank_batch=per_rank_batch, seq_len=seq_len, status=status,
                                   reason=reason, **kw)
