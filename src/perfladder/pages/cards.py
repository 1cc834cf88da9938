"""What a page shows of one rung, and the kernel breakdown, as HTML and as text (framework-free).

A rung is shown as one line of result (``result_line``: tokens/s, its verdict against the rung
it builds on), visible, over a folded compact table of its evidence (``compact_rows``: the windows that count,
the gates summarised, the receipt, compile, memory, the profile's largest shares, where the
rung's own time went), with everything it recorded behind a toggle (``card_rows``, slot by
slot: ``perfladder.measure.evidence``). Kernel names are shortened to what they are; the full
name is in the hover text and in the JSON. Version-1 files kept the profiler's table as text;
its rows are read back from it.
"""
from __future__ import annotations

import re

from perfladder.pages import rerun
from perfladder.pages.claims import (
    call,
    compile_recorded,
    first_call_text,
    is_smoke,
    regime_of,
    settled,
    short_reason,
    target,
    unsettled_clause,
)
from perfladder.pages.multigpu import shown_prediction
from perfladder.pages.report import MUTED, esc, table_html
from perfladder.results.record import LadderResult, RungResult
from perfladder.words import gib, rate, tflops

PROFILE_ROWS = 8
_SKIP_DETAILS = {"profile_table", "traceback", "kernels_recipe"}
_UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float | None:
    m = re.fullmatch(r"([\d.]+)\s*(us|ms|s)", text.strip())
    return None if m is None else float(m.group(1)) * _UNIT_MS[m.group(2)]


def profile_rows(r: RungResult, limit: int = PROFILE_ROWS) -> list[dict]:
    """The profile's top operators per step, device time first: ``{'name', 'device_ms',
    'host_ms', 'calls'}``. Read from ``profile.rows``, or from a version-1 profiler table."""
    p = r.profile
    rows = list(p.rows) if p is not None and p.rows else []
    table = r.details.get("profile_table")
    if not rows and isinstance(table, str):
        steps = p.steps if p is not None and p.steps else 1
        lines = table.splitlines()
        head = next((re.split(r"\s{2,}", ln.strip()) for ln in lines if ln.strip().startswith("Name")), None)
        for ln in lines:
            cols = re.split(r"\s{2,}", ln.strip())
            if head is None or len(cols) != len(head) or cols[0] == "Name":
                continue
            row = dict(zip(head, cols))
            dev = _ms(row.get("Self CUDA", row.get("Self XPU", "")) or "")
            host = _ms(row.get("Self CPU", ""))
            calls = row.get("# of Calls", "")
            rows.append({"name": row["Name"], "device_ms": None if dev is None else dev / steps,
                         "host_ms": None if host is None else host / steps,
                         "calls": int(calls) / steps if calls.isdigit() else None})
    def device_first(x):
        return x.get("device_ms") is None, -(x.get("device_ms") or 0), -(x.get("host_ms") or 0)
    return sorted(rows, key=device_first)[:limit]


def short_name(name: str, limit: int = 56) -> str:
    """A kernel's name as a reader reads it: C++ return types, template arguments and parameter
    lists dropped, the rest cut to ``limit`` characters."""
    s = re.sub(r"^void\s+", "", name.strip())
    s = re.sub(r"\(.*\)$", "", s)                           # parameter list
    while "<" in s and ">" in s:
        t = re.sub(r"<[^<>]*>", "", s)                       # innermost template arguments
        if t == s:
            break
        s = t
    s = re.sub(r"\s+", " ", s).strip() or name
    return s if len(s) <= limit else s[: limit - 1] + "…"


def code_html(name: str) -> str:
    """A kernel or operator name, shortened; the full name is the hover text."""
    return (f'<code title="{esc(name)}" style="overflow-wrap: anywhere;">'
            f'{esc(short_name(name))}</code>')


def _num(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"


def _flat(d: dict, depth: int = 0) -> str:
    """A compact one-line rendering of a small dict."""
    parts = []
    for k, v in d.items():
        if isinstance(v, dict) and depth < 1:
            parts.append(f"{k}: {{{_flat(v, depth + 1)}}}")
        elif isinstance(v, (list, tuple)):
            parts.append(f"{k}: [{', '.join(_num(x) for x in v[:6])}{', …' if len(v) > 6 else ''}]")
        elif not isinstance(v, dict):
            parts.append(f"{k} {_num(v)}")
    return ", ".join(parts)


def card_rows(result: LadderResult, r: RungResult, error: bool = True) -> list[tuple[str, str]]:
    """``[(slot, text)]`` of everything ``r`` recorded (what the card shows; ``error``: include
    a skipped rung's error, which its sentences otherwise already say)."""
    out: list[tuple[str, str]] = []
    if not r.measured and error:
        out.append(("error", r.error or "; ".join(r.notes) or "not measured"))
    t = r.timing
    if t is not None:
        ok = settled(r)
        out.append(("timing", f"windows {', '.join(rate(w) for w in t.windows)} tokens/s; median of the last "
                    f"{t.settled}; spread {t.spread:.1%} against a {target(r):.0%} target"
                    f" ({'settled' if ok else 'did not settle'})"
                    + (f"; {t.steps_per_window} steps per window"
                       + (f" (windows held to {t.window_s:g} s)" if t.window_s else "")
                       + f" after {t.warmup} warm-up steps" if t.steps_per_window > 1 else "")
                    + ("; measured twice" if t.remeasured else "")))
    if r.verdict:
        v = r.verdict
        out.append(("verdict", f"{v['verdict']} against {v['against']}: ratio {v['ratio']:.3f}, windows "
                    f"{rate(v['range'][0])}–{rate(v['range'][1])} vs {rate(v['against_range'][0])}–"
                    f"{rate(v['against_range'][1])} ({v['why']})"))
    if r.measured:
        reg = r.regime or {}
        nums = {k: reg[k] for k in ("step_ms", "device_ms", "host_ms", "busy", "compute_share",
                                    "memory_share", "fraction_of_roof") if reg.get(k) is not None}
        out.append(("regime", f"{regime_of(r)}: {reg.get('why', '')}" + (f" ({_flat(nums)})" if nums else "")))
        out += [("accounting", flag) for flag in reg.get("accounting") or []]
    for g in r.gates:
        vals = _gate_values(g)
        extra = ", ".join(f"{k} {_num(v)}" for k, v in g.tolerances.items() if k not in g.values)
        out.append(("gate", f"{g.name}: {'passed' if g.passed else 'FAILED'}"
                    + (f"; {vals}" if vals else "") + (f"; tolerances {extra}" if extra else "")
                    + (f"; against {g.reference}" if g.reference else "")))
    if r.receipt is not None:
        rc = r.receipt
        seen = ", ".join(f"{k} {v}" for k, v in rc.observed.items())
        out.append(("receipt", f"claimed {rc.claimed}; observed {seen} "
                    f"({'matches' if rc.ok else 'does NOT match'}); read in {rc.where}"))
    if r.memory is not None and r.memory.bytes is not None:
        note = f" ({r.memory.note})" if r.memory.note else ""
        out.append(("memory", f"{gib(r.memory.bytes)} {r.memory.kind}{note}"))
    if r.compile is not None:
        out.append(("compile", f"first call {r.compile.first_call_s:.1f} s"
                    + ("" if r.compile.compilations is None else f", {r.compile.compilations} compilation(s)")
                    + ("" if not r.compile.cache_hits
                       else f", {r.compile.cache_hits} graph(s) loaded from the compiler's cache")
                    + ("" if compile_recorded(r) else "; the compile ran before it and was not recorded")))
    if r.tflops is not None:
        out.append(("rate", f"{tflops(r.tflops)} model TFLOP/s"
                    + ("" if r.mfu is None else f", {r.mfu:.1%} MFU against the datasheet peak")))
    p = r.prediction
    shown = shown_prediction(result.framework, r) if p is not None else None
    if shown is not None and shown["source"].startswith("the committed"):
        # the one prediction the page shows for this rung: the committed measurement's
        out.append(("prediction", f"{p.model}: predicted {rate(shown['predicted'])} tokens/s at k = "
                    f"{shown['k']} from {rate(shown['single'])} tokens/s on one GPU, by "
                    f"{shown['source']}; measured {rate(shown['measured'])}"))
    elif p is not None:
        line = f"{p.model}: predicted {rate(p.predicted_tokens_per_s)} tokens/s"
        if p.measured_tokens_per_s is not None:
            line += f", measured {rate(p.measured_tokens_per_s)}"
        if p.assumptions:
            line += f"; assumptions: {_flat(p.assumptions)}"
        line += "".join(f"; {_flat(pt)}" for pt in p.points)
        out.append(("prediction", line))
    if r.profile is not None:
        pr = r.profile
        by_share = sorted(pr.shares.items(), key=lambda kv: -kv[1])
        shares = ", ".join(f"{k} {v:.0%}" for k, v in by_share if v >= 0.005)
        ms = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        out.append(("profile", f"{pr.tool}, {pr.steps} steps: device {ms(pr.device_ms)} ms/step, host "
                    f"{ms(pr.host_ms)} ms/step" + (f"; {shares}" if shares else "")))
    details = {k: v for k, v in r.details.items() if k not in _SKIP_DETAILS}
    if details:
        out.append(("details", _flat(details)))
    if r.recipe:
        out.append(("recipe", _flat(r.recipe)))
    out += [("note", n) for n in r.notes if n != r.error]
    return out


def result_line(result: LadderResult, r: RungResult) -> str:
    """One line: the rung, its rate, and what may be said of it against the rung it builds on."""
    head = f"{r.name} {r.label}: "
    if not r.measured:
        return (head + "not measured (" + short_reason(r.error or "; ".join(r.notes), 140) + ")"
                + rerun.line_note(r))
    c = call(result, r)
    what = {"start": "the ladder's first measurement" if r.name != result.baseline else "the baseline",
            "smoke": "a smoke check, not a performance number",
            "skipped": "not measured"}.get(c.word)
    if what is None:
        what = (f"{c.label} {c.against}, " if c.label else "") + c.word
    if c.word == "unsettled":
        base = _base(result, r)
        clause = unsettled_clause(*(x for x in (r, base) if x is not None))
        what = f"no verdict on time against {c.against}" + (f" ({clause})" if clause else "")
    if r.kind == "control":
        what = "a control, not a step of the waterfall"
    what += _memory_verdict(result, r)
    if is_smoke(result):
        what = "a smoke check, not a performance number"
    return head + f"{rate(r.tokens_per_s)} tokens/s, {what}" + rerun.line_note(r)


def _base(result: LadderResult, r: RungResult) -> RungResult | None:
    try:
        return result.rung(r.builds_on) if r.builds_on else None
    except KeyError:
        return None


MEMORY_RUNGS = ("checkpoint",)   # techniques whose point is memory: their line says what it bought


def _memory_verdict(result: LadderResult, r: RungResult) -> str:
    """For a technique that trades time for memory, its memory against its base's, measured the
    same way (a plan or a peak: exact, so no noise rule applies): '; memory 2.25 GiB against
    R3's 10.0 GiB (planned temporaries), 0.22x'."""
    base = _base(result, r)
    if r.key not in MEMORY_RUNGS or base is None or r.memory is None or base.memory is None:
        return ""
    a, b = r.memory.bytes, base.memory.bytes
    if not a or not b or r.memory.kind != base.memory.kind:
        return ""
    return f"; memory {gib(a)} against {base.name}'s {gib(b)} ({r.memory.kind}), {a / b:.2f}x"


def _gates_summary(r: RungResult) -> str:
    if not r.gates:
        return "none"
    bad = [g.name for g in r.gates if not g.passed]
    return (f"{len(r.gates) - len(bad)} of {len(r.gates)} passed: " + "; ".join(
        f"{g.name}" + (f" ({_gate_values(g)})" if _gate_values(g) else "") for g in r.gates))


def compact_rows(result: LadderResult, r: RungResult) -> list[tuple[str, str]]:
    """The few rows a reader reads first (the full record is behind the toggle)."""
    out: list[tuple[str, str]] = rerun.card_rows(r)
    t = r.timing
    if t is not None:
        n = len(t.windows)
        out.append(("windows", f"{rate(t.low)}–{rate(t.high)} tokens/s over the last {t.settled} of {n} "
                    f"(the median of those is the rate); spread {t.spread:.1%} against {target(r):.0%}, "
                    + ("settled" if settled(r) else "did NOT settle: nothing is credited")
                    + (f"; {n - t.settled} earlier window(s) while it settled" if n > t.settled else "")))
    if r.gates:
        out.append(("gates", _gates_summary(r)))
    if r.receipt is not None:
        rc = r.receipt
        seen = ", ".join(f"{k} {v}" for k, v in rc.observed.items())
        out.append(("receipt", f"{seen}: " + ("as claimed (" + rc.claimed + ")" if rc.ok
                                             else f"NOT {rc.claimed}")))
    if r.compile is not None:
        c = r.compile
        out.append(("first call", first_call_text(r) + (
            "" if not c.compilations else f" ({c.compilations} compilation(s); paid once, outside the timing)")))
    if r.memory is not None and r.memory.bytes is not None:
        out.append(("memory", f"{gib(r.memory.bytes)} ({r.memory.kind})"))
    if r.profile is not None and r.profile.device_ms:
        p, reg = r.profile, r.regime or {}
        top = sorted(p.shares.items(), key=lambda kv: -kv[1])[:3]
        out.append(("profile", f"{p.device_ms:.2f} ms of kernels per step"
                    + ("" if reg.get("busy") is None else f", busy {reg['busy']:.0%} of the "
                       f"{reg['step_ms']:.1f} ms step") + ("" if reg.get("host_ms") is None else
                                                         f"; host {reg['host_ms']:.1f} ms to issue a step")
                    + ("; " + ", ".join(f"{k} {v:.0%}" for k, v in top) if top else "")
                    + f"; read as {regime_of(r)}"))
        out += [("accounting", flag) for flag in reg.get("accounting") or []]
    if r.tflops is not None:
        out.append(("rate", f"{tflops(r.tflops)} model TFLOP/s"
                    + ("" if r.mfu is None else f", {r.mfu:.1%} MFU")))
    secs = {k: v for k, v in r.details.get("seconds", {}).items() if k != "total"}
    if secs:
        total = rung_seconds(r)
        parts = ", ".join(f"{k} {v:.0f} s" for k, v in secs.items() if v >= 0.5)
        out.append(("its time", f"{total:.0f} s: {parts}" if parts else f"{total:.1f} s"))
    return out


def rung_seconds(r: RungResult) -> float:
    """A rung's own wall seconds: its recorded total, else the sum of its phases (0 if none;
    ``gates/model`` and the like are parts of ``gates``, not counted twice)."""
    secs = r.details.get("seconds") or {}
    return secs.get("total", sum(v for k, v in secs.items() if "/" not in k))


def time_spent(result: LadderResult) -> str:
    """Where the ladder's own wall time went, in one line: the compile ahead of the first rung
    (where one ran; named but not counted when the book build's stage ran it), every rung's
    total (the three costliest named), the kernel report's and the learning check's. Rungs from a file written before rungs recorded their phases are left
    out, and the line says how many."""
    totals = {r.name: rung_seconds(r) for r in result.rungs if r.details.get("seconds")}
    untimed = len(result.rungs) - len(totals)
    kb = next((r.kernels.get("seconds") for r in result.rungs if r.kernels), None)
    learn = getattr(result.learning, "seconds", None)
    parts = [f"{len(totals)} rungs {sum(totals.values()):.0f} s"]
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:3]
    if top:
        parts[0] += " (costliest: " + ", ".join(f"{n} {s:.0f} s" for n, s in top) + ")"
    report = result.ahead or {}
    ahead = report.get("seconds")
    if ahead is not None and report.get("by"):                    # the book build's stage
        parts.insert(0, f"compiled ahead {ahead:.0f} s by the book build, before the notebooks and "
                        "beside the other framework (not counted here)")
        ahead = None
    elif ahead is not None:
        parts.insert(0, f"compiled ahead {ahead:.0f} s")
    if kb is not None:
        parts.append(f"kernel report {kb:.0f} s")
    if learn is not None:
        phases = getattr(result.learning, "phases", None) or {}
        big = [f"{k} {v:.0f} s" for k, v in sorted(phases.items(), key=lambda kv: -kv[1]) if v >= 0.5]
        parts.append(f"learning check {learn:.0f} s" + (f" ({', '.join(big)})" if big else ""))
    total = sum(totals.values()) + (kb or 0.0) + (learn or 0.0) + (ahead or 0.0)
    return (f"this ladder's own time: {total:.0f} s: " + "; ".join(parts)
            + (f"; {untimed} rung(s) without recorded phases" if untimed else ""))


def rung_html(result: LadderResult, name: str, label: str = "") -> str:
    """The rung as a page shows it: the result line, visible; the compact table and all the
    evidence folded under it (a reader opens them; the story reads past them), the profile's
    top kernels with their names shortened."""
    r = result.rung(name)
    rows = [[f'<span style="color: {MUTED};">{esc(k)}</span>', esc(v)] for k, v in compact_rows(result, r)]
    full = [[f'<span style="color: {MUTED};">{esc(k)}</span>', esc(v)] for k, v in card_rows(result, r)]
    prof = profile_rows(r)
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    prof_table = table_html(["ms/step", "calls", "kernel"],
                            [[fmt(x.get("device_ms"), ".3f"), fmt(x.get("calls"), "g"), code_html(x["name"])]
                             for x in prof], numeric={0, 1}) if prof else ""
    return ('<div class="perfladder-card">'
            + f'<p class="perfladder-result"><strong>{esc(result_line(result, r))}</strong></p>'
            + '<details class="perfladder-fold"><summary>its evidence</summary>'
            + (f'<p class="perfladder-source">{esc(label)}</p>' if label else "")
            + (table_html(["", ""], rows, cls="perfladder-table perfladder-compact") if rows else "")
            + '<details><summary>everything this rung recorded</summary>'
            + table_html(["evidence", "value"], full) + prof_table + "</details></details></div>")


def rung_text(result: LadderResult, name: str, label: str = "") -> str:
    r = result.rung(name)
    lines = ([label] if label else []) + [result_line(result, r)]
    lines += [f"  {k:<10} {v}" for k, v in compact_rows(result, r)]
    return "\n".join(lines)


# -- the kernel breakdown ------------------------------------------------------------------------
GATE_LISTED = 6     # a gate with more values than this (one per parameter gradient) is summarised


GROUP_WORDS = {"grad": "parameter gradients", "update": "parameter updates", "scale": "gradient scales"}


def _gate_values(g) -> str:
    """A gate's measured values against their tolerances. Per-parameter values (``grad/...``,
    ``update/...``: every parameter's gradient or AdamW update) are summarised per kind as
    how many, how many over tolerance, and the one closest to its limit, so the card stays
    readable; the file keeps them all."""
    def one(k, v):
        return f"{k} {_num(v)}" + (f" (tolerance {_num(g.tolerances[k])})" if k in g.tolerances else "")
    items = list(g.values.items())
    groups: dict[str, list] = {}
    for k, v in items:
        if "/" in k:
            groups.setdefault(k.split("/", 1)[0], []).append((k, v))
    if len(items) <= GATE_LISTED or not groups:
        return ", ".join(one(k, v) for k, v in items)
    parts = [", ".join(one(k, v) for k, v in items if "/" not in k)]
    for prefix, members in groups.items():
        text = f"{len(members)} {GROUP_WORDS.get(prefix, prefix + ' values')}"
        judged = [(k, v) for k, v in members if g.tolerances.get(k)]
        over = [k for k, v in judged if v > g.tolerances[k]]
        if judged:
            k, v = max(judged, key=lambda kv: kv[1] / g.tolerances[kv[0]])
            text += (f", {len(over)} over tolerance" + (f" ({', '.join(over)})" if over else "")
                     + f"; closest to its limit {one(k, v)}")
        parts.append(text)
    return ", ".join(x for x in parts if x)
