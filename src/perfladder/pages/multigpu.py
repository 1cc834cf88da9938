"""The committed multi-GPU measurements a ladder page shows beside its R5 cells (framework-free).

A book built on one GPU or none cannot measure data parallelism; the R5 cells then show the
committed run of ``benchmarks/results/h200x2-r5`` (``benchmarks/r5_multi_gpu.py`` on two
H200s joined by NVLink): every measurement with the prediction written before its launch.
"""
from __future__ import annotations

import html
from pathlib import Path

from perfladder.pages.words import gbps, percent, rate
from perfladder.results.committed import multi_gpu_run

# which committed measurements belong to which rung: (form, mechanisms)
FOR_RUNG = {"R5": ("seed", ("ddp", "mesh")), "R5x": ("fast", ("ddp", "mesh", "jax.distributed")),
            "R5f": ("fast", ("fsdp2", "mesh-fsdp"))}


def measurements(framework: str, rung: str, root: Path | None = None) -> list[dict]:
    """The committed measurements of ``framework`` for ``rung`` (R5 / R5x / R5f), or ``[]``;
    ``root``: the folder of ``r5.json`` (default: the committed R5 run)."""
    data = multi_gpu_run(root) if rung in FOR_RUNG else None
    if data is None:
        return []
    form, mechs = FOR_RUNG[rung]
    return [m for m in data.get("measurements", []) if m.get("framework") == framework
            and m.get("form") == form and m.get("mechanism") in mechs and m.get("status") == "measured"]


def cells(m: dict) -> list[str]:
    eff = m.get("efficiency_vs_linear")        # None: no settled baseline to be a fraction of
    return [m["mechanism"], str(m["k"]), str(m["per_rank_batch"]),
            rate(m.get("predicted_tokens_per_s")), rate(m.get("measured_tokens_per_s")),
            "n/a" if eff is None else percent(eff), gbps(m.get("bus_bw_measured") or None),
            percent(m.get("spread"), 1)]


HEAD = ["how", "k", "batch/GPU", "predicted (no-overlap floor)", "measured tokens/s", "of linear",
        "all-reduce GB/s", "spread"]


def table_html(rows: list[dict]) -> str:
    """Prediction beside measurement, one row per committed measurement."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEAD)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells(m)) + "</tr>"
                   for m in rows)
    return f'<table class="perfladder-table"><tr>{head}</tr>{body}</table>'


def table_text(rows: list[dict]) -> str:
    return "\n".join(" | ".join(r) for r in [HEAD, *(cells(m) for m in rows)])
