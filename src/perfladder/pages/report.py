"""Every table a page shows, and the boxes around them (framework-free).

HTML, not markdown: a table here has a few columns whose cells stack a number over its
qualifier (tokens/s over the window range, a ratio over its verdict), so it reads at the width
of the book's content column; long names wrap. Each HTML function has a text twin for a
terminal. A rung's result and the kernel breakdown come from ``perfladder.pages.cards``.

* ``banner`` / ``banner_html`` / ``banner_text``: which configuration produced a page;
* ``ladder_table_html``: one row per rung (tokens/s and window range, verdict and ratio,
  regime, TFLOP/s and MFU, memory); ``text_table`` its text form (the CLI's ``table``);
* ``comparison_html`` / ``comparison_markdown``: two ladders lined up by technique key;
* ``sections_html``: rung -> technique -> chapter section, from the rung declarations;
* ``run_label``: where and when a run was measured; ``box_html``, ``fold_html``, ``figure_html``, ``paragraphs_html``, ``bullets_html``: the page's building blocks.
"""
from __future__ import annotations

import html
import re

from perfladder.config import LadderConfig
from perfladder.measure.verdict import COMPUTE, DEVICE_BOUND, HOST, MEMORY, MIXED
from perfladder.pages import rerun
from perfladder.pages.claims import (
    call,
    config_of,
    is_smoke,
    regime_of,
    settled,
    short_reason,
)
from perfladder.results.record import LadderResult, RungResult
from perfladder.words import gib, percent, rate, ratio, tflops

__all__ = ["banner", "banner_html", "banner_text", "config_of", "text_table",
           "ladder_table_html", "comparison_html", "comparison_markdown", "sections_html",
           "run_label", "box_html", "fold_html", "figure_html", "paragraphs_html", "bullets_html"]

MUTED = "#666"
# a table never grows past the text column; words wrap whole (a column is never narrower than
# its longest word: no "comput e"), and only a code name (a kernel, a recipe) may break
# anywhere (``cards.code_html``)
TABLE_STYLE = ("border-collapse: collapse; width: 100%; max-width: 100%; font-size: 0.85em; "
               "margin: 0.4em 0 0.8em 0;")
CELL_STYLE = ("padding: 0.25em 0.45em; vertical-align: top; border-bottom: 1px solid #e4e4e4; "
              "overflow-wrap: break-word; word-break: normal; hyphens: none;")
HEAD_STYLE = "padding: 0.25em 0.45em; text-align: left; border-bottom: 1px solid #999;"
BOXES = {"note": ("#1f77b4", "#eef5fb"), "warning": ("#e67e22", "#fff6e5"),
         "smoke": ("#7f7f7f", "#f4f4f4")}


# -- the banner (also the CLI's and the status page's) -----------------------------------------
def banner_text(config: LadderConfig, device: str) -> str:
    if config.is_smoke:
        return (f"**SMOKE RUN on {device}.** This page was executed with the tiny `smoke` "
                "configuration so that it builds anywhere. Its numbers exercise the code; they are "
                "NOT performance results. Real numbers: the H200 reference results page, or "
                "rebuild on a GPU.")
    return (f"Full configuration on **{device}** (width {config.num_hiddens}, {config.num_blks} blocks, "
            f"context {config.num_steps}, batches {config.batch_size} / {config.big_batch}).")


def _md_inline_to_html(text: str) -> str:
    """``**bold**`` and ```code``` of the banner text as HTML (everything else escaped)."""
    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def box_html(title: str, body_html: str, kind: str = "note", cls: str = "") -> str:
    """An admonition box: the theme's own classes, with an inline style for plain Jupyter."""
    if kind not in BOXES:
        raise ValueError(f"kind={kind!r} is not valid; valid choices: {tuple(BOXES)}")
    color, bg = BOXES[kind]
    klass = " ".join(["admonition", "warning" if kind == "warning" else "note"] + ([cls] if cls else []))
    return (f'<div class="{klass}" style="border-left: 0.3em solid {color}; '
            f'background: {bg}; padding: 0.5em 0.9em; margin: 0.5em 0; overflow-wrap: anywhere;">'
            f'<p class="admonition-title" style="font-weight: bold; margin: 0 0 0.3em 0;">'
            f'{html.escape(title)}</p>{body_html}</div>')


def banner_html(config: LadderConfig, device: str) -> str:
    """The banner as an HTML admonition box (HTML rather than a MyST directive: notebook
    markdown outputs render as GitHub-flavoured markdown, where a directive shows as text)."""
    kind, title = (("warning", "Smoke run: not performance numbers") if config.is_smoke
                   else ("note", f"Full configuration on {device}"))
    body = f'<p style="margin: 0;">{_md_inline_to_html(banner_text(config, device))}</p>'
    return box_html(title, body, kind, cls="perfladder-banner")


def display_html(html_text: str, text: str) -> None:
    """``html_text`` through IPython when a kernel is running, else ``text`` printed."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display({"text/html": html_text, "text/plain": text}, raw=True)
    else:
        print(text)


def banner(config: LadderConfig, device: str) -> None:
    """Say which configuration produced this page's numbers (HTML box in a notebook, text elsewhere)."""
    plain = banner_text(config, device).replace("**", "").replace("`", "")
    if config.is_smoke:
        plain = "=" * 78 + "\n" + plain + "\n" + "=" * 78
    display_html(banner_html(config, device), plain)


# -- building blocks ---------------------------------------------------------------------------
def esc(x) -> str:
    return html.escape(str(x))


def small(text: str) -> str:
    """A muted second line inside a cell (``text`` is already HTML)."""
    return f'<br><span style="color: {MUTED}; font-size: 0.9em;">{text}</span>' if text else ""


def table_html(head: list[str], rows: list[list[str]], numeric: set[int] = frozenset(),
               cls: str = "perfladder-table") -> str:
    """A table of HTML cells; columns in ``numeric`` align right."""
    def cell(tag, i, c, style):
        align = " text-align: right;" if i in numeric else ""
        return f'<{tag} style="{style}{align}">{c}</{tag}>'
    out = [f'<table class="{cls}" style="{TABLE_STYLE}"><thead><tr>'
           + "".join(cell("th", i, h, HEAD_STYLE) for i, h in enumerate(head)) + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(cell("td", i, c, CELL_STYLE) for i, c in enumerate(r)) + "</tr>" for r in rows]
    return "".join(out) + "</tbody></table>"


def fold_html(summary: str, body_html: str, cls: str = "perfladder-fold") -> str:
    """``body_html`` folded under a one-line ``summary`` (a ``<details>``: one click opens it)."""
    return (f'<details class="{cls}"><summary>{html.escape(summary)}</summary>'
            f'<div style="margin: 0.3em 0 0.6em 0;">{body_html}</div></details>')


def figure_html(fig, alt: str) -> str:
    """A matplotlib figure as an inline PNG ``<img>`` (so it can sit inside a fold)."""
    import base64
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" style="max-width: 100%;" src="data:image/png;base64,{data}">'


def paragraphs_html(sentences: list[str], cls: str = "perfladder-text") -> str:
    body = "".join(f'<p style="margin: 0.3em 0;">{esc(s)}</p>' for s in sentences)
    return f'<div class="{cls}">{body}</div>'


def bullets_html(sentences: list[str], cls: str = "perfladder-text") -> str:
    return f'<ul class="{cls}">' + "".join(f"<li>{esc(s)}</li>" for s in sentences) + "</ul>"


def run_label(result: LadderResult, source: str = "") -> str:
    """Where, when, with what and by which command a run was measured."""
    v = result.versions
    libs = ", ".join(f"{k} {v[k]}" for k in ("torch", "jax", "jaxlib", "flax", "optax", "cuda") if k in v)
    out = (f"{result.framework} on {result.device}, {result.config.get('name', '?')} configuration, "
           f"recorded {result.created or 'at an unrecorded date'}; python {v.get('python', '?')}"
           + (f", {libs}" if libs else ""))
    if result.command:
        out += f"; command: {result.command}"
    return out + (f"; file: {source}" if source else "")


# -- the ladder table --------------------------------------------------------------------------
def _vs_cell(result: LadderResult, r: RungResult) -> tuple[str, str]:
    c = call(result, r)
    if c.word == "skipped":
        return "", ""
    if r.built_on_earlier:                  # no ratio across versions (perfladder.pages.rerun)
        return "", rerun.table_mark(r)
    if r.kind == "control":
        return "", "control"
    if c.word == "start":
        return "", "baseline" if r.name == result.baseline else "floor"
    vs = f"{c.label} {c.against}" if c.label else ""
    word = c.word + (" (base unsettled)" if c.shaky else "")
    return vs, word


def _regime_cell(r: RungResult) -> tuple[str, str]:
    reg = r.regime or {}
    word = regime_of(r)
    if not r.measured:
        return "", ""
    if word == HOST:
        return word, f"busy {percent(reg['busy'])}"
    shares = reg.get("compute_share") or reg.get("memory_share")
    if word in (COMPUTE, MEMORY, MIXED) and shares:
        return word, (f"matmul+attn {percent(reg.get('compute_share', 0))}, "
                      f"memory {percent(reg.get('memory_share', 0))}")
    if word in (MIXED, DEVICE_BOUND):
        return word, "no breakdown"
    return word, ""


def ladder_rows(result: LadderResult) -> list[list[str]]:
    rows = []
    for r in result.rungs:
        kind = "" if r.kind == "rung" else f" ({esc(r.kind)})"
        name = f"<strong>{esc(r.name)}</strong>" + small(esc(r.label) + kind)
        if not r.measured:
            rows.append([name, "skipped" + small(esc(short_reason(r.error, 90))), "", "", "", ""])
            continue
        rng = f"{rate(r.timing.low)}–{rate(r.timing.high)}" if r.timing else ""
        tok = esc(rate(r.tokens_per_s)) + small(esc(rng) + (" · did not settle" if settled(r) is False else ""))
        vs, word = _vs_cell(result, r)
        regime, detail = _regime_cell(r)
        mem = gib(None if r.memory is None else r.memory.bytes)
        rows.append([name, tok, esc(vs or "–") + small(esc(word)), esc(regime) + small(esc(detail)),
                     esc(tflops(r.tflops)) + small("" if r.mfu is None else f"{percent(r.mfu, 1)} MFU"),
                     esc(mem) + small(esc(r.memory.kind) if r.memory is not None else "")])
    return rows


def ladder_table_html(result: LadderResult) -> str:
    """Every rung of one ladder: tokens/s (window range), x the rung it builds on (verdict),
    regime, TFLOP/s (MFU), memory."""
    head = ["rung", "tokens/s", "x base", "regime", "TFLOP/s", "memory"]
    note = (f'<p style="font-size: 0.8em; color: {MUTED}; margin: 0;">{esc(result.framework)} on '
            f"{esc(result.device)}: tokens/s is the median of the settled windows, under it their range; "
            "'x base' is the ratio to the rung it builds on, printed only where the verdict allows"
            + (". Smoke run: none of these numbers is performance." if is_smoke(result) else ".") + "</p>")
    return note + table_html(head, ladder_rows(result), numeric={1, 4, 5})


def text_table(result: LadderResult) -> str:
    """A plain-text table of every rung (the CLI's ``table``)."""
    head = (f"{'rung':<5} {'key':<18} {'what':<22} {'tokens/s':>12} {'spread':>7} {'x prev':>7} "
            f"{'verdict':<13} {'TFLOP/s':>8} {'MFU':>6}")
    lines = [f"{result.framework} on {result.device} ({result.config.get('name', '?')} config), "
             f"ratios to the rung each builds on", head, "-" * len(head)]
    for r in result.rungs:
        c = call(result, r)
        lines.append(f"{r.name:<5} {r.key[:18]:<18} {r.label[:22]:<22} {rate(r.tokens_per_s):>12} "
                     f"{percent(r.spread, 1):>7} {ratio(c.ratio):>7} "
                     f"{c.word if c.word not in ('start', 'skipped') else '-':<13} {tflops(r.tflops):>8} "
                     f"{percent(r.mfu, 1):>6}" + rerun.line_note(r))
    if result.learning is not None:
        lines.append(str(result.learning))
    return "\n".join(lines)


# -- two ladders, by technique key -------------------------------------------------------------
def keys_in_order(results: list[LadderResult]) -> list[str]:
    """Every technique key of every ladder, each ladder's own order kept (a new key goes right
    after the key that precedes it in its ladder)."""
    keys: list[str] = []
    for res in results:
        after = None
        for r in res.rungs:
            if r.key not in keys:
                keys.insert(0 if after is None else keys.index(after) + 1, r.key)
            after = r.key
    return keys


def _cmp_cell(res: LadderResult, r: RungResult | None, html_out: bool) -> str:
    if r is None:
        return ""
    if not r.measured:
        body = f"skipped: {short_reason(r.error, 70)}"
    else:
        c = call(res, r)
        body = rate(r.tokens_per_s)
        if r.kind == "control":
            body += " · control"
        else:
            body += (f" · {c.label} {c.against}" if c.label else "")      # a ratio, or a bound
            body += "" if c.word in ("start", "skipped") else f" · {c.word}"
    if html_out:
        return f"<strong>{esc(r.name)}</strong> {esc(r.label)}" + small(esc(body))
    return f"{r.name} {r.label}: {body}"


def comparison_html(results: list[LadderResult]) -> str:
    """One row per technique key; per ladder its rung, tokens/s, ratio to its own base, verdict."""
    head = ["technique"] + [f"{esc(res.framework)} tokens/s" for res in results]
    rows = [[f"<code>{esc(k)}</code>"] + [_cmp_cell(res, res.by_key(k), True) for res in results]
            for k in keys_in_order(results)]
    note = "; ".join(f"{esc(res.framework)}: {esc(res.device)}, {esc(res.config.get('name', '?'))} "
                     f"configuration, baseline {esc(res.baseline)}" for res in results)
    return (f'<p style="font-size: 0.8em; color: {MUTED}; margin: 0;">{note}. Each ratio is to the '
            "rung that rung builds on in its own ladder.</p>" + table_html(head, rows))


def comparison_markdown(results: list[LadderResult]) -> str:
    """The comparison as a markdown table (the CLI's ``table`` with two files)."""
    lines = ["| technique | " + " | ".join(f"{res.framework} tokens/s" for res in results) + " |",
             "|---|" + "---|" * len(results)]
    for k in keys_in_order(results):
        cells = [_cmp_cell(res, res.by_key(k), False).replace("|", "/") for res in results]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _optional(r) -> str:
    return " (optional: run only when named)" if getattr(r, "optional", False) else ""


def sections_html(rungs) -> str:
    """Rung -> technique -> chapter section, from rung declarations (``perfladder.ladder.engine.Rung``)
    or results (anything with ``name``, ``key``, ``label``, ``section``)."""
    rows = [[f"<strong>{esc(r.name)}</strong>",
             esc(r.label) + small(f"<code>{esc(r.key)}</code>{esc(_optional(r))}"),
             esc(r.section or "-")] for r in rungs]
    return table_html(["rung", "technique", "chapter section"], rows)




# -- a rung's sentences --------------------------------------------------------------------------


def header_display(html_text: str, text: str, display_id: str, update: bool = False) -> None:
    """The page's header, under ``display_id`` in a kernel so that a later cell can update it in
    place (``update``); outside a kernel the text is printed once, never updated."""
    try:
        from IPython import get_ipython
        from IPython.display import display, update_display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        (update_display if update else display)({"text/html": html_text, "text/plain": text}, raw=True,
                                                 display_id=display_id)
    elif not update:
        print(text)
