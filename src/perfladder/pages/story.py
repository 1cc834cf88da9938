"""The authored prose's checked claims and inserted numbers (framework-free).

A page's prose is written by its authors for the run it shows. Its numbers are never typed:
each is a *glue key* (``{glue:md}`R2_rate```) whose value this module computes from the run.
Each qualitative claim ("bf16 made the step slower", "the step waits on the host") carries a
*check* key placed right after it: a ``Check`` evaluated against the same run, which renders
as nothing when the run supports the sentence and as a visible warning with the evidence
when it does not (a build on another GPU, a future reference run). So a page can be wrong
about a run only loudly, and ``tests/pages/test_checked_prose.py`` fails the suite when the
reference run the pages show contradicts any sentence.

* ``Check(key, says, test)``: ``test(result) -> (holds, evidence)``, built from the predicates
  below (``verdict``, ``beats``, ``less``, ``regime``, ``kept``, ...);
* ``numbers(result)``: the glue values every rung and the ladder have (``R2_rate``,
  ``R2_ratio``, ``R3_memory``, ``fastest``, ``cumulative``, ...);
* ``glue_values(result, checks, extra)``: everything a page glues, as markdown strings.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from perfladder.measure.verdict import DEVICE_REGIMES, HOST, certain_gain  # noqa: F401 (HOST: named here)
from perfladder.pages.claims import against, call, ceiling, first_call_text, regime_of
from perfladder.pages.comparison import CHAPTER
from perfladder.pages.roofline_story import largest_gap, roofline_numbers, roofline_of  # noqa: F401
from perfladder.results.record import LadderResult, RungResult
from perfladder.words import gib, percent, rate, ratio
from perfladder.words import ms as words_ms

Test = Callable[[LadderResult], tuple[bool, str]]
NOT_SUPPORTED = "⚠ not supported by the run shown"
# a claim about a rung this card could not run (``CARD_OUTCOMES``): said as such, not as a
# contradiction; the sentence is about the technique, and this run has no number for it
NOT_ON_THIS_CARD = "not checked on this card"
CARD_OUTCOMES = ("does_not_fit", "not_supported", "not_applicable")


class NotOnThisCard(ValueError):
    """A claim's rung that the card could not run (it did not fit, or its precision or kernels
    are not supported here)."""
DEVICE = DEVICE_REGIMES          # the regimes a claim may name: HOST, or the device sets the pace


@dataclass(frozen=True)
class Check:
    """One qualitative claim of the prose, as a test of the run the page shows."""
    key: str
    says: str
    test: Test

    def judge(self, result: LadderResult) -> tuple[bool, str]:
        try:
            return self.test(result)
        except NotOnThisCard as e:
            return False, f"{NOT_ON_THIS_CARD}: {e}"
        except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as e:   # absent
            return False, f"cannot be judged on this run ({type(e).__name__}: {e})"

    def marker(self, result: LadderResult) -> str:
        """What the page prints after the sentence: nothing, or the warning with the evidence."""
        holds, evidence = self.judge(result)
        if holds:
            return ""
        if evidence.startswith(NOT_ON_THIS_CARD):
            return f" *[{evidence}]*"
        return f" **[{NOT_SUPPORTED}: {evidence}]**"


def _rung(result: LadderResult, name: str) -> RungResult:
    r = result.rung(name)
    if not r.measured:
        if r.outcome in CARD_OUTCOMES:       # its reason's first clause: what the card lacked
            reason = (r.error or r.outcome).split(";")[0].split(" (")[0]
            raise NotOnThisCard(f"{name} did not run here ({reason})")
        raise ValueError(f"{name} was not measured ({r.error or 'no reason recorded'})")
    return r


def _said(result: LadderResult, r: RungResult) -> str:
    c = call(result, r)
    return f"{r.name} {rate(r.tokens_per_s)} tokens/s, " + (
        f"{c.label} {c.against}, {c.word}" if c.label else c.word)


# -- predicates ---------------------------------------------------------------------------------
def verdict(name: str, *words: str) -> Test:
    """The rung's verdict against the rung it builds on is one of ``words`` (faster, slower,
    within noise, unsettled)."""
    def test(result):
        r = _rung(result, name)
        return call(result, r).word in words, _said(result, r)
    return test


def beats(a: str, b: str) -> Test:
    """``a`` is faster than ``b`` beyond the noise of both (any two measured rungs): a 'faster'
    verdict, or every window of ``a`` above every window of ``b`` (``certain_gain``)."""
    def test(result):
        ra, rb = _rung(result, a), _rung(result, b)
        c = against(ra, rb)
        return (c.word == "faster" or certain_gain(ra, rb),
                f"{a} {rate(ra.tokens_per_s)} vs {b} {rate(rb.tokens_per_s)}: {c.word}")
    return test


def pays(name: str) -> Test:
    """The rung is faster than the rung it builds on beyond the noise (``beats`` its base)."""
    def test(result):
        return beats(name, _rung(result, name).builds_on)(result)
    return test


def small_change(name: str, within: float) -> Test:
    """The rung's rate is within ``within`` (a fraction) of the rate of the rung it builds on,
    either way: "it changes little", whatever the verdict says about the noise."""
    def test(result):
        r = _rung(result, name)
        base = _rung(result, r.builds_on)
        change = r.tokens_per_s / base.tokens_per_s
        return abs(change - 1) <= within, f"{_said(result, r)} ({ratio(change)} {base.name})"
    return test


def loses_to(a: str, b: str) -> Test:
    """``a`` is slower than ``b`` (its every window below ``b``'s slowest)."""
    def test(result):
        ra, rb = _rung(result, a), _rung(result, b)
        c = against(ra, rb)
        return c.word == "slower", f"{a} {rate(ra.tokens_per_s)} vs {b} {rate(rb.tokens_per_s)}: {c.word}"
    return test


METRICS: dict[str, Callable[[RungResult], float | None]] = {
    "memory": lambda r: r.memory.bytes if r.memory else None,
    "device_ms": lambda r: r.profile.device_ms if r.profile else None,
    "host_ms": lambda r: (r.regime or {}).get("host_ms"),      # judged: verdict.step_shares
    "busy": lambda r: (r.regime or {}).get("busy"),
    "step_ms": lambda r: (r.regime or {}).get("step_ms"),
    "first_call": lambda r: r.compile.first_call_s if r.compile else None,
    "tokens_per_s": lambda r: r.tokens_per_s,
}


def _category_ms(r: RungResult, category: str) -> float | None:
    """Milliseconds per step of the rung's profiled kernels of ``category`` (matmul, elementwise,
    reduction/norm, ...)."""
    if not r.profile or r.profile.device_ms is None or category not in (r.profile.shares or {}):
        return None
    return r.profile.shares[category] * r.profile.device_ms


for _cat in ("matmul", "elementwise", "reduction/norm", "attention"):
    METRICS[f"{_cat}_ms"] = lambda r, c=_cat: _category_ms(r, c)


def _metric(result, name, metric) -> float:
    v = METRICS[metric](_rung(result, name))
    if v is None:
        raise ValueError(f"{name} recorded no {metric}")
    return v


def less(metric: str, a: str, b: str, factor: float = 1.0) -> Test:
    """``metric`` of ``a`` is below ``factor`` times that of ``b`` (memory, device_ms, host_ms,
    busy, step_ms, first_call)."""
    def test(result):
        va, vb = _metric(result, a, metric), _metric(result, b, metric)
        return va < factor * vb, f"{metric} {a} {va:.4g} vs {b} {vb:.4g}"
    return test


def more(metric: str, a: str, b: str, factor: float = 1.0) -> Test:
    def test(result):
        va, vb = _metric(result, a, metric), _metric(result, b, metric)
        return va > factor * vb, f"{metric} {a} {va:.4g} vs {b} {vb:.4g}"
    return test


def regime(name: str, *words: str) -> Test:
    """The rung's step was read as one of ``words`` (host-bound, memory-bound, ...)."""
    def test(result):
        r = _rung(result, name)
        return regime_of(r) in words, f"{name} read as {regime_of(r)}"
    return test




def settled(name: str, yes: bool = True) -> Test:
    def test(result):
        r = _rung(result, name)
        return bool(r.stable) == yes, f"{name} {'settled' if r.stable else 'did not settle'}"
    return test


def kept(name: str, yes: bool = True) -> Test:
    def test(result):
        r = result.rung(name)
        return bool(r.kept) == yes, f"{name} {'kept' if r.kept else 'not kept'}"
    return test


def measured(name: str, yes: bool = True) -> Test:
    def test(result):
        r = result.rung(name)
        return r.measured == yes, f"{name} {'measured' if r.measured else 'not measured: ' + (r.error or '')}"
    return test


def fastest_is(name: str) -> Test:
    def test(result):
        f = result.fastest_rung().name
        return f == name, f"the fastest configuration is {f}"
    return test


def learned() -> Test:
    def test(result):
        lc = result.learning
        return bool(lc and lc.passed), "no learning check" if lc is None else str(lc)
    return test


def largest_step(name: str) -> Test:
    """``name`` is the largest step of the waterfall: of the steps that certainly gain (``beats``
    their base), the largest ratio of medians to the rung each builds on."""
    def test(result):
        steps = [r for r in result.waterfall() if r.ratio_prev is not None and beats(r.name, r.builds_on)(result)[0]]
        top = max(steps, key=lambda r: r.ratio_prev)
        return top.name == name, (f"of the certain gains, the largest step is {top.name} "
                                  f"({ratio(top.ratio_prev)} {top.builds_on}, medians)")
    return test


def recorded(name: str, key: str, contains: str) -> Test:
    """The rung's recorded ``details[key]`` mentions ``contains`` (e.g. a dtype of a scatter)."""
    def test(result):
        got = _rung(result, name).details.get(key)
        return contains in str(got), f"{name} recorded {key} = {got}"
    return test


def _recipe_difference(result: LadderResult, a: str, b: str) -> list[str]:
    """The recipe fields in which measured rungs ``a`` and ``b`` differ, in ``a``'s order."""
    ra, rb = _rung(result, a).recipe, _rung(result, b).recipe
    if not ra or not rb:
        raise ValueError(f"{a if not ra else b} recorded no recipe")
    return [k for k in ra if ra.get(k) != rb.get(k)] + [k for k in rb if k not in ra]


def differs_in(a: str, b: str, *fields: str) -> Test:
    """The recipes of ``a`` and ``b`` differ in exactly ``fields`` (a control built like the rung
    it controls differs in one field; one recorded before it was, in more)."""
    def test(result):
        diff = _recipe_difference(result, a, b)
        return sorted(diff) == sorted(fields), f"{a}'s recipe differs from {b}'s in {', '.join(diff) or 'nothing'}"
    return test


def all_of(*tests: Test) -> Test:
    def test(result):
        out = [t(result) for t in tests]
        return all(h for h, _ in out), "; ".join(e for _, e in out)
    return test


# -- numbers ------------------------------------------------------------------------------------
def category_ms_of(name: str, category: str) -> Callable[[LadderResult], str]:
    """The glue value of a rung's profiled kernel time in ``category``, per step."""
    return lambda result: _ms(_metric(result, name, f"{category}_ms"))


def ratio_of(a: str, b: str) -> Callable[[LadderResult], str]:
    """The glue value ``a``'s tokens/s over ``b``'s."""
    return lambda result: ratio(_rung(result, a).tokens_per_s / _rung(result, b).tokens_per_s)


def chapter_ratios(framework: str, *pairs: tuple[str, str]) -> dict[str, Callable[[LadderResult], str]]:
    """Glue values of the chapter's own RTX 4090 ratios (``ch_R1_ratio``: its R1 over its R0),
    from its printed outputs (``perfladder.pages.comparison.CHAPTER``), whatever run is shown."""
    ch = CHAPTER[framework]
    return {f"ch_{a}_ratio": (lambda result, a=a, b=b: ratio(ch[a] / ch[b])) for a, b in pairs}


# what a recipe field is called in prose
FIELD_WORDS = {"compiled": "compile", "bf16": "bf16", "batch_size": "batch size", "dtype": "dtype",
               "checkpoint": "checkpointing", "jit": "jit", "optimizer": "optimizer", "embed": "embedding"}


def difference_of(a: str, b: str) -> Callable[[LadderResult], str]:
    """The glue value naming what ``a``'s recipe changes against ``b``'s ("compile and bf16")."""
    def words(result):
        diff = [FIELD_WORDS.get(k, k) for k in _recipe_difference(result, a, b)]
        return " and ".join([", ".join(diff[:-1]), diff[-1]] if len(diff) > 1 else diff) or "nothing"
    return words


def keep_words(name: str) -> Callable[[LadderResult], str]:
    """The glue value saying what the ladder did with rung ``name``: kept and built on when its
    gain cleared the noise, else which rung the ladder goes on from, and why."""
    def words(result):
        r = _rung(result, name)
        if r.kept:
            return (f"the gain still clears the noise of both measurements, and the ladder keeps "
                    f"{name} and builds on it")
        why = {"within noise": "that is within the noise", "slower": "it is a loss",
               "unsettled": "its windows did not settle"}.get(call(result, r).word, "it is not credited")
        return f"{why}, and the ladder goes on from {r.builds_on}"
    return words


def _ms(milliseconds: float | None) -> str:
    return words_ms(None if milliseconds is None else milliseconds / 1e3, 1)


def credited_ratio(result: LadderResult, r: RungResult, before: RungResult | None) -> str:
    """The rung against the one it builds on, as the cards credit it (``verdict.credit``): the
    ratio where one may be printed, else that none is credited (windows unsettled)."""
    if not (r.measured and before):
        return "–"
    c = call(result, r)
    if c.ratio is not None:
        return ratio(c.ratio)
    if before.name in r.built_on_earlier:           # a page's cell run again (perfladder.pages.rerun)
        return f"no ratio credited ({r.name} ran on an earlier {before.name})"
    return "no ratio credited (the windows did not settle)"


def rung_numbers(result: LadderResult, r: RungResult) -> dict[str, str]:
    """The glue values of one rung (``–`` where it recorded nothing)."""
    n, reg = r.name, r.regime or {}
    before = next((x for x in result.rungs if x.name == r.builds_on and x.measured), None)
    out = {"rate": rate(r.tokens_per_s) if r.measured else "–",
           "ratio": credited_ratio(result, r, before),
           "label": r.label, "memory": gib(r.memory.bytes) if r.memory and r.memory.bytes else "–",
           "first_call": first_call_text(r),
           "device_ms": _ms(r.profile.device_ms) if r.profile else "–",
           "host_ms": _ms((r.regime or {}).get("host_ms")),
           "step_ms": _ms(reg.get("step_ms")), "busy": percent(reg.get("busy")),
           "tflops": "–" if r.tflops is None else f"{r.tflops:.0f}", "mfu": percent(r.mfu),
           "spread": percent(r.spread) if r.timing else "–",
           "windows": (f"{rate(r.timing.low)}–{rate(r.timing.high)}" if r.timing else "–"),
           "batch": "–" if r.batch_size is None else f"{r.batch_size:,}"}
    return {f"{n}_{k}": v for k, v in out.items()}


def ladder_numbers(result: LadderResult) -> dict[str, str]:
    """Glue values of the whole ladder: device, date, the fastest configuration and the
    cumulative factor from the baseline, the ceiling, the learning check."""
    out = {"device": result.device, "date": (result.created or "")[:10] or "–",
           "framework_version": result.versions.get(result.framework, "–")}
    bars = result.waterfall()
    if bars:
        best = result.fastest_rung()
        base = next((r for r in bars if r.name == result.baseline), None)
        out.update(fastest=best.name, fastest_label=best.label, fastest_rate=rate(best.tokens_per_s),
                   fastest_mfu=percent(best.mfu), cumulative=ratio(best.tokens_per_s / base.tokens_per_s)
                   if base else "–", baseline=result.baseline)
        ceil = ceiling(result)
        out["ceiling_rate"] = rate(ceil["tokens_per_s"]) if ceil else "–"
        out["ceiling_tflops"] = f"{ceil['tflops']:.0f}" if ceil else "–"
        out["ceiling_source"] = ceil["source"] if ceil else "–"      # the run's own probe
        out["of_ceiling"] = percent(best.tokens_per_s / ceil["tokens_per_s"]) if ceil else "–"
    lc = result.learning            # a run without one still has every key: "–"
    f3 = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
    out.update(learn_steps=str(lc.steps) if lc else "–", learn_first=f3(lc and lc.first),
               learn_last=f3(lc and lc.last), val_before=f3(lc and lc.val_before),
               val_after=f3(lc and lc.val_after), val_threshold=f3(lc and lc.threshold),
               learn_config=(lc and lc.configuration) or "–")
    return out


def glue_values(result: LadderResult, checks: list[Check] = (),
                extra: dict[str, Callable[[LadderResult], str]] | None = None) -> dict[str, str]:
    """Every value a page glues for ``result``: the ladder's and every rung's numbers, the
    page's own numbers (``extra``: key -> function of the result), and each check's marker."""
    out = ladder_numbers(result)
    for r in result.rungs:
        out.update(rung_numbers(result, r))
    for key, fn in (extra or {}).items():
        try:
            out[key] = fn(result)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            out[key] = "–"
    for c in checks:
        if c.key in out:
            raise ValueError(f"check key {c.key!r} is also a number's key")
        out[c.key] = c.marker(result)
    return out
