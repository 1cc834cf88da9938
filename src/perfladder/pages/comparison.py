"""The H200 story told against the chapter's RTX 4090 story, one checked claim at a time
(framework-free).

Each ``Claim`` is a fixed qualitative statement (what the H200 runs show and the 4090's did
not), the numbers it stands on, read from the run it is evaluated against, and ``holds``: did
that run's evidence support the statement? The pages print every claim with its numbers and,
where a run does not support it, say so beside the claim instead of asserting it. The
chapter's own numbers (``CHAPTER``) are its printed outputs, recorded once here.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

from perfladder.measure.verdict import MOSTLY_WAITING, above_unsettled_base, certain_gain
from perfladder.multigpu import costmodel
from perfladder.pages.claims import against, call, config_of, regime_of, settled
from perfladder.pages.scaling import FRAMEWORK_NAMES, fast_rows, table
from perfladder.results.record import LadderResult, RungResult
from perfladder.words import rate

# The chapter's RTX 4090 results (section 13.7's printed outputs: tokens/s, ms, efficiencies).
CHAPTER = {
    "device": "the chapter's RTX 4090 box (PCIe, no peer-to-peer)",
    "torch": {"R0": 262957, "R1": 345595, "R2": 468280, "R3": 622604, "R4": 545503},
    "jax": {"R0": 13287, "R1": 253478, "R2a": 249436, "R2": 242897, "R3c": 216489,
            "R3": 434987, "R4": 377077},
    "r5": {"torch": {"t_comm_ms": 34, "t_compute_ms": 31, "k2": 297e3, "k4": 455e3},
           "jax": {"t_comm_ms": 34, "t_compute_ms": 32, "k2": 199e3, "k4": 297e3,
                   "fast_k2_efficiency": 0.59, "fast_k4_efficiency": 0.57}},
}
NEARLY_FREE_EFFICIENCY = 0.9      # data parallelism "nearly free": at least this of linear
WIRE_SHARE = 0.01                 # ... with the priced all-reduce under this share of a step
ABOUT_HALF = 0.6                  # kernel time "about halved": at most this ratio
WITHIN_A_TENTH = 0.10             # two fastest configurations "within a tenth of each other"
CLIFF = 10                        # jit "a cliff": every jitted window this many times the floor's


@dataclass(frozen=True)
class Claim:
    """A statement, the numbers it stands on, and whether the run read supports it."""
    key: str
    statement: str
    evidence: str
    holds: bool | None             # None: the run lacks a rung the claim reads
    chapter: str = ""              # the chapter's RTX 4090 counterpart

    @property
    def verdict(self) -> str:
        return {True: "supported", False: "NOT supported", None: "cannot be checked"}[self.holds]


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _rung(res: LadderResult | None, name: str) -> RungResult | None:
    try:
        r = res.rung(name) if res is not None else None
    except KeyError:
        return None
    return r if r is not None and r.measured else None


def _missing(key: str, statement: str, res: LadderResult | None, names: str, chapter: str = "") -> Claim:
    where = "no such ladder" if res is None else f"{res.framework} on {res.device}"
    return Claim(key, statement, f"{where}: {names} not measured in this run", None, chapter)


def _step_ms(r: RungResult) -> float | None:
    return (r.regime or {}).get("step_ms")


def _busy(r: RungResult) -> float | None:
    """The share of the step the device ran kernels: the regime's (``verdict.step_shares``),
    the one number every page reads (``None`` where the profile cannot give it)."""
    return (r.regime or {}).get("busy")


def _kernel_ms(r: RungResult) -> float | None:
    return r.profile.device_ms if r.profile is not None else None


def torch_bf16_small_batch(t: LadderResult | None) -> Claim:
    """PyTorch R2 (bf16, batch 64) against R1, told as the run's evidence has it: where R2 lost,
    the host-paced story (kernels about halved, the step longer, its device mostly idle); else
    the device-paced one (the kernels' time fell and the step did not lose)."""
    host_story = ("At batch 64, bf16 made PyTorch's compiled step slower, not faster: its kernels "
                  "finished in about half the time, but the step as a whole grew, and the GPU spent "
                  "most of it waiting on the host.")
    device_story = ("At batch 64, bf16 cut the time of PyTorch's kernels and did not make the "
                    "compiled step slower: the host kept up with the device.")
    ch = CHAPTER["torch"]
    chapter = (f"On {CHAPTER['device']} the same rung paid {_x(ch['R2'] / ch['R1'])} "
               f"({rate(ch['R2'])} against {rate(ch['R1'])} tokens/s).")
    r1, r2 = _rung(t, "R1"), _rung(t, "R2")
    if r1 is None or r2 is None:
        return _missing("torch_bf16_small_batch", host_story, t, "R1 and R2", chapter)
    c = call(t, r2)
    statement = host_story if c.word == "slower" else device_story
    k1, k2, s1, s2 = _kernel_ms(r1), _kernel_ms(r2), _step_ms(r1), _step_ms(r2)
    b1, b2 = _busy(r1), _busy(r2)
    if None in (k1, k2, s1, s2, b1, b2):
        return Claim("torch_bf16_small_batch", statement, f"R2 {rate(r2.tokens_per_s)} against R1 "
                     f"{rate(r1.tokens_per_s)} ({c.word}); R1 or R2 has no profile to read", None, chapter)
    evidence = (f"R2 ran at {rate(r2.tokens_per_s)} tokens/s against R1's {rate(r1.tokens_per_s)} "
                f"({c.label or c.word}, {c.word}); kernel time per step {k1:.2f} -> {k2:.2f} ms "
                f"({_x(k2 / k1)}), the step {s1:.1f} -> {s2:.1f} ms; kernels busy "
                f"{b1:.0%} -> {b2:.0%} of it (R2 {regime_of(r2)}).")
    if c.word == "unsettled":   # the windows decide neither story
        holds = None
    elif statement is host_story:
        holds = k2 / k1 <= ABOUT_HALF and s2 > s1 and b2 < MOSTLY_WAITING
    else:       # a loss the windows cannot establish is no "did not make it slower" either
        holds = k2 < k1 and c.word in ("faster", "within noise")
    return Claim("torch_bf16_small_batch", statement, evidence, holds, chapter)


def _scatter(r: RungResult) -> tuple[list[str], float, str]:
    """(HLO element types of the embedding scatter, the largest scatter kernel's share of the
    profiled kernel time, its name)."""
    types = list(((r.details or {}).get("hlo_embedding_scatter") or {}).get("types") or [])
    rows = [row for row in (r.profile.rows if r.profile else []) if "scatter" in row.get("name", "")]
    top = max(rows, key=lambda row: row.get("device_ms", 0), default=None)
    dev = _kernel_ms(r) or 0
    share = top["device_ms"] / dev if top and dev else 0.0
    return types, share, top["name"] if top else ""


def jax_bf16_scatter(j: LadderResult | None) -> Claim:
    """JAX R3 (bf16, batch 512) against its fp32 control R3c, the scatter, and B1's fix."""
    vocab = config_of(j).gpt().vocab_size if j is not None else None
    statement = ("At batch 512, bf16 made JAX's step slower than fp32 at the same batch. The "
                 f"culprit is one kernel: the embedding gradient, a scatter-add of every token's "
                 f"row into the {vocab}-row table, which XLA runs in bf16 and which then takes "
                 "most of the step's kernel time; computing that gradient in fp32 recovers the loss and more.")
    ch = CHAPTER["jax"]
    chapter = (f"On {CHAPTER['device']} bf16 at batch 512 beat the fp32 control "
               f"{_x(ch['R3'] / ch['R3c'])} ({rate(ch['R3'])} against {rate(ch['R3c'])} tokens/s).")
    r3, r3c, b1 = _rung(j, "R3"), _rung(j, "R3c"), _rung(j, "B1")
    if r3 is None or r3c is None or b1 is None:
        return _missing("jax_bf16_scatter", statement, j, "R3, R3c and B1", chapter)
    c, fix = against(r3, r3c), call(j, b1)
    t3, share, name = _scatter(r3)
    tc, _, _ = _scatter(r3c)
    t1, _, _ = _scatter(b1)
    tokens = r3.batch_size * r3.seq_len if r3.batch_size and r3.seq_len else None
    evidence = (f"R3 (bf16) ran at {rate(r3.tokens_per_s)} tokens/s against R3c (fp32) "
                f"{rate(r3c.tokens_per_s)} ({c.label or c.word}, {c.word}); the scatter of "
                f"{tokens:,} token rows is {'/'.join(t3) or 'unrecorded'} in R3's program and "
                f"{'/'.join(tc) or 'unrecorded'} in R3c's; in R3's profile one kernel ({name or 'none'}) "
                f"takes {share:.0%} of the kernel time. B1 (fp32 embedding gradient: "
                f"{'/'.join(t1) or 'unrecorded'}) ran at {rate(b1.tokens_per_s)} "
                f"({fix.label or fix.word} R3, {fix.word}).")
    holds = (c.word == "slower" and "bf16" in t3 and tc and "bf16" not in tc and share >= 0.5
             and t1 and "bf16" not in t1 and b1.tokens_per_s > r3c.tokens_per_s
             # a recovery is a sign, not a credited ratio: 'faster', or every B1 window above
             # every window R3 ever showed when R3 did not settle (verdict.above_unsettled_base)
             and (fix.word == "faster" or above_unsettled_base(b1.verdict)))
    return Claim("jax_bf16_scatter", statement, evidence, bool(holds), chapter)


def jax_jit_cliff(j: LadderResult | None) -> Claim:
    """JAX R1 against the un-jitted R0: every jitted window far above every un-jitted one."""
    statement = ("jit is JAX's cliff: the un-jitted step is a floor to read the rest against, not "
                 "a baseline, which is why the JAX ladder's ratios start at R1.")
    ch = CHAPTER["jax"]
    chapter = f"On {CHAPTER['device']} jit paid {ch['R1'] / ch['R0']:.0f}x over the un-jitted step."
    r0, r1 = _rung(j, "R0"), _rung(j, "R1")
    if r0 is None or r1 is None:
        return _missing("jax_jit_cliff", statement, j, "R0 and R1", chapter)
    bound = min(r1.windows or [r1.tokens_per_s]) / max(r0.windows or [r0.tokens_per_s])
    note = "" if settled(r1) is not False else " (R1's windows did not settle, so no ratio is credited)"
    evidence = (f"R0 (un-jitted) ran at {rate(r0.tokens_per_s)} tokens/s, R1 (jit) at "
                f"{rate(r1.tokens_per_s)}: R1's slowest window is {bound:.0f}x R0's fastest{note}; "
                f"the ladder's baseline is {j.baseline}.")
    return Claim("jax_jit_cliff", statement, evidence, bound >= CLIFF and j.baseline == "R1", chapter)


def torch_batch_biggest(t: LadderResult | None) -> Claim:
    """Of PyTorch's chapter rungs the batch rung is the biggest step (the largest ratio of medians
    among the gains every window establishes, ``verdict.certain_gain``, credited or not), and
    bf16 before it (at batch 64) loses where the host sets the pace, or does not where it does
    not: the statement the run's R2 supports."""
    lead = "On the H200 PyTorch's ladder is not three modest steps multiplying: the batch rung is its biggest single step"
    host_story = lead + ", and bf16 without it loses."
    device_story = lead + "; bf16 before it, at batch 64, does not lose here."
    ch = CHAPTER["torch"]
    chapter = (f"On {CHAPTER['device']} compile, bf16 and the batch paid "
               f"{_x(ch['R1'] / ch['R0'])}, {_x(ch['R2'] / ch['R1'])} and {_x(ch['R3'] / ch['R2'])}.")
    rungs = [r for r in (_rung(t, n) for n in ("R1", "R2", "R3")) if r is not None]
    if len(rungs) < 3:
        return _missing("torch_batch_biggest", host_story, t, "R1, R2 and R3", chapter)
    calls = {r.name: call(t, r) for r in rungs}
    small = [r for r in rungs if r.name in ("R1", "R2")]
    evidence = ("; ".join(f"{r.name} {r.label}: {calls[r.name].label or '-'} {calls[r.name].against} "
                          f"({calls[r.name].word})" for r in rungs)
                + "; at batch 64 " + " and ".join(f"{r.name} is {regime_of(r)}" for r in small) + ".")
    gains = {r.name: r.ratio_prev for r in rungs if r.ratio_prev is not None
             and (calls[r.name].word == "faster" or certain_gain(r, t.rung(r.builds_on)))}
    biggest = "R3" in gains and all(gains["R3"] >= x for n, x in gains.items() if n != "R3")
    loses = calls["R2"].word == "slower"
    statement = host_story if loses else device_story
    holds = None if calls["R2"].word == "unsettled" else biggest     # unsettled: neither story
    return Claim("torch_batch_biggest", statement, evidence, holds, chapter)


def fastest_pair(t: LadderResult | None, j: LadderResult | None) -> Claim:
    """The two frameworks' fastest configurations (``LadderResult.fastest_rung``, the one meaning
    every page gives the words), within a tenth of each other."""
    statement = ("The two frameworks end close together: their fastest configurations are "
                 "within a tenth of each other, each reached by a different path.")
    if t is None or j is None or not t.waterfall() or not j.waterfall():
        return _missing("fastest_pair", statement, t if j is not None else j, "both ladders")
    bt, bj = t.fastest_rung(), j.fastest_rung()
    c = against(bj, bt)
    unsettled = lambda r: "" if settled(r) is not False else " (its windows did not settle)"  # noqa: E731
    evidence = (f"PyTorch's fastest configuration is {bt.name} {bt.label}, {rate(bt.tokens_per_s)} "
                f"tokens/s{unsettled(bt)}; JAX's is {bj.name} {bj.label}, "
                f"{rate(bj.tokens_per_s)}{unsettled(bj)} "
                f"({_x(bj.tokens_per_s / bt.tokens_per_s)} PyTorch's, {c.word}).")
    paths = [[r.key for r in res.waterfall() if call(res, r).credited] for res in (t, j)]
    evidence += (f" Credited on the way: PyTorch {', '.join(paths[0]) or 'nothing'}; "
                 f"JAX {', '.join(paths[1]) or 'nothing'}.")
    holds = abs(bj.tokens_per_s / bt.tokens_per_s - 1) <= WITHIN_A_TENTH and paths[0] != paths[1]
    return Claim("fastest_pair", statement, evidence, holds)


# -- data parallelism ---------------------------------------------------------------------------
def data_parallel_nearly_free(r5: dict | None) -> Claim:
    """NVLink data parallelism: the priced wire time a sliver of the step, >= 90% of linear."""
    statement = ("On two H200s joined by NVLink, data parallelism is nearly free: the gradient "
                 "all-reduce the cost model prices is a sliver of the step, and the run's fast recipe "
                 "scaled close to linearly in both frameworks. What it does lose is not wire time: "
                 "every measurement lands below the no-overlap prediction.")
    ch = CHAPTER["r5"]
    chapter = (f"On {CHAPTER['device']} the all-reduce took about {ch['torch']['t_comm_ms']} ms "
               f"against a {ch['torch']['t_compute_ms']} ms step; two GPUs gave "
               f"{_x(ch['torch']['k2'] / CHAPTER['torch']['R0'])} one GPU's throughput in PyTorch "
               f"and {_x(ch['jax']['k2'] / CHAPTER['jax']['R1'])} in JAX.")
    rows = fast_rows(r5 or {})
    if not rows:
        return Claim("data_parallel", statement, "no committed two-GPU measurement of the fastest "
                     "recipe to read", None, chapter)
    parts, holds = [], True
    for m in rows:
        p = m["prediction"]
        share = p["t_comm_s"] / p["t_compute_s"]
        eff = m.get("efficiency_vs_linear")
        below = m["measured_tokens_per_s"] / m["predicted_tokens_per_s"]
        parts.append(f"{FRAMEWORK_NAMES[m['framework']]} {m['mechanism']} at k = {m['k']}: all-reduce "
                     f"priced at {1e3 * p['t_comm_s']:.2f} ms against a {1e3 * p['t_compute_s']:.1f} ms "
                     f"step ({_pct(share)}), measured {rate(m['measured_tokens_per_s'])} tokens/s, "
                     f"{'no efficiency (baseline unsettled)' if eff is None else _pct(eff) + ' of linear'}, "
                     f"{_pct(below)} of the prediction")
        holds = (holds and share < WIRE_SHARE and eff is not None and eff >= NEARLY_FREE_EFFICIENCY
                 and m["k"] == 2 and "H200" in (m.get("device") or "") and costmodel.is_nvlink(p["link"]))
    every = [m for m in (r5 or {}).get("measurements", []) if m.get("status") == "measured"
             and m.get("predicted_tokens_per_s")]
    under = [m for m in every if m["measured_tokens_per_s"] < m["predicted_tokens_per_s"]]
    evidence = (f"{'; '.join(parts)}. Of all {len(every)} measurements with a prediction (both forms, "
                f"every mechanism), {len(under)} land below it.")
    holds = holds and {m["framework"] for m in rows} == set(FRAMEWORK_NAMES) and len(under) == len(every)
    return Claim("data_parallel", statement, evidence, holds, chapter)


# -- rendering ----------------------------------------------------------------------------------
def claim_html(c: Claim, where: str = "") -> str:
    """The statement, its numbers, the chapter's counterpart; a warning box when the run read
    does not support it (or lacks what it needs)."""
    out = (f'<div class="perfladder-claim" data-claim="{c.key}" data-holds="{c.holds}">'
           f"<p><strong>{html.escape(c.statement)}</strong></p>"
           f'<p class="perfladder-evidence">{html.escape((where + ": ") if where else "")}'
           f"{html.escape(c.evidence)}</p>")
    if c.chapter:
        out += f'<p class="perfladder-chapter">{html.escape(c.chapter)}</p>'
    if c.holds is not True:
        title = "Not so in this run" if c.holds is False else "Not checked in this run"
        out += (f'<div class="admonition warning"><p class="admonition-title">{title}</p>'
                f"<p>{html.escape(where or 'the run shown')} does not support the statement above "
                f"as measured: {html.escape(c.evidence)}</p></div>")
    return out + "</div>"


def story(t: LadderResult | None, j: LadderResult | None, r5: dict | None) -> list[Claim]:
    """The H200 story, in the order the comparison page tells it."""
    return [torch_batch_biggest(t), torch_bf16_small_batch(t), jax_jit_cliff(j),
            jax_bf16_scatter(j), fastest_pair(t, j), data_parallel_nearly_free(r5)]


def chapter_table_html(t: LadderResult | None, j: LadderResult | None) -> str:
    """The chapter's rungs on its RTX 4090 beside the same rungs of the H200 runs: tokens/s,
    and each rung's ratio to the rung it builds on (the H200's only where its verdict allows)."""
    def ours(res, name):
        r = _rung(res, name)
        if r is None:
            return "-", None
        c = call(res, r)
        ratio = f" · {c.label} {c.against}" if c.label and r.kind != "control" else ""
        word = "control" if r.kind == "control" else c.word
        if word == "start":
            word = "baseline" if r.name == res.baseline else "floor"
        return f"{rate(r.tokens_per_s)}{ratio} · {word}", r

    def theirs(fw, name, r):
        got = CHAPTER[fw].get(name)
        if got is None:
            return "-"
        base = r.builds_on if r is not None else None
        ratio = (f" · {_x(got / CHAPTER[fw][base])} {base}"
                 if base in CHAPTER[fw] and (r is None or r.kind != "control") else "")
        return rate(got) + ratio
    rows = []
    for name in ("R0", "R1", "R2a", "R2", "R3c", "R3", "R4"):
        (tc, tr), (jc, jr) = ours(t, name), ours(j, name)
        if tr is None and jr is None:
            continue
        label = (jr or tr).label if name in ("R2a", "R3c") else (tr or jr).label
        rows.append([html.escape(f"{name} {label}"), html.escape(theirs("torch", name, tr)), html.escape(tc),
                     html.escape(theirs("jax", name, jr)), html.escape(jc)])
    return table(["rung", "PyTorch, RTX 4090", "PyTorch, H200", "JAX, RTX 4090", "JAX, H200"], rows)


def _credited(res: LadderResult) -> list[tuple[RungResult, float]]:
    """Every credited step (``verdict.credit``): the rung and its credited ratio."""
    return [(r, c.ratio) for r in res.waterfall() for c in [call(res, r)] if c.credited]


def span(top: RungResult, base: RungResult) -> str:
    """``top`` against ``base`` as may be said: the ratio when both settled, else that no
    ratio is credited (the credit rule: no bound either)."""
    if settled(top) is not False and settled(base) is not False:
        return _x(top.tokens_per_s / base.tokens_per_s)
    unsettled = " and ".join(r.name for r in (base, top) if settled(r) is False)
    return f"no ratio credited, {unsettled}'s windows did not settle"


def waterfall_reading(t: LadderResult | None, j: LadderResult | None) -> list[str]:
    """The two waterfalls read side by side, and against the chapter's: computed sentences."""
    out = []
    for res, start in ((t, "R0"), (j, "R1")):
        if res is None or not res.waterfall():
            continue
        name = FRAMEWORK_NAMES[res.framework]
        base, best = _rung(res, start) or res.waterfall()[0], res.fastest_rung()
        steps = _credited(res)
        top = max(steps, key=lambda rc: rc[1], default=None)
        beyond = [(r, x) for r, x in steps if r.stage == "beyond"]
        gain = 1.0
        for _, x in beyond:
            gain *= x
        text = (f"{name} climbs from {base.name} {base.label} at {rate(base.tokens_per_s)} tokens/s to "
                f"{best.name} {best.label} at {rate(best.tokens_per_s)} ({span(best, base)}), through "
                f"{len(steps)} credited step{'s' if len(steps) != 1 else ''}")
        if top is not None:
            text += (f"; the largest is {top[0].name} {top[0].label}, "
                     f"{_x(top[1])} {call(res, top[0]).against}")
        if beyond:
            text += (f"; the {len(beyond)} credited rung{'s' if len(beyond) != 1 else ''} beyond the "
                     f"chapter ({', '.join(r.name for r, _ in beyond)}) multiply to {_x(gain)}")
        out.append(text + ".")
        ch, r3 = CHAPTER[res.framework], _rung(res, "R3")
        if start in ch and "R3" in ch:
            out.append(f"The chapter's {name} ladder on its RTX 4090 went from {start} at "
                       f"{rate(ch[start])} to R3 at {rate(ch['R3'])} ({_x(ch['R3'] / ch[start])}); on the "
                       f"{res.device}, {start} to R3 is " + (f"{span(r3, base)}." if r3 else "not measured."))
    return out
