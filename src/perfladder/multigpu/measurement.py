"""One typed record for a data-parallel measurement, shared by both frameworks (no framework imports).

A multi-GPU number means little alone; ``DataParallelMeasurement`` keeps beside it what it
is judged against: the cost model's prediction (made before the launch), the all-reduce
bandwidth the ranks measured, and the single-device baseline in the same form.

Both the k-device measurement and its baseline are judged by the ladder's one settle rule
(``perfladder.measure.timing``: the windows' spread against the config's ``target_spread``).
``settle_baseline`` re-measures an unsettled baseline once (``measure_settled``), and a
baseline unsettled twice gives no efficiency at all (``efficiency_vs_linear`` is ``None``
with the reason) rather than a noisy ratio.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from perfladder import words
from perfladder.measure.evidence import Timing
from perfladder.measure.timing import (
    DEFAULT_TARGET_SPREAD,
    did_settle,
    measure_settled,
    settles,
    spread_of,
)
from perfladder.multigpu.costmodel import ring_allreduce_seconds

FORMS = ("seed", "fast")          # seed: the seed's step at its batch; fast: the fastest recipe
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


def _as_recipe(recipe, from_dict: Callable):
    return from_dict(recipe) if isinstance(recipe, dict) else recipe


def given_recipe(form: str, recipe, from_dict: Callable, resolver: str):
    """The recipe a launch of ``form`` runs, as handed to the parallel machinery (a side's
    ``Recipe`` or its ``to_dict()``, read back by ``from_dict``): the machinery reads no rung
    declarations, so ``None`` is refused, naming where a form's recipe is resolved."""
    check_form(form)
    if recipe is None:
        raise ValueError(f"recipe=None: pass the recipe of form={form!r}, e.g. {resolver}(config, form)")
    return _as_recipe(recipe, from_dict)


def recipe_of_form(form: str, recipe, from_dict: Callable, seed: Callable, fast: Callable):
    """The recipe of ``form``: the seed's (``seed()``, fixed: another ``recipe`` is refused), or
    ``recipe`` (a side's ``Recipe`` or its ``to_dict()``; default ``fast()``). The one rule both
    sides' ``rungs.recipes.recipe_for`` follow."""
    recipe = None if recipe is None else _as_recipe(recipe, from_dict)
    if check_form(form) == "seed":
        fixed = seed()
        if recipe is not None and recipe != fixed:
            raise ValueError("form='seed' is the chapter's fixed recipe; pass another "
                             "recipe only with form='fast'")
        return fixed
    return fast() if recipe is None else recipe


@dataclass
class Baseline:
    """The single-device rate a multi-device run is judged against, and whether it settled."""
    tokens_per_s: float              # the last attempt's median
    windows: list[float]
    spread: float
    settled: bool
    attempts: list[dict] = field(default_factory=list)   # every attempt: tokens_per_s, windows, spread
    max_spread: float = DEFAULT_TARGET_SPREAD            # the target its windows were held to
    peak_mem_bytes: int | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Baseline":
        return cls(**d)


def _attempt(got, target_spread: float) -> dict:
    """One measurement as a baseline attempt: a ``Throughput`` / ``Timing`` (its own verdict and
    target) or a ``(tokens_per_s, windows)`` pair (judged by ``settles`` against ``target_spread``)."""
    if isinstance(got, tuple):
        rate, windows = got
        windows = [float(w) for w in windows]
        return {"tokens_per_s": float(rate), "windows": windows, "spread": spread_of(windows),
                "settled": settles(windows, target_spread), "target_spread": target_spread}
    kept = [float(w) for w in got.settled_windows]
    return {"tokens_per_s": float(statistics.median(kept)), "windows": [float(w) for w in got.windows],
            "spread": spread_of(kept), "settled": bool(did_settle(got)),
            "target_spread": got.target_spread or target_spread}


def _baseline(attempts: list[dict]) -> Baseline:
    last = attempts[-1]
    return Baseline(tokens_per_s=last["tokens_per_s"], windows=last["windows"], spread=last["spread"],
                    settled=last["settled"], max_spread=last["target_spread"],
                    attempts=[{k: a[k] for k in ("tokens_per_s", "windows", "spread")} for a in attempts])


def settle_baseline(measure: Callable[[], Any], target_spread: float = DEFAULT_TARGET_SPREAD) -> Baseline:
    """Measure the single-device baseline; once more if it did not settle (``measure_settled``).

    ``measure()`` returns a ``perfladder.measure.timing.Throughput`` or a
    ``(tokens_per_s, windows)`` pair (held to ``target_spread``). The second attempt, if taken,
    is the one reported; ``settled`` says whether it settled.
    """
    attempts: list[dict] = []

    def once() -> dict:
        attempts.append(_attempt(measure(), target_spread))
        return attempts[-1]
    measure_settled(once, settled=lambda a: a["settled"])
    return _baseline(attempts)


def baseline_of(t) -> Baseline:
    """A ``Baseline`` from one measurement already taken (a ``Throughput`` or a rung's
    ``Timing``), with that measurement's own verdict; whoever took it re-measures once if
    ``settled`` comes back False."""
    return _baseline([_attempt(t, DEFAULT_TARGET_SPREAD)])


def baseline_from_windows(windows, target_spread: float = DEFAULT_TARGET_SPREAD) -> Baseline:
    """A ``Baseline`` of windows (tokens/s) someone else measured, held to ``target_spread``."""
    windows = [float(w) for w in windows]
    return _baseline([_attempt((statistics.median(windows), windows), target_spread)])


def efficiency(measured_tokens_per_s: float, k: int, baseline: Baseline | None
               ) -> tuple[float | None, str | None]:
    """``(measured / (k x baseline), None)``, or ``(None, reason)`` when there is no trustworthy baseline."""
    if baseline is None:
        return None, "no single-device baseline was measured"
    if not baseline.settled:
        spreads = ", ".join(words.percent(a["spread"], 1) for a in baseline.attempts)
        return None, (f"single-device baseline did not settle: window spread {spreads} "
                      f"(over {words.percent(baseline.max_spread)} in every attempt), so no "
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
    prediction: dict | None = None        # costmodel.Estimate.to_dict() at this k, made before the launch
    predicted_tokens_per_s: float | None = None
    predicted_at_measured_bw_tokens_per_s: float | None = None
    measured_tokens_per_s: float | None = None
    windows: list[float] = field(default_factory=list)   # summed over ranks, per window
    spread: float | None = None           # of the settled windows
    timing: dict | None = None            # Timing.to_dict(): the windows, their seconds, the verdict
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
               else f"{words.percent(self.efficiency_vs_linear, 1)} of linear")
        pred = ("" if self.predicted_tokens_per_s is None
                else f" (predicted floor {words.rate(self.predicted_tokens_per_s)})")
        bw = "" if self.bus_bw_measured is None else f", all-reduce {words.gbps(self.bus_bw_measured)} GB/s"
        return (f"{head}: {words.rate(self.measured_tokens_per_s)} tokens/s{pred}, {eff}, spread "
                f"{words.percent(self.spread, 1)}{bw}")


def record(*, framework: str, mechanism: str, form: str, k: int, per_rank_batch: int,
           seq_len: int, timing: Timing, baseline: Baseline | None, prediction=None,
           bus_bw_measured: float | None = None, peak_mem_bytes_per_gpu=(), recipe=None,
           processes: int = 1, nodes: int = 1, device: str = "", notes=(),
           ranks=()) -> DataParallelMeasurement:
    """A measured ``DataParallelMeasurement``: median and spread of ``timing``'s settled
    windows (tokens/s of each window, summed over ranks), efficiency against ``baseline``,
    and -- when the ranks timed their all-reduce -- the prediction recomputed with the
    bandwidth they measured."""
    rate = statistics.median(timing.settled_windows)
    eff, why = efficiency(rate, k, baseline)
    pred = prediction.to_dict() if hasattr(prediction, "to_dict") else prediction
    at_measured = None
    if pred is not None and bus_bw_measured and k > 1:
        t_comm = ring_allreduce_seconds(pred["grad_bytes"], k, bus_bw_measured)
        at_measured = k * per_rank_batch * seq_len / (pred["t_compute_s"] + t_comm)
    return DataParallelMeasurement(
        framework=framework, mechanism=mechanism, form=form, k=k, per_rank_batch=per_rank_batch,
        seq_len=seq_len, processes=processes, nodes=nodes, recipe=dict(recipe or {}),
        prediction=pred, predicted_tokens_per_s=None if pred is None else pred["predicted_tokens_per_s"],
        predicted_at_measured_bw_tokens_per_s=at_measured, measured_tokens_per_s=rate,
        windows=list(timing.windows), spread=timing.spread, timing=timing.to_dict(),
        bus_bw_measured=bus_bw_measured,
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
