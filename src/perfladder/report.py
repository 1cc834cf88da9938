"""What notebooks show around the numbers (framework-free): the smoke banner, result tables."""
from __future__ import annotations

import dataclasses
import html
import re

from .config import LadderConfig
from .results import LadderResult


def banner_text(config: LadderConfig, device: str) -> str:
    if config.is_smoke:
        return (f"**SMOKE RUN on {device}.** This page was executed with the tiny `smoke` "
                "configuration so that it builds anywhere. Its numbers exercise the code; they are "
                "NOT performance results. Real numbers: the H200 reference results page, or "
                "rebuild on a GPU.")
    return (f"Full configuration on **{device}** (width {config.num_hiddens}, {config.num_blks} blocks, "
            f"context {config.num_steps}, batches {config.batch_size} / {config.big_batch}).")


def banner_html(config: LadderConfig, device: str) -> str:
    """The banner as an HTML admonition box.

    HTML rather than a MyST ``:::{warning}`` block: the book renders notebook markdown
    outputs as GitHub-flavoured markdown (``nb_render_markdown_format: gfm``, for the
    tables), where a MyST directive would show as raw text. The classes are the theme's
    own admonition classes; the inline style is the fallback for plain Jupyter.
    """
    kind, title, color, bg = (("warning", "Smoke run: not performance numbers", "#e67e22", "#fff6e5")
                              if config.is_smoke else
                              ("note", f"Full configuration on {device}", "#1f77b4", "#eef5fb"))
    body = _md_inline_to_html(banner_text(config, device))
    return (f'<div class="admonition {kind} perfladder-banner" style="border-left: 0.3em solid {color}; '
            f'background: {bg}; padding: 0.5em 0.9em; margin: 0.5em 0;">'
            f'<p class="admonition-title" style="font-weight: bold; margin: 0 0 0.3em 0;">{html.escape(title)}</p>'
            f'<p style="margin: 0;">{body}</p></div>')


def banner(config: LadderConfig, device: str) -> None:
    """Say which configuration produced this page's numbers.

    In a notebook: an HTML admonition (warning for smoke, note for full). Elsewhere:
    printed text (framed for smoke).
    """
    text = banner_text(config, device)
    plain = text.replace("**", "").replace("`", "")
    if config.is_smoke:
        plain = "=" * 78 + "\n" + plain + "\n" + "=" * 78
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display({"text/html": banner_html(config, device), "text/plain": plain}, raw=True)
    else:
        print(plain)


def config_of(result: LadderResult) -> LadderConfig:
    """The ``LadderConfig`` a results file was produced with (from its ``config`` dict)."""
    fields = {f.name for f in dataclasses.fields(LadderConfig)}
    return LadderConfig(**{k: v for k, v in result.config.items() if k in fields})


def _md_inline_to_html(text: str) -> str:
    """``**bold**`` and ```code``` of the banner text as HTML (everything else escaped)."""
    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def tflops_text(v: float | None) -> str:
    """TFLOP/s with one decimal when large, two significant digits when small (a smoke run on
    a CPU achieves ~0.001 TFLOP/s, which ``.1f`` would print as a misleading 0.0)."""
    if v is None:
        return ""
    return f"{v:.1f}" if v >= 1 else f"{v:.2g}"


def markdown_table(result: LadderResult) -> str:
    """Every rung of one ladder as a markdown table."""
    f = lambda v, fmt: "" if v is None else format(v, fmt)  # noqa: E731
    rows = ["| rung | what | tokens/s | spread | x prev | x " + result.baseline + " | TFLOP/s | MFU | memory GiB |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result.rungs:
        rows.append("| " + " | ".join([
            r.name, r.label + ("" if r.kind == "rung" else f" ({r.kind})"),
            "skipped" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
            f(None if r.spread is None else 100 * r.spread, ".1f") + ("%" if r.spread is not None else ""),
            f(r.ratio_prev, ".2f"), f(r.ratio_base, ".2f"), tflops_text(r.tflops),
            "n/a" if r.mfu is None else f"{100 * r.mfu:.1f}%",
            f(None if r.peak_mem_bytes is None else r.peak_mem_bytes / 2**30, ".2f")]) + " |")
    return "\n".join(rows)


def show_table(result: LadderResult) -> None:
    """Display the ladder's table (markdown in a notebook, text elsewhere)."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
        if get_ipython() is not None:
            display(Markdown(markdown_table(result)))
            return
    except ImportError:
        pass
    print(result.table())


def text_table(result: LadderResult) -> str:
    """A plain-text table of every rung (the CLI's ``table``)."""
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    head = (f"{'rung':<5} {'key':<18} {'what':<22} {'tokens/s':>12} {'spread':>7} {'x prev':>7} "
            f"{'verdict':<13} {'TFLOP/s':>8} {'MFU':>6}")
    lines = [f"{result.framework} on {result.device} ({result.config.get('name', '?')} config), "
             f"ratios to the rung each builds on", head, "-" * len(head)]
    for r in result.rungs:
        spread = None if r.spread is None else 100 * r.spread
        lines.append(f"{r.name:<5} {r.key[:18]:<18} {r.label[:22]:<22} {f(r.tokens_per_s, ',.0f'):>12} "
                     f"{f(spread, '.1f'):>6}% {f(r.ratio_prev, '.2f'):>7} "
                     f"{(r.verdict or {}).get('verdict', '-'):<13} {f(r.tflops, '.3g'):>8} "
                     f"{f(None if r.mfu is None else 100 * r.mfu, '.1f'):>6}")
    if result.learning is not None:
        lines.append(str(result.learning))
    return "\n".join(lines)
