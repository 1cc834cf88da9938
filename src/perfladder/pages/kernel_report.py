"""The kernel report a ladder page shows for its fastest configuration (framework-free): the
kernel breakdown by kind and by kernel, the roofline per kernel group against this run's probed
ceilings, and the rungs that went after each group (``tried_against``). Rungs' own cards:
``perfladder.pages.cards``.
"""
from __future__ import annotations

from perfladder.kernels.accounting import ROOF_ERROR, accounting_error, roof_fraction
from perfladder.pages.cards import code_html
from perfladder.pages.claims import call, short_reason
from perfladder.pages.report import MUTED, esc, table_html
from perfladder.results.record import LadderResult, RungResult


def kernel_rung(result: LadderResult) -> RungResult | None:
    """The rung that carries the ladder's kernel breakdown: the fastest configuration
    (``LadderResult.fastest_rung``, the one meaning every page gives the words) when it has
    one, else the last rung that does (a run whose fastest failed its report)."""
    with_kb = [r for r in result.rungs if r.kernels]
    if not with_kb:
        return None
    fastest = result.fastest_rung() if result.waterfall() else None
    return fastest if fastest is not None and fastest.kernels else with_kb[-1]


def fastest_roofline(result: LadderResult) -> dict:
    """The fastest configuration's roofline (its kernel report's): totals and ``rows``; raises
    ``ValueError`` when the run recorded none."""
    r = kernel_rung(result)
    rl = r.kernels.get("roofline") if r is not None else None
    if not rl or not rl.get("rows"):
        raise ValueError("the run recorded no kernel report with a roofline")
    return rl


def kernel_html(kb: dict, title: str = "", tried: dict[str, list[str]] | None = None) -> str:
    """A ``KernelBreakdown.to_dict()``: time by category, then the top kernels, device time first."""
    steps = kb.get("steps") or 1
    ms = lambda us: us / steps / 1000.0  # noqa: E731
    busy = kb.get("busy")
    what = "kernels" if kb.get("device") == "gpu" else "CPU ops"
    head = (f"{title + ': ' if title else ''}{kb.get('framework', '')} {what} on {kb.get('device')}: "
            f"{ms(kb.get('total_us', 0)):.2f} ms per step summed over {steps} profiled steps"
            + ("" if not kb.get("num_events") else f", {kb['num_events'] / steps:.0f} launches per step")
            + ("" if busy is None else f", {busy:.0%} of the profiled wall time"))
    cats = sorted(kb.get("category_us", {}).items(), key=lambda kv: -kv[1])
    shares = kb.get("category_share", {})
    cat_rows = [[f"{ms(us):.3f}", f"{shares.get(c, 0):.1%}", esc(c)] for c, us in cats if us > 0]
    top = [[f"{ms(k['total_us']):.3f}", f"{k['share']:.1%}", f"{k['calls'] / steps:g}", esc(k["category"]),
            code_html(k["name"])] for k in kb.get("top", [])]
    notes = "".join(f"<li>{esc(n)}</li>" for n in kb.get("notes", []))
    return (f'<div class="perfladder-kernels"><p style="margin: 0.2em 0;"><strong>{esc(head)}</strong></p>'
            + table_html(["ms/step", "share", "category"], cat_rows, numeric={0, 1})
            + table_html(["ms/step", "share", "calls/step", "category", "kernel"], top, numeric={0, 1, 2})
            + roofline_html(kb.get("roofline"), tried)
            + (f'<ul style="font-size: 0.85em; color: {MUTED};">{notes}</ul>' if notes else "") + "</div>")


def _roofline_rows(rl: dict, tried: dict[str, list[str]] | None = None) -> list[list[str]]:
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    return [[f(r["time_ms"], ".2f"), f(r["floor_ms"], ".2f"), f(r["above_ms"], ".2f"), esc(r["group"]),
             esc("accounting error" if accounting_error(r) else (r.get("bound") or "")), f(None if r.get("bw_frac") is None else 100 * r["bw_frac"], ".0f"),
             f(None if r.get("mm_frac") is None else 100 * r["mm_frac"], ".0f")]
            + ([esc("; ".join(tried.get(r["group"], [])) or "-")] if tried is not None else [])
            for r in rl.get("rows", []) if r.get("time_ms")]


def tried_against(result: LadderResult, decls) -> dict[str, list[str]]:
    """``{roofline group: ["B8 +fused RoPE: 1.08x B5, faster", ...]}``: every rung of
    ``result`` whose declaration (``decls``: name -> ``Rung``) targets that group, with what
    its evidence says (the same words the cards use: a ratio only where one may be printed)."""
    out: dict[str, list[str]] = {}
    for r in result.rungs:
        d = decls.get(r.name)
        if d is None or not d.targets:
            continue
        c = call(result, r)
        if c.word == "skipped":
            what = f"skipped ({short_reason(r.error or '; '.join(r.notes), 60)})"
        elif c.label:
            what = f"{c.label} {c.against}, {c.word}"
        else:
            what = c.word
        for g in d.targets:
            out.setdefault(g, []).append(f"{r.name} {r.label}: {what}")
    return out


def roofline_html(rl: dict | None, tried: dict[str, list[str]] | None = None) -> str:
    """The roofline per kernel group: time, the floor its bytes and FLOPs set at this run's
    measured ceilings, and how far above it each group stands (``perfladder.kernels.roofline``);
    with ``tried``, the rungs that went after each group and what came of them."""
    if not rl:
        return ""
    head = (f"Roofline per kernel group: {rl['time_ms']:.2f} ms of kernels per step against a floor "
            f"of {rl['floor_ms']:.2f} ms at this run's measured copy and matmul ceilings"
            + (f" ({rl['roofs']['source']})" if (rl.get("roofs") or {}).get("source") else ""))
    cols = ["ms/step", "floor ms", "above ms", "group", "bound by", "% copy roof", "% matmul roof"]
    note = under_floor_note(rl)
    return (f'<p style="margin: 0.6em 0 0.2em 0;"><strong>{esc(head)}</strong></p>'
            + table_html(cols + (["tried against it"] if tried is not None else []),
                         _roofline_rows(rl, tried), numeric={0, 1, 2, 5, 6})
            + (f'<p style="font-size: 0.85em;">{esc(note)}</p>' if note else ""))


def under_floor_note(rl: dict) -> str:
    """What a group that runs under its floor means. Within ``ROOF_ERROR`` of the roof: the
    floor is this run's measured copy and matmul rates, which a kernel can beat by a little,
    so the group is at its roof. Further above: an accounting error (the group was charged
    bytes or FLOPs its kernels do not move or do), flagged as one and never called a roof."""
    beaten = [r for r in rl.get("rows", []) if r.get("time_ms") and r.get("above_ms") is not None
              and r["above_ms"] < 0]
    at_roof = [r for r in beaten if not accounting_error(r)]
    wrong = [accounting_error(r) for r in rl.get("rows", []) if r.get("time_ms") and accounting_error(r)]
    out = []
    if at_roof:
        names = ", ".join(f"{r['group']} ({r['above_ms']:.2f} ms, {100 * roof_fraction(r):.0f}% of its roof)"
                          for r in at_roof)
        out.append(f"Under its floor: {names}. The floors use the rates this run's probes measured (a "
                   "plain device copy, a large bf16 matmul), which a kernel can beat by a little; read "
                   "such a group as at its roof, with nothing left to gain.")
    if wrong:
        out.append("Accounting error: " + "; ".join(wrong) + f". Over {100 * ROOF_ERROR:.0f}% of a "
                   "roof is not a fast kernel; this row's floor is not read.")
    return " ".join(out)


def kernel_text(kb: dict, title: str = "", tried: dict[str, list[str]] | None = None) -> str:
    steps = kb.get("steps") or 1
    lines = [f"{title + ': ' if title else ''}{kb.get('total_us', 0) / steps / 1000:.2f} ms/step of kernels"]
    for c, us in sorted(kb.get("category_us", {}).items(), key=lambda kv: -kv[1]):
        if us > 0:
            lines.append(f"  {us / steps / 1000:8.3f} ms  {c}")
    for k in kb.get("top", []):
        lines.append(f"  {k['total_us'] / steps / 1000:8.3f} ms  {k['category']:<14} {k['name'][:60]}")
    rl = kb.get("roofline")
    if rl:
        lines.append(f"roofline: {rl['time_ms']:.2f} ms of kernels per step, floor {rl['floor_ms']:.2f} ms")
        for r in rl.get("rows", []):
            if r.get("time_ms"):
                lines.append(f"  {r['time_ms']:8.2f} ms  floor {r['floor_ms']:6.2f}  above {r['above_ms']:6.2f}  "
                             f"{r['group']}" + ("" if tried is None else
                                                f"  tried: {'; '.join(tried.get(r['group'], [])) or '-'}"))
        if under_floor_note(rl):
            lines.append(under_floor_note(rl))
    return "\n".join(lines)
