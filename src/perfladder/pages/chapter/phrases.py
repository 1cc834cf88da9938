"""Glue values the ladder pages share (framework-free): the model's sizes from the run's own
configuration, a rung's verdict as a phrase, and which run the page shows and why.

A phrase here is true of the run by construction: it is computed from the same record the
cards read (``perfladder.pages.claims.call``), so prose that inserts it needs no separate check.
"""
from __future__ import annotations

from typing import Callable

from perfladder.config import expected_num_params
from perfladder.pages.claims import call, config_of
from perfladder.pages.story import rung_numbers
from perfladder.results.committed import committed_runs, how_chosen
from perfladder.results.record import LadderResult
from perfladder.words import ratio

Number = Callable[[LadderResult], str]


def _big(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def config_numbers() -> dict[str, Number]:
    """The model and batch of the run's configuration: ``cfg_width``, ``cfg_blocks``,
    ``cfg_heads``, ``cfg_head_width``, ``cfg_hidden`` (the FFN's width), ``cfg_params``,
    ``cfg_context``, ``cfg_batch``, ``cfg_big_batch``, ``cfg_rows`` (token rows of one big batch)."""
    def get(fn):
        return lambda result: fn(config_of(result))
    return {"cfg_width": get(lambda c: str(c.num_hiddens)), "cfg_blocks": get(lambda c: str(c.num_blks)),
            "cfg_heads": get(lambda c: str(c.num_heads)),
            "cfg_hidden": get(lambda c: str(c.gpt().ffn_mult * c.num_hiddens)),
            "cfg_head_width": get(lambda c: str(c.num_hiddens // c.num_heads)),
            "cfg_params": get(lambda c: _big(expected_num_params(c.gpt()))),
            "cfg_context": get(lambda c: str(c.num_steps)), "cfg_batch": get(lambda c: str(c.batch_size)),
            "cfg_big_batch": get(lambda c: str(c.big_batch)),
            "cfg_rows": get(lambda c: f"{c.big_batch * c.num_steps:,}")}


VERDICT_PHRASES = {"faster": "pays, {r} {b}", "slower": "costs time, {r} {b}",
                   "within noise": "is within the noise of {b} ({r})",
                   "unsettled": "is not credited against {b}: the windows did not settle ({r})",
                   "smoke": "is a smoke measurement ({r} {b}), which decides nothing"}


def verdict_phrase(name: str) -> Number:
    """A rung's verdict against the rung it builds on, as a phrase: "pays, 1.05x B8", "is within
    the noise of B8 (1.01x)", "costs time, 0.97x B8", or that it was not credited; an unsettled
    gain that every window still shows is "pays, at least 1.20x R0"."""
    def phrase(result):
        r = result.rung(name)
        if not r.measured:
            return f"was not measured in this run ({r.error or r.result_kind})"
        c = call(result, r)
        if c.word not in VERDICT_PHRASES:
            return c.word
        r_text = c.label or ratio(r.ratio_prev) if r.ratio_prev is not None else "–"
        return VERDICT_PHRASES[c.word].format(r=r_text, b=c.against)
    return phrase


def verdict_phrases(*names: str) -> dict[str, Number]:
    return {f"v_{n}": verdict_phrase(n) for n in names}


def shown_rule(framework: str) -> Number:
    """Which run the page shows, and why: the committed run the rule picked (``reference.txt``),
    or this build's own run."""
    def words(result):
        runs = [run for run in committed_runs(None, framework) if run.created == result.created]
        if not runs:
            return (f"this build's own run, measured on {result.device} while the book was built; "
                    f"the dot strips below add it to the committed runs")
        return (f"the committed run benchmarks/results/{runs[0].name}, {how_chosen(None, framework)}; "
                "the dot strips below show the reference card's committed runs beside it")
    return words


def multi_gpu_numbers(framework: str) -> dict[str, Number]:
    """The committed multi-GPU run's measurements of ``framework`` (``pages.multigpu``), in words:
    ``mg_linear`` (the range of their fractions of linear scaling), ``mg_of_prediction`` (of
    what was predicted before each launch), ``mg_comm_ms`` (the all-reduce the cost model
    priced), ``mg_gpus``; and the chapter's own: ``ch_r5_comm_ms``, ``ch_r5_compute_ms``."""
    from perfladder.pages.comparison import CHAPTER
    from perfladder.pages.multigpu import FOR_RUNG, measurements
    from perfladder.words import percent

    def rows():
        return [m for name in FOR_RUNG for m in measurements(framework, name)]

    def span(values, fmt):
        values = sorted(v for v in values if v is not None)
        if not values:
            return "–"
        lo, hi = fmt(values[0]), fmt(values[-1])
        return lo if lo == hi else f"{lo} to {hi}"

    def of_prediction(m):
        p = (m.get("prediction") or {}).get("predicted_tokens_per_s") or m.get("predicted_tokens_per_s")
        return m["measured_tokens_per_s"] / p if p and m.get("measured_tokens_per_s") else None
    ch = CHAPTER["r5"][framework]
    return {"mg_linear": lambda result: span([m.get("efficiency_vs_linear") for m in rows()], percent),
            "mg_of_prediction": lambda result: span([of_prediction(m) for m in rows()], percent),
            "mg_comm_ms": lambda result: span([1e3 * (m.get("prediction") or {}).get("t_comm_s", 0) or None
                                               for m in rows()], lambda v: f"{v:.2f} ms"),
            "mg_gpus": lambda result: span([m.get("k") for m in rows()], str),
            "ch_r5_comm_ms": lambda result: f"{ch['t_comm_ms']} ms",
            "ch_r5_compute_ms": lambda result: f"{ch['t_compute_ms']} ms"}


def gradient_numbers() -> dict[str, Number]:
    """``cfg_grad_mb``: the fp32 gradients one all-reduce moves, in MB (4 bytes a parameter)."""
    return {"cfg_grad_mb": lambda result: f"{4 * expected_num_params(config_of(result).gpt()) / 1e6:.0f} MB"}


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def unmeasured_sentence(names: tuple[str, ...], why: str) -> Number:
    """A sentence naming which of ``names`` the run did not measure, and ``why`` such rungs may
    be missing ("" when it measured them all): the stories of those rungs then say nothing."""
    def sentence(result: LadderResult) -> str:
        measured = {r.name for r in result.rungs if r.measured}
        missing = [n for n in names if n not in measured]
        if not missing:
            return ""
        return f"This run has no measurement of {_names(missing)}: {why}."
    return sentence


def rung_value(name: str, field: str) -> Number:
    """A rung's own glue value (``story.rung_numbers``) for a page's number: computed for every
    run, so that a story naming a rung the run may lack (B15 needs nvmath-python) still formats."""
    def value(result: LadderResult) -> str:
        found = [r for r in result.rungs if r.name == name]
        if not found:
            raise KeyError(name)
        return rung_numbers(result, found[0])[f"{name}_{field}"]
    return value
