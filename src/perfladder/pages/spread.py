"""How the batch-64 rungs vary across every committed run (framework-free, matplotlib only).

At batch 64 a step is short enough that how fast the host issues it can decide the rate, so the
same code measures differently from one build to the next on the same GPU type. A page shows
one run (``perfladder.results.committed.reference_run``); this module shows all of them:

* ``evidence(framework)``: every committed full-configuration run of today's schema on the
  book's reference card, read the one way pages read runs (``committed.read_run``), oldest first;
* ``figure(framework, shown)``: a dot strip per batch-64 rung, every run a dot (its rate, and
  its ratio to the rung it builds on), the run the page shows drawn larger and named, each dot
  shaped by what set the pace of that run's step (host or device);
* ``spread_numbers(framework)``: glue values for the prose (``sp_runs``, ``sp_R2_range``,
  ``sp_R2_verdicts``, ``sp_R2_host``, ...), each computed from the same runs, so a sentence about
  the spread says what the dots show;
* ``host_sets_the_spread`` / ``device_wanders``: checks across the runs of what makes a rung
  vary (its kernels' time steady while its step's wanders: the host; or its kernels' own time).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from perfladder.measure.verdict import HOST
from perfladder.pages.claims import call, regime_of
from perfladder.results.committed import committed_runs, read_run, reference_card
from perfladder.results.record import LadderResult
from perfladder.words import rate, ratio

BATCH64 = {"torch": ("R0", "R1", "R2"), "jax": ("R0", "R1", "R2a", "R2")}
DOT_COLOR, SHOWN_COLOR = "#9a9a9a", "#d62728"
MARKERS = {HOST: "o", "not profiled": "D"}     # any other regime: the device sets the pace, "s"
VERDICT_WORDS = {"faster": "faster", "slower": "slower", "within noise": "within the noise",
                 "unsettled": "not settled", "smoke": "smoke", "start": "first", "skipped": "not measured"}


@lru_cache(maxsize=4)
def _evidence(root: str | None, framework: str) -> tuple[LadderResult, ...]:
    card = reference_card(root)
    return tuple(read_run(run.path) for run in committed_runs(root, framework)
                 if card is None or card in run.device)


def evidence(framework: str, root: str | Path | None = None) -> list[LadderResult]:
    """Every committed full-configuration run of ``framework`` (today's schema) on the book's
    reference card (``reference.txt``'s ``card``; every card when it names none), oldest first:
    a run of another GPU is another population, drawn beside the strip, never counted in it."""
    return list(_evidence(None if root is None else str(root), framework))


def same_run(a: LadderResult, b: LadderResult) -> bool:
    return (a.framework, a.device, a.created) == (b.framework, b.device, b.created)


@dataclass(frozen=True)
class Dot:
    """One run's record of one batch-64 rung."""
    run: str                 # the run's date and device, as the strip labels it
    rate: float
    ratio: float | None      # over the rung it builds on (None: R0, or its base unmeasured)
    regime: str
    word: str                # the verdict as ``claims.call`` reads it
    shown: bool
    device_ms: float | None = None   # the profiled kernels' time per step
    step_ms: float | None = None     # the step's time at the measured rate


def joins(runs: list[LadderResult], shown: LadderResult | None) -> bool:
    """Is ``shown`` a dot of its own beside ``runs``: not one of them, and of a GPU they were
    measured on (a run of another GPU is a different population, not a wider spread)?"""
    return (shown is not None and not any(same_run(r, shown) for r in runs)
            and any(r.device == shown.device for r in runs))


def dots(runs: list[LadderResult], name: str, shown: LadderResult | None = None) -> list[Dot]:
    """Rung ``name`` of every run that measured it (``shown`` added when it ``joins`` them)."""
    every = list(runs) + ([shown] if joins(runs, shown) else [])
    out = []
    for res in every:
        try:
            r = res.rung(name)
        except KeyError:
            continue
        if not r.measured:
            continue
        out.append(Dot(f"{(res.created or '')[:10]} {res.device}", r.tokens_per_s, r.ratio_prev, regime_of(r),
                       call(res, r).word, shown is not None and same_run(res, shown),
                       r.profile.device_ms if r.profile else None,
                       1e3 * r.batch_size * r.seq_len / r.tokens_per_s if r.batch_size and r.seq_len
                       else None))
    return out


# -- what the prose may say about the spread ---------------------------------------------------
def _counted(n: int, total: int, what: str) -> str:
    return f"{what} in all {total} runs" if n == total else f"{what} in {n} of the {total} runs"


def range_text(ds: list[Dot]) -> str:
    """The ratios' range, "0.63x to 1.11x" (one value when all agree to the printed digit)."""
    rs = sorted(d.ratio for d in ds if d.ratio is not None)
    if not rs:
        return "–"
    lo, hi = ratio(rs[0]), ratio(rs[-1])
    return lo if lo == hi else f"{lo} to {hi}"


def verdicts_text(ds: list[Dot]) -> str:
    """How the runs' verdicts fall: "faster in 9, within the noise in 2 and not settled in 1 of
    the 12 runs" (or "faster in all 12 runs")."""
    if not ds:
        return "–"
    counts: dict[str, int] = {}
    for d in ds:
        counts[d.word] = counts.get(d.word, 0) + 1
    parts = sorted(counts.items(), key=lambda kv: -kv[1])
    if len(parts) == 1:
        return _counted(parts[0][1], len(ds), VERDICT_WORDS.get(parts[0][0], parts[0][0]))
    said = [f"{VERDICT_WORDS.get(w, w)} in {n}" for w, n in parts]
    return f"{', '.join(said[:-1])} and {said[-1]} of the {len(ds)} runs"


def host_text(ds: list[Dot]) -> str:
    """In how many runs the rung's step waited on the host: "host-bound in 9 of the 12 runs"
    (of the runs that profiled it)."""
    ds = [d for d in ds if d.regime != "not profiled"]
    if not ds:
        return "not profiled in any run"
    return _counted(sum(d.regime == HOST for d in ds), len(ds), HOST)


def _ms_range(values: list[float]) -> str:
    if not values:
        return "–"
    lo, hi = f"{min(values):.1f} ms", f"{max(values):.1f} ms"
    return lo if lo == hi else f"{lo[:-3]} to {hi}"


def device_ms_text(ds: list[Dot]) -> str:
    """The range of the rung's profiled kernel time per step across the runs, "10.1 to 10.2 ms"."""
    return _ms_range([d.device_ms for d in ds if d.device_ms])


def step_ms_text(ds: list[Dot]) -> str:
    """The range of the rung's step time across the runs, "11.7 to 19.1 ms"."""
    return _ms_range([d.step_ms for d in ds if d.step_ms])


STEADY = 0.05        # kernels "take the same time in every run": within 5% of each other
WANDERS = 0.20       # a step "varies": its longest at least 20% over its shortest


def _span(values: list[float]) -> float | None:
    return max(values) / min(values) - 1 if values and min(values) > 0 else None


def host_sets_the_spread(framework: str, name: str, root: str | Path | None = None):
    """A check (``perfladder.pages.story.Check``'s test) across every committed run and the one
    shown: rung ``name``'s kernels take the same time in every run (within ``STEADY``) while
    its step time varies by more than ``WANDERS``: what differs between the runs is the host."""
    def test(shown):
        ds = dots(evidence(framework, root), name, shown)
        dev = _span([d.device_ms for d in ds if d.device_ms])
        step = _span([d.step_ms for d in ds if d.step_ms])
        if dev is None or step is None:
            return False, f"{name}: no profiled kernel time to compare across the runs"
        return (dev <= STEADY and step >= WANDERS,
                f"{name} across {len(ds)} runs: kernels {device_ms_text(ds)}, step {step_ms_text(ds)}")
    return test


def device_wanders(framework: str, name: str, root: str | Path | None = None):
    """A check across the runs: rung ``name``'s own kernel time varies by more than ``WANDERS``."""
    def test(shown):
        ds = dots(evidence(framework, root), name, shown)
        dev = _span([d.device_ms for d in ds if d.device_ms])
        return (dev is not None and dev >= WANDERS,
                f"{name} across {len(ds)} runs: kernels {device_ms_text(ds)}")
    return test


def rates_text(ds: list[Dot]) -> str:
    """The rates' range in tokens/s, "534k to 711k"."""
    if not ds:
        return "–"
    lo, hi = min(d.rate for d in ds), max(d.rate for d in ds)
    return f"{rate(lo)} to {rate(hi)}"


Number = Callable[[LadderResult], str]


def spread_numbers(framework: str, root: str | Path | None = None) -> dict[str, Number]:
    """Glue values of the spread across every committed run (the shown run added when it is
    not one of them): ``sp_runs`` (how many runs, of which device), and per batch-64 rung
    ``sp_<R>_range`` (its ratio to its base), ``sp_<R>_rates``, ``sp_<R>_verdicts``, ``sp_<R>_host``,
    ``sp_<R>_device_ms``, ``sp_<R>_step_ms``."""
    def runs_of(shown):
        return evidence(framework, root)

    def count(shown):
        runs = runs_of(shown)
        devices = sorted({r.device for r in runs})
        return f"{len(runs) + joins(runs, shown)} runs on {' and '.join(devices)}"
    out: dict[str, Callable[[LadderResult], str]] = {"sp_runs": count}
    for name in BATCH64[framework]:
        for field, fn in (("range", range_text), ("rates", rates_text), ("verdicts", verdicts_text),
                          ("host", host_text), ("device_ms", device_ms_text), ("step_ms", step_ms_text)):
            out[f"sp_{name}_{field}"] = (lambda shown, n=name, f=fn: f(dots(runs_of(shown), n, shown)))
    return out


# -- the figure ---------------------------------------------------------------------------------
def figure(framework: str, shown: LadderResult | None = None, runs: list[LadderResult] | None = None,
           path: str | Path | None = None):
    """A dot strip per batch-64 rung: left, every run's rate; right, its ratio to the rung it
    builds on. Circles: the step waited on the host (host-bound); squares: the device set the
    pace. The run the page shows is larger, red, and named in the title."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    runs = evidence(framework) if runs is None else runs
    names = BATCH64[framework]
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.5, 0.55 * len(names) + 1.4), sharey=True)
    for y, name in enumerate(names):
        ds = dots(runs, name, shown)
        if shown is not None and not any(d.shown for d in ds):     # another GPU: drawn, not counted
            ds += [Dot(**{**vars(d), "shown": True}) for d in dots([shown], name, None)]
        for d in sorted(ds, key=lambda d: d.shown):
            style = dict(marker=MARKERS.get(d.regime, "s"), zorder=3 if d.shown else 2,
                         s=70 if d.shown else 28, alpha=1.0 if d.shown else 0.6,
                         facecolor=SHOWN_COLOR if d.shown else "none",
                         edgecolor=SHOWN_COLOR if d.shown else DOT_COLOR)
            left.scatter([d.rate], [y], **style)
            if d.ratio is not None:
                right.scatter([d.ratio], [y], **style)
    left.set_yticks(range(len(names)), names, fontsize=8)
    left.invert_yaxis()
    left.set_xscale("log")
    left.set_xlabel("tokens/s (log)", fontsize=8)
    right.axvline(1.0, color="#444444", linestyle="--", linewidth=0.8)
    right.set_xscale("log")
    right.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.3g}x"))
    right.xaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:.3g}x"))
    left.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: rate(v)))
    left.xaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: rate(v)))
    right.set_xlabel("ratio to the rung it builds on (log)", fontsize=8)
    for ax in (left, right):
        ax.tick_params(which="both", labelsize=6)
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    handles = [Line2D([], [], marker="o", linestyle="", markerfacecolor="none", markeredgecolor=DOT_COLOR,
                      label="host-bound step"),
               Line2D([], [], marker="s", linestyle="", markerfacecolor="none", markeredgecolor=DOT_COLOR,
                      label="the device sets the pace"),
               Line2D([], [], marker="D", linestyle="", markerfacecolor="none", markeredgecolor=DOT_COLOR,
                      label="not profiled"),
               Line2D([], [], marker="o", linestyle="", color=SHOWN_COLOR, label="the run this page shows")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=7, frameon=False)
    count = len(runs) + joins(runs, shown)
    on_strip = shown is not None and (joins(runs, shown) or any(same_run(r, shown) for r in runs))
    what = (f"shown: {(shown.created or '')[:10]} on {shown.device}" if on_strip else
            f"shown: {shown.device}, not counted among them" if shown is not None else "no run shown")
    devices = " and ".join(sorted({r.device for r in runs}))
    fig.suptitle(f"{framework}: batch-64 rungs in {count} committed runs on {devices} ({what})", fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def show(page) -> None:
    """The dot strip of a ``LadderPage``'s framework, its shown run highlighted (a notebook cell)."""
    import matplotlib.pyplot as plt
    fig = figure(page.framework, page.shown)
    try:
        from IPython import get_ipython
        from IPython.display import display
        if get_ipython() is not None:
            display(fig)
    except ImportError:
        pass
    plt.close(fig)


def across_numbers(framework: str, names: tuple[str, ...],
                   root: str | Path | None = None) -> dict[str, Callable[[LadderResult], str]]:
    """For rungs past batch 64 whose outcome differs between runs: ``sp_<R>_verdicts`` (how the
    committed runs, and the shown one when it ``joins`` them, fall) and ``sp_<R>_device_ms``
    (the range of the rung's kernel time per step)."""
    out: dict[str, Callable[[LadderResult], str]] = {}
    for n in names:
        out[f"sp_{n}_verdicts"] = lambda shown, n=n: verdicts_text(dots(evidence(framework, root), n, shown))
        out[f"sp_{n}_device_ms"] = (lambda shown, n=n:
                                    device_ms_text(dots(evidence(framework, root), n, shown)))
    return out
