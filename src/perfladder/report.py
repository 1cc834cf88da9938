"""What notebooks show around the numbers (framework-free): the smoke banner, result tables."""
from __future__ import annotations

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


def banner(config: LadderConfig, device: str) -> None:
    """Print (and, in a notebook, display) which configuration produced this page's numbers."""
    text = banner_text(config, device)
    print(("=" * 78 + "\n" + text.replace("**", "") + "\n" + "=" * 78) if config.is_smoke else text.replace("**", ""))
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        return
    if get_ipython() is not None:
        kind = "warning" if config.is_smoke else "note"
        display(Markdown(f":::{{{kind}}}\n{text}\n:::"))


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
            f(r.ratio_prev, ".2f"), f(r.ratio_base, ".2f"), f(r.tflops, ".1f"),
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
