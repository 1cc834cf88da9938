"""A whole ladder in sentences, computed from its numbers (framework-free): how to read its
waterfall (``reading``) and what it comes to (``summary``).

Both return lists of plain sentences (a page renders them as paragraphs or bullets). They
apply the crediting rules of ``perfladder.pages.claims``: only 'faster' verdicts are credited,
unsettled bars are named and credited with nothing, a smoke run is a check of the code.
"""
from __future__ import annotations

from perfladder.ladder.techniques import CONTROLS
from perfladder.pages.claims import (
    call,
    ceiling,
    is_smoke,
    short_reason,
    unsettled_clause,
)
from perfladder.pages.narrative import control_reading, learning_text
from perfladder.pages.words import rate
from perfladder.results.record import LadderResult, RungResult


def _names(items: list[tuple[RungResult, str]]) -> str:
    return ", ".join(f"{r.name} {r.label}" + (f" ({extra})" if extra else "") for r, extra in items)


def _calls(result: LadderResult, rungs: list[RungResult]) -> dict[str, list[tuple[RungResult, str]]]:
    """Waterfall rungs grouped by what may be said of them against their base."""
    out: dict[str, list[tuple[RungResult, str]]] = {"faster": [], "slower": [], "within noise": [],
                                                     "unsettled": []}
    for r in rungs:
        c = call(result, r)
        if c.word in out:
            out[c.word].append((r, f"{c.label} {c.against}" if c.ratio is not None else ""))
    return out


def _smoke_lines(result: LadderResult) -> list[str]:
    ran = [r for r in result.rungs if r.measured]
    skipped = [r for r in result.rungs if not r.measured]
    gates = [g for r in ran for g in r.gates]
    out = [f"A check of the code on {result.device} (smoke configuration): {len(ran)} of "
           f"{len(result.rungs)} rungs ran and {sum(g.passed for g in gates)} of {len(gates)} gates passed."]
    if skipped:
        out.append("Not run here: " + "; ".join(
            f"{r.name} ({short_reason(r.error)})" for r in skipped) + ".")
    out.append("No number of this run is a performance result: the bars and ratios exercise the "
               "code that draws them.")
    return out


def reading(result: LadderResult) -> list[str]:
    """How to read this ladder's waterfall, from its numbers."""
    bars = result.waterfall()
    if not bars:
        return [f"The {result.framework} ladder measured no waterfall rung, so there is nothing to read."]
    if is_smoke(result):
        return [f"These {len(bars)} bars come from a smoke run on {result.device}: they show that every "
                "rung ran and that the plot can be drawn; their heights and ratios are not performance."]
    out = ["Each bar is a configuration's median tokens/s over its settled windows and its whisker the "
           "range of those windows; each bar keeps every choice to its left that paid. A label is the "
           "ratio to the configuration the rung builds on, printed only where the verdict is beyond "
           "the noise; a hatched bar did not settle and is credited with nothing."]
    base = next((r for r in bars if r.name == result.baseline), None)
    best = result.best()
    if base is not None:
        left = [r for r in bars[: bars.index(base)]]
        if left:
            out.append("Left of the baseline, " + ", ".join(f"{r.name} ({r.label}, {rate(r.tokens_per_s)})"
                       for r in left) + " is the floor that the baseline's ratios leave out.")
        line = (f"From the baseline {base.name} ({rate(base.tokens_per_s)} tokens/s) to the fastest settled "
                f"bar, {best.name} ({best.label}, {rate(best.tokens_per_s)}), throughput rises "
                f"{best.tokens_per_s / base.tokens_per_s:.2f}x")
        clause = unsettled_clause(base)
        out.append(line + (f"; {clause}, so read that factor as approximate." if clause else "."))
    groups = _calls(result, bars)
    if groups["faster"]:
        top = max(groups["faster"], key=lambda p: p[0].ratio_prev or 0)[0]
        out.append(f"Credited, beyond the noise of both measurements: {_names(groups['faster'])}. "
                   f"The largest credited step is {top.name} ({top.label}).")
    else:
        out.append("No step of this waterfall is credited beyond the noise.")
    if groups["slower"]:
        out.append(f"Slower than the configuration they build on: {_names(groups['slower'])}.")
    if groups["within noise"]:
        out.append("Within the noise, so not credited: "
                   + ", ".join(f"{r.name} {r.label}" for r, _ in groups["within noise"]) + ".")
    if groups["unsettled"]:
        out.append("Unsettled, so not credited either way: "
                   + ", ".join(f"{r.name} {r.label}" for r, _ in groups["unsettled"]) + ".")
    out.append(ceiling_sentence(result, best))
    return out


def ceiling_sentence(result: LadderResult, best: RungResult | None = None) -> str:
    ceil = ceiling(result)
    if ceil is None:
        return ("This run carries no measured roofs of its device, so no ceiling line is drawn: "
                "measure the device's matmul rate on the same machine to get one.")
    out = (f"The dashed line is the model's ceiling at this device's measured bf16 matmul rate: "
           f"{ceil['tflops']:.0f} TFLOP/s over {ceil['flops_per_token'] / 1e6:.1f} MFLOP per token "
           f"is {rate(ceil['tokens_per_s'])} tokens/s")
    if best is not None:
        out += f"; the fastest bar, {best.name}, reaches {best.tokens_per_s / ceil['tokens_per_s']:.0%} of it"
    return out + "."


def summary(result: LadderResult) -> list[str]:
    """What the ladder comes to, as bullet sentences."""
    if is_smoke(result):
        return _smoke_lines(result) + [learning_text(result.learning)]
    bars = result.waterfall()
    if not bars:
        return [f"The {result.framework} ladder on {result.device} measured no waterfall rung."]
    best = result.best()
    base = next((r for r in bars if r.name == result.baseline), None)
    head = (f"{result.framework} on {result.device} ({(result.created or '')[:10] or 'date not recorded'}): "
            f"the fastest settled configuration, {best.name} ({best.label}), trains at "
            f"{rate(best.tokens_per_s)} tokens/s")
    if base is not None and base is not best:
        head += f", {best.tokens_per_s / base.tokens_per_s:.2f}x the baseline {base.name}"
    if best.mfu is not None:
        head += f", {best.mfu:.0%} MFU"
    ceil = ceiling(result)
    if ceil is not None:
        head += f", {best.tokens_per_s / ceil['tokens_per_s']:.0%} of the ceiling at the measured matmul rate"
    out = [head + "."]
    groups = _calls(result, bars)
    if groups["faster"]:
        out.append(f"Steps that paid beyond the noise: {_names(groups['faster'])}.")
    if groups["slower"]:
        out.append(f"Steps that cost time: {_names(groups['slower'])}.")
    quiet = groups["within noise"] + groups["unsettled"]
    if quiet:
        out.append("Not credited (within the noise, or not settled): "
                   + ", ".join(f"{r.name} {r.label}" for r, _ in quiet) + ".")
    for key in CONTROLS:
        r = result.by_key(key)
        text = control_reading(result, r) if r is not None else ""
        if text:
            out.append(text)
    skipped = [r for r in result.rungs if not r.measured]
    if skipped:
        out.append("Not measured: " + "; ".join(
            f"{r.name} {r.label} ({short_reason(r.error)})" for r in skipped) + ".")
    out.append(learning_text(result.learning))
    return out
