"""What a page may claim from a ladder's numbers (framework-free).

* a reason in a few words (``short_reason``) and the model's ceiling at the measured matmul
  rate (numbers as words: ``perfladder.words``);
* ``call(result, rung)``: the verdict of ``perfladder.measure.verdict`` turned into what may be said:
  a speedup is credited by the one credit rule (``perfladder.measure.verdict.credit``: the
  verdict is 'faster', both settled); an unsettled comparison credits nothing and prints no
  ratio, not even a bound; a loss is called a loss when every window of the rung lies below
  every window of its base, even when the base's windows did not settle (the sign is sure,
  the size is flagged unsure).

The tables (``perfladder.pages.report``), the sentences (``perfladder.pages.narrative``) and the bars
(``perfladder.pages.plot``) all read a comparison through ``call``, so they cannot disagree.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from perfladder.config import LadderConfig
from perfladder.kernels.ceiling import ceiling  # noqa: F401  (the one ceiling, read from here too)
from perfladder.kernels.ceiling import model_flops_per_token as _flops_per_token
from perfladder.measure import verdict as _verdict
from perfladder.measure.timing import LEGACY_TARGET_SPREAD, did_settle
from perfladder.results.record import LadderResult, RungResult
from perfladder.words import percent, ratio


# -- words for a table cell ---------------------------------------------------------------------
def short_reason(text: str | None, limit: int = 110) -> str:
    """The first clause of an error or note, without a dangling parenthesis, at most ``limit``
    characters (for a table cell or a list)."""
    text = (text or "no reason recorded").split(";")[0].strip().rstrip(".")
    if text.count("(") > text.count(")"):
        text = text[: text.rfind("(")].rstrip(" :,")
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def is_smoke(result: LadderResult) -> bool:
    return result.config.get("name") == "smoke"


def config_of(result: LadderResult) -> LadderConfig:
    """The ``LadderConfig`` a results file was produced with (from its ``config`` dict)."""
    fields = {f.name for f in dataclasses.fields(LadderConfig)}
    return LadderConfig(**{k: v for k, v in result.config.items() if k in fields})


def model_flops_per_token(result: LadderResult) -> int:
    """``6 N + 12 L T D`` of the model the run's configuration describes."""
    return _flops_per_token(result.config)


# -- what may be said about a comparison -------------------------------------------------------
def settled(r: RungResult) -> bool | None:
    """Did ``r``'s own windows settle? (``perfladder.measure.timing.did_settle``; ``None`` when
    it has none)."""
    return did_settle(r.timing)


def target(r: RungResult) -> float:
    t = r.timing
    return t.target_spread if t is not None and t.target_spread else LEGACY_TARGET_SPREAD


def unsettled_clause(*rungs: RungResult) -> str:
    """"R1's windows did not settle: spread 10% against a 5% target" for those of ``rungs``
    that did not settle ("" when all did)."""
    bad = [r for r in rungs if settled(r) is False]
    return "; ".join(f"{r.name}'s windows did not settle: spread {percent(r.spread)} against a "
                     f"{percent(target(r))} target" for r in bad)




def compiled(r: RungResult) -> bool:
    """Does the rung's recipe compile its step (torch.compile, or a jit of either kind)?"""
    rec = r.recipe or {}
    return bool(rec.get("compiled")) or rec.get("jit") not in (None, "none")


def compile_recorded(r: RungResult) -> bool:
    """Is the rung's first call a record of its compile? Runs made before the compile was timed
    where it is paid wrote no compilation count for a compiled step: their first call came
    after the compile and says nothing about it."""
    return r.compile is not None and (r.compile.compilations is not None or not compiled(r))


def first_call_text(r: RungResult) -> str:
    """The first call as a page says it: its seconds, or that this run did not record the compile."""
    if r.compile is None:
        return "–"
    if not compile_recorded(r):
        return "not recorded in this run"
    hits = r.compile.cache_hits
    return f"{r.compile.first_call_s:.1f} s" + (
        f", {hits} of its graphs loaded from the compiler's cache" if hits else "")


def regime_of(r: RungResult) -> str:
    return (r.regime or {}).get("regime", "not profiled")


@dataclass(frozen=True)
class Call:
    """What a page may say about a rung against the rung it builds on."""
    word: str                 # faster | slower | within noise | unsettled | start | skipped | smoke
    against: str | None = None
    ratio: float | None = None        # printed only when not None
    credited: bool = False            # a speedup the page may credit
    shaky: str = ""                   # a loss called against windows that did not settle
    bound: float | None = None        # always None: the credit rule (verdict.credit) gives an
                                      # unsettled gain no bound, whatever its windows show

    @property
    def label(self) -> str:
        """Short ratio text for a bar or a table cell ("" when nothing may be printed)."""
        if self.ratio is None:
            return ""
        return ratio(self.ratio) if self.word != "within noise" else f"≈{ratio(self.ratio)}"


def call_of(v: dict | None, r: RungResult, before: RungResult | None) -> Call:
    if not r.measured:
        return Call("skipped")
    if not v or before is None:
        return Call("start")
    word, ratio = v["verdict"], v["ratio"]
    if word == "unsettled":
        lo, hi = v["range"]
        blo, _ = v["against_range"]
        if hi < blo and ratio < 1 - v.get("min_effect", _verdict.MIN_EFFECT):
            return Call("slower", v["against"], ratio, shaky=unsettled_clause(r, before))
        return Call("unsettled", v["against"])     # the credit rule: no ratio, no bound
    return Call(word, v["against"], ratio, credited=_verdict.credit(v) is not None)


def rung_or_none(result: LadderResult, name: str | None) -> RungResult | None:
    if name is None:
        return None
    try:
        return result.rung(name)
    except KeyError:
        return None


def call(result: LadderResult, r: RungResult) -> Call:
    """``r``'s verdict against its base, with the crediting rules of this module. A smoke run's
    comparisons are 'smoke': its numbers check the code, so nothing is read from them."""
    c = call_of(r.verdict, r, rung_or_none(result, r.builds_on))
    return Call("smoke", c.against) if is_smoke(result) and c.word not in ("skipped", "start") else c


def against(r: RungResult, other: RungResult) -> Call:
    """``r`` read against any other measured rung (a control), with the same rules."""
    if not (r.measured and other.measured):
        return Call("skipped")
    return call_of(_verdict.verdict(r, other), r, other)
