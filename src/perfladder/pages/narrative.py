"""The sentences a page says about a rung, computed from its evidence (framework-free).

Nothing here is written for a particular run: each sentence is assembled from a rung's
timing windows, its verdict against the rung it builds on (read through
``perfladder.pages.claims.call``), the regime of the step it builds on, its memory, receipt and
prediction, so a sentence cannot contradict the numbers beside it. A smoke run (the tiny
configuration on a CPU) is described as a check of the code: no verdict, regime or ratio of
it is read as performance.

Per rung: ``did`` (what it measured), ``why`` (its base's regime against what the technique
attacks; a bf16 rung against its fp32 control), ``next_move`` (from its own regime), all
three in ``story``. The wording of techniques lives in ``perfladder.ladder.techniques``; the
waterfall's reading and the ladder's summary in ``perfladder.pages.reading``.
"""
from __future__ import annotations

from perfladder.ladder.techniques import (
    COMPUTE,
    CONTROLS,
    DIAGNOSES,
    HOST,
    MEMORY,
    NEXT_MOVES,
    technique,
)
from perfladder.measure.verdict import MIN_EFFECT, above_unsettled_base
from perfladder.pages.claims import (
    Call,
    against,
    call,
    is_smoke,
    regime_of,
    rung_or_none,
    settled,
    unsettled_clause,
    windows_text,
)
from perfladder.pages.words import gib, rate
from perfladder.results.record import LadderResult, RungResult

BASELINE = "the baseline, against which the ladder's cumulative factor is taken"


# -- per rung ------------------------------------------------------------------------------------
def _comparison(c: Call, r: RungResult, base: RungResult | None) -> str:
    a = c.against
    if c.word == "faster":
        return (f"{c.ratio:.2f}x {a}: faster, beyond the noise of both (its slowest window, "
                f"{rate(r.timing.low)}, beats {a}'s fastest, {rate(base.timing.high)})")
    if c.word == "slower" and not c.shaky:
        return (f"{c.ratio:.2f}x {a}: slower, beyond the noise of both (its fastest window, "
                f"{rate(r.timing.high)}, is below {a}'s slowest, {rate(base.timing.low)})")
    if c.word == "slower":
        return (f"{c.ratio:.2f}x {a}: slower. Every one of its windows ({windows_text(r)}) is below "
                f"{a}'s slowest ({rate(base.timing.low)}), but {c.shaky}, so the size of the "
                "loss is uncertain though its sign is not")
    if c.word == "within noise":
        return (f"{c.ratio:.2f}x {a}: within the noise (the window ranges overlap or differ by "
                f"under {MIN_EFFECT:.0%}), so no speedup is credited")
    direction = ""
    if base is not None and base.timing is not None and r.timing.low > base.timing.high:
        direction = f"; every window lies above {a}'s fastest, but the size of the step is not measured"
    return (f"unsettled against {a}: {unsettled_clause(r, base) or 'the windows did not settle'}, "
            f"so no speedup is credited{direction}")


def did(result: LadderResult, r: RungResult) -> str:
    """What the rung measured, in one or two sentences."""
    if not r.measured:
        why_not = (r.error or "; ".join(r.notes) or "no reason recorded").rstrip(". ")
        out = f"{r.name} ({r.label}) was not measured: {why_not}."
        if r.prediction is not None:
            out += (f" The prediction written down for it: {rate(r.prediction.predicted_tokens_per_s)} "
                    f"tokens/s ({r.prediction.model}).")
        return out
    head = f"{r.name} ran at {rate(r.tokens_per_s)} tokens/s"
    if is_smoke(result):
        return (f"{head} in the smoke configuration on {result.device}: a check that the code runs "
                "and its gates pass, not a performance number.")
    if r.timing is not None and r.timing.remeasured:
        head += " (measured twice: the first attempt did not settle)"
    base = rung_or_none(result, r.builds_on)
    c = call(result, r)
    t = technique(r.key)
    if r.kind == "control" or (t is not None and t.control):
        out = f"{head} (windows {windows_text(r)}). It is a control, not a step of the waterfall."
    elif c.word == "start":
        role = (BASELINE if r.name == result.baseline
                else f"the floor the ladder starts from, left of its baseline {result.baseline}")
        out = f"{head} (windows {windows_text(r)}): {role}."
        if settled(r) is False:
            out += f" {unsettled_clause(r)}."
    else:
        out = f"{head}, {_comparison(c, r, base)}."
        if r.kept and above_unsettled_base(r.verdict):
            out += (f" The rungs after it build on it all the same: it settled, and its slowest "
                    f"window beats every window {c.against} showed ({rate(r.verdict['against_all'][1])} "
                    "at best).")
        if r.name == result.baseline:
            out += f" {r.name} is {BASELINE}."
    p = r.prediction
    if p is not None:
        meas = p.measured_tokens_per_s or r.tokens_per_s
        out += (f" Predicted before the launch: {rate(p.predicted_tokens_per_s)} tokens/s ({p.model}); "
                f"measured {rate(meas)}, {meas / p.predicted_tokens_per_s:.2f}x the prediction.")
    return out


def regime_phrase(reg: dict | None) -> str:
    """The regime and the numbers it was read from, as a clause."""
    reg = reg or {}
    word = reg.get("regime", "not profiled")
    busy, step = reg.get("busy"), reg.get("step_ms")
    comp, mem, frac = reg.get("compute_share") or 0.0, reg.get("memory_share") or 0.0, reg.get("fraction_of_roof")
    if word == HOST:
        return (f"host-bound: its kernels were busy {busy:.0%} of its {step:.1f} ms step and the "
                "device waited on the host for the rest")
    if word == COMPUTE:
        return (f"compute-bound: matmul and attention took {comp:.0%} of kernel time"
                + ("" if frac is None else f", at {frac:.0%} of the measured matmul roof"))
    if word == MEMORY:
        return (f"memory-bound: elementwise, normalisation, copy and optimizer kernels took {mem:.0%} "
                f"of kernel time (matmul and attention {comp:.0%})")
    if word == "device-bound" or (word == "mixed" and not (comp or mem)):
        return (f"busy on the device{'' if busy is None else f' {busy:.0%} of its step'}, with no "
                "kernel breakdown recorded to say on what")
    if word == "mixed":
        return f"mixed: matmul and attention {comp:.0%}, memory-bound kernels {mem:.0%} of kernel time"
    return "not profiled"


_MISMATCH = {HOST: "but the device already waits for the host, so cheaper kernels cannot pay",
             COMPUTE: "but the step is limited by its arithmetic, which this does not reduce",
             MEMORY: "but the step is limited by the bytes it moves, which this does not reduce"}
_AGREES = {"faster": " It did.",
           "slower": " It measured slower all the same: what it adds costs more than what it removes.",
           "within noise": " The measurement cannot tell the effect from the noise.",
           "unsettled": " The measurement did not settle, so it cannot confirm that."}
_DISAGREES = {"faster": " Yet it measured faster: the regime reading missed part of the story.",
              "slower": " The measurement agrees: it is slower.",
              "within noise": " The measurement agrees: no effect beyond the noise.",
              "unsettled": " The measurement did not settle, so it can neither confirm nor refute that."}


def _base_why(r: RungResult, base: RungResult, c: Call) -> str:
    t = technique(r.key)
    reg, word = base.regime or {}, regime_of(base)
    if word == "not profiled":
        return (f"{base.name}, which {r.name} builds on, was not profiled, so no regime reading "
                "backs or doubts this step: the measurement alone decides.")
    out = f"{base.name}, the configuration {r.name} builds on, was {regime_phrase(reg)}."
    if t is None or t.memory_trade:          # a memory trade is read against memory, below
        return out
    if word in t.attacks:
        return out + f" {r.name} {t.does}: that goes after what binds a {word} step." + _AGREES.get(c.word, "")
    if word in _MISMATCH:
        return out + f" {r.name} {t.does}, {_MISMATCH[word]}." + _DISAGREES.get(c.word, "")
    return (out + f" {r.name} {t.does}; with no single cost dominating, only the measurement can say "
            "whether that pays.")


def _memory_trade(r: RungResult, base: RungResult | None, c: Call) -> str:
    if base is None or r.memory is None or base.memory is None:
        return f"{r.name} trades time for memory; the memory it saves pays only when memory binds."
    out = (f"{r.name} trades time for memory: {gib(base.memory.bytes)} -> {gib(r.memory.bytes)} "
           f"({r.memory.kind}). That pays only when memory stops a configuration from running, "
           f"and {base.name} ran")
    return out + (f", so here it is a cost of {1 - c.ratio:.0%} of the throughput." if c.word == "slower"
                  else ".")


def control_reading(result: LadderResult, r: RungResult) -> str:
    """``r`` against the control measured at its batch (``CONTROLS``), with the diagnosis rung
    when the control wins. "" when there is no such control."""
    ctl = result.by_key(CONTROLS.get(r.key, "")) if r.key in CONTROLS else None
    if ctl is None or not (ctl.measured and r.measured):
        return ""
    noun = technique(ctl.key).noun or "control"
    c = against(r, ctl)
    pair = f"{r.name} ({rate(r.tokens_per_s)} tokens/s) against its {noun} {ctl.name} ({rate(ctl.tokens_per_s)})"
    if c.word == "slower":
        out = (f"At the same batch, {r.name} lost to its {noun} {ctl.name}: {rate(r.tokens_per_s)} "
               f"against {rate(ctl.tokens_per_s)} tokens/s, {c.ratio:.2f}x"
               + (f" ({c.shaky})" if c.shaky else ", beyond the noise of both")
               + f", so {r.name}'s precision costs time somewhere at this batch.")
        for key in DIAGNOSES.get(r.key, ()):
            d = result.by_key(key)
            if d is not None:
                out += f" {d.name} ({d.label}) tests the diagnosis: it {technique(key).does}."
                break
        return out
    if c.word == "faster":
        return f"At the same batch, {pair}: {c.ratio:.2f}x, faster beyond the noise of both, so it pays here."
    if c.word == "within noise":
        return f"At the same batch, {pair}: within the noise, so it buys nothing measurable here."
    return f"At the same batch, {pair}: unsettled ({unsettled_clause(r, ctl)}), so no comparison is credited."


def _control_why(result: LadderResult, r: RungResult) -> str:
    t = technique(r.key)
    out = f"{r.name} {t.does}." if t else f"{r.name} is a control."
    rc = r.receipt
    if rc is not None:
        seen = ", ".join(f"{k} {v}" for k, v in rc.observed.items())
        out += (f" Its receipt reads {seen}: {'as claimed' if rc.ok else 'not ' + rc.claimed}"
                + ("" if rc.ok else f", so this step did not compute in {rc.claimed}") + ".")
    for key, ctl_key in CONTROLS.items():
        if ctl_key == r.key and result.by_key(key) is not None:
            reading = control_reading(result, result.by_key(key))
            if reading:
                out += " " + reading
    return out


def why(result: LadderResult, r: RungResult) -> str:
    """Why the rung came out as it did: its base's regime against what the technique attacks,
    its memory trade, its control; for a smoke run, that none of this is read."""
    if is_smoke(result):
        return (f"A smoke run reads no regime and credits no speedup: the tiny model's numbers on "
                f"{result.device} say nothing about the speed of the full configuration.")
    if not r.measured:
        return ""
    t = technique(r.key)
    if r.kind == "control" or (t is not None and t.control):
        return _control_why(result, r)
    if t is not None and t.devices:
        p = r.prediction
        if p is None or not p.assumptions:
            return ""
        terms = ", ".join(f"{k} {v}" for k, v in p.assumptions.items())
        return f"The cost model's terms, written down before the launch: {terms}."
    base = rung_or_none(result, r.builds_on)
    c = call(result, r)
    if base is None or not base.measured:
        return ("It is where the ladder starts" + ("" if regime_of(r) == "not profiled"
                else f"; its step is {regime_phrase(r.regime)}") + ".")
    parts = [_base_why(r, base, c)]
    if t is not None and t.memory_trade:
        parts.append(_memory_trade(r, base, c))
    reading = control_reading(result, r)
    if reading:
        parts.append(reading)
    return " ".join(p for p in parts if p)


def next_move(result: LadderResult, r: RungResult, plan=None) -> str:
    """What comes next, read from the rung's own regime (or the last profiled step before it),
    and which later rung makes that move. ``plan``: the ladder's rungs in order (objects with
    ``name``, ``key``, ``label``, ``kind``, e.g. the declarations), for a ladder still running;
    default: the rungs of ``result``."""
    t = technique(r.key)
    if is_smoke(result) or not r.measured or r.kind != "rung" or (t is not None and t.devices):
        return ""
    order = [x.name for x in result.rungs]
    plan = list(result.rungs if plan is None else plan)
    names = [x.name for x in plan]
    word = regime_of(r)
    who, prefix = r, ""
    if word == "not profiled":
        earlier = [x for x in result.rungs[: order.index(r.name)] if regime_of(x) != "not profiled"]
        if not earlier:
            return f"{r.name} was not profiled, and no step before it was: its regime is not known."
        who = earlier[-1]
        word = who.regime["regime"]
        prefix = (f"{r.name} was not profiled, so its own regime is not known; the last profiled step "
                  f"before it, {who.name}, was {word}. ")
    reg = who.regime or {}
    unbroken = not (reg.get("compute_share") or reg.get("memory_share"))
    if word == "device-bound" or (word == "mixed" and unbroken):
        return prefix + f"{who.name}'s kernels were not broken down by kind: profile them to see what binds."
    move, keys = NEXT_MOVES[word]
    out = prefix + (f"The next move for a {word} step is to {move}." if prefix
                    else f"{r.name} is {word}, so the next move is to {move}.")
    after = plan[names.index(r.name) + 1:] if r.name in names else []
    later = [x for x in after if x.key in keys and x.kind == "rung"]
    if later:
        out += f" In this ladder that is {later[0].name} ({later[0].label})."
    elif keys:
        out += " No later rung of this ladder does that."
    return out


def story(result: LadderResult, name: str, plan=None) -> list[tuple[str, str]]:
    """``[(heading, sentence), ...]`` for rung ``name``: what it did, why, what comes next
    (``plan``: see ``next_move``)."""
    r = result.rung(name)
    out = [("What it did", did(result, r)), ("Why", why(result, r)),
           ("What comes next", next_move(result, r, plan))]
    return [(h, s) for h, s in out if s]


def smoke_check(r: RungResult) -> str:
    """One line for the live smoke run of a rung: it ran, its gates, receipt, compile, windows."""
    if not r.measured:
        return f"{r.name} ({r.label}) did not run here: {r.error or '; '.join(r.notes)}"
    parts = [f"{r.name} ({r.label}) ran"]
    if r.gates:
        ok = sum(g.passed for g in r.gates)
        parts.append(f"{ok} of {len(r.gates)} gate(s) passed ({', '.join(g.name for g in r.gates)})")
    if r.receipt is not None:
        seen = ", ".join(f"{k} {v}" for k, v in r.receipt.observed.items())
        verdict = "matches" if r.receipt.ok else "does not match"
        parts.append(f"receipt {seen} ({verdict} {r.receipt.claimed})")
    if r.compile is not None:
        parts.append(f"first call {r.compile.first_call_s:.1f} s")
    if r.timing is not None:
        parts.append(f"{len(r.timing.windows)} timed windows")
    return ", ".join(parts)


def learning_text(check) -> str:
    if check is None:
        return "No learning check was recorded."
    who = f"{check.configuration}'s" if check.configuration else "The fastest"
    out = (f"{who} configuration trained {check.steps} steps from a fresh "
           f"initialisation: mean training loss {check.first:.3f} over the first {check.window} steps, "
           f"{check.last:.3f} over the last {check.window}")
    if check.val_after is not None:
        out += f"; validation loss {check.val_before:.3f} -> {check.val_after:.3f}"
    return out + (". Passed: it learns." if check.passed else ". FAILED: it does not learn.")
