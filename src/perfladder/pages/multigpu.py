"""The committed multi-GPU measurements a ladder page shows beside its R5 cells (framework-free).

A book built on one GPU or none cannot measure data parallelism; the R5 cells then show the
committed run of ``benchmarks/results/h200x2-r5`` (``benchmarks/r5_multi_gpu.py`` on two
H200s joined by NVLink): every measurement with the prediction written before its launch.
"""
from __future__ import annotations

from pathlib import Path

from perfladder.multigpu import costmodel
from perfladder.pages import report
from perfladder.results.committed import MULTI_GPU_RUN, multi_gpu_run
from perfladder.words import gbps, percent, rate

# which committed measurements belong to which rung: (form, mechanisms)
FOR_RUNG = {"R5": ("seed", ("ddp", "mesh")), "R5x": ("fast", ("ddp", "mesh", "jax.distributed")),
            "R5f": ("fast", ("fsdp2", "mesh-fsdp"))}


def joined_by(row: dict) -> str:
    """How the GPUs of a committed measurement were joined, from the link its prediction priced."""
    link = (row.get("prediction") or {}).get("link")
    if link is None:
        return "joined by an unrecorded link"
    return "joined by NVLink" if costmodel.is_nvlink(link) else f"joined by {costmodel.get_link(link).what}"


def measurements(framework: str, rung: str, root: Path | None = None) -> list[dict]:
    """The committed measurements of ``framework`` for ``rung`` (R5 / R5x / R5f), or ``[]``;
    ``root``: the folder of ``r5.json`` (default: the committed R5 run)."""
    data = multi_gpu_run(root) if rung in FOR_RUNG else None
    if data is None:
        return []
    form, mechs = FOR_RUNG[rung]
    return [m for m in data.get("measurements", []) if m.get("framework") == framework
            and m.get("form") == form and m.get("mechanism") in mechs and m.get("status") == "measured"]


def shown_prediction(framework: str, r, root: Path | None = None) -> dict | None:
    """The one prediction a page shows for data-parallel rung ``r`` (a ``RungResult``): the one
    written down before the measurement shown beside it. ``r``'s own when ``r`` was measured
    (or the committed run measured nothing for it); else the committed run's, priced from that
    run's own one-GPU baseline, since its measurement is what the page shows (``r``'s own, priced
    for a launch its run could not make, stays in its file). ``{'predicted', 'k', 'single',
    'measured', 'source'}``; ``None`` when ``r`` has no prediction and nothing was measured."""
    rows = [] if r.measured else measurements(framework, r.name, root)
    if rows:
        m = rows[0]
        base = m.get("baseline") or {}
        return {"predicted": m.get("predicted_tokens_per_s"), "k": m["k"],
                "single": (m.get("prediction") or {}).get("single_tokens_per_s", base.get("tokens_per_s")),
                "measured": m.get("measured_tokens_per_s"),
                "source": f"the committed multi-GPU run ({MULTI_GPU_RUN}), priced from its own one-GPU "
                          "baseline before its launch"}
    p = r.prediction
    if p is None:
        return None
    k = (p.points[0].get("k") if p.points else None)
    return {"predicted": p.predicted_tokens_per_s, "k": k, "measured": p.measured_tokens_per_s,
            "single": next((v for key, v in p.assumptions.items() if key.endswith("_tokens_per_s")), None),
            "source": "this run, before its launch" if r.measured else
                      "this run's one-GPU rate (not launched: one GPU)"}


def cells(m: dict) -> list[str]:
    eff = m.get("efficiency_vs_linear")        # None: no settled baseline to be a fraction of
    return [m["mechanism"], str(m["k"]), str(m["per_rank_batch"]),
            rate(m.get("predicted_tokens_per_s")), rate(ceiling_of(m)), rate(m.get("measured_tokens_per_s")),
            "n/a" if eff is None else percent(eff), gbps(m.get("bus_bw_measured") or None),
            percent(m.get("spread"), 1)]


def ceiling_of(m: dict) -> float | None:
    """The cost model's ceiling for a committed measurement (``costmodel.ceiling_tokens_per_s``
    of its stored prediction: the all-reduce wholly hidden), ``None`` without one."""
    p = m.get("prediction")
    return None if not p else costmodel.ceiling_tokens_per_s(p)


# The no-overlap prediction prices the step and the wire and nothing else a data-parallel step
# adds, so measurements land below it: it is read as an upper estimate, never as a floor.
HEAD = ["how", "k", "batch/GPU", "predicted, no overlap (an upper estimate)",
        "model ceiling (all-reduce hidden)", "measured tokens/s", "of linear", "all-reduce GB/s", "spread"]


def recipe_note(rows: list[dict]) -> str:
    """What the committed "fast" form ran: its own recipe, written down in its file, which is
    not "the fastest configuration" of any ladder page (that is ``LadderResult.fastest_rung``
    of the run the page shows); "" for the chapter's form."""
    fast = [m for m in rows if m.get("form") == "fast" and m.get("recipe")]
    if not fast:
        return ""
    rec = ", ".join(f"{k} {v}" for k, v in fast[0]["recipe"].items() if v not in (None, False, "default"))
    return (f"The two-GPU run's fast form ran its own recipe ({rec}), recorded with it; it is not "
            "this page's fastest configuration.")


def table_html(rows: list[dict]) -> str:
    """Prediction beside measurement, one row per committed measurement."""
    note = recipe_note(rows)
    esc = report.esc
    return (report.table_html([esc(h) for h in HEAD], [[esc(c) for c in cells(m)] for m in rows])
            + (f"<p>{esc(note)}</p>" if note else ""))


def table_text(rows: list[dict]) -> str:
    note = recipe_note(rows)
    return "\n".join([" | ".join(r) for r in [HEAD, *(cells(m) for m in rows)]] + ([note] if note else []))
