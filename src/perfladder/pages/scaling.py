"""The committed multi-GPU run and the cost model's predictions beside it (framework-free).

``r5_predictions`` prices k = 2, 4 and 8 (``costmodel.PREDICT_KS``) from the single-GPU
baselines of the committed run, whatever was measured, so every build prints what four and
eight GPUs should do; the table puts each committed measurement beside its prediction.
"""
from __future__ import annotations

import html
from pathlib import Path

from perfladder.multigpu import costmodel
from perfladder.pages.report import esc, table_html
from perfladder.results.committed import MULTI_GPU_RUN, RESULTS, multi_gpu_run
from perfladder.words import rate

FRAMEWORK_NAMES = {"torch": "PyTorch", "jax": "JAX"}
# "fast" is the two-GPU run's own fast recipe (recorded with each measurement), not a ladder's
# fastest configuration (``LadderResult.fastest_rung``): the words keep the two apart
FORM_NAMES = {"seed": "the chapter's form", "chapter": "the chapter's form",
              "fast": "the two-GPU run's fast recipe"}


def pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def table(head: list[str], rows: list[list[str]]) -> str:
    """An HTML table of plain-text headings and already-escaped cells (``report.table_html``)."""
    return table_html([esc(h) for h in head], rows)


def read_r5(root: Path | None) -> dict | None:
    """The committed R5 run (``results.committed.multi_gpu_run``) under the book root ``root``,
    or None."""
    return None if root is None else multi_gpu_run(Path(root) / RESULTS / MULTI_GPU_RUN)


def fast_rows(r5: dict) -> list[dict]:
    return [m for m in r5.get("measurements", []) if m.get("status") == "measured"
            and m.get("form") == "fast" and m.get("mechanism") in ("ddp", "mesh")]


def r5_bases(r5: dict | None) -> list[dict]:
    """The single-GPU baselines of a committed multi-GPU run, each with the per-GPU batch,
    context and parameter count its measurements used: ``{framework, form, batch, seq_len,
    num_params, single, settled}``."""
    out = []
    for key, base in (r5 or {}).get("baselines", {}).items():
        fw, form = key.split(":")
        first = next((m for m in r5.get("measurements", []) if m.get("status") == "measured"
                      and m["framework"] == fw and m["form"] == form), None)
        if first is not None:
            out.append({"framework": fw, "form": form, "batch": first["per_rank_batch"],
                        "seq_len": first["seq_len"], "num_params": first["prediction"]["num_params"],
                        "single": base["tokens_per_s"], "settled": bool(base.get("settled"))})
    return out


def prediction_rows(bases: list[dict], measurements: list[dict] = (), ks=costmodel.PREDICT_KS,
                    link: str = costmodel.REFERENCE_LINK) -> list[dict]:
    """Per baseline: the cost model at every k in ``ks`` (k = 4 and 8 whatever was measured),
    and the measurements of the same framework and form at each k."""
    out = []
    for b in bases:
        preds = costmodel.predictions(b["batch"], b["seq_len"], b["single"], b["num_params"], link, ks)
        same = [m for m in measurements if m.get("status") == "measured"
                and m["framework"] == b["framework"] and m["form"] == b["form"]]
        out.append({**b, "predictions": preds,
                    "measured": {p.k: [m for m in same if m["k"] == p.k] for p in preds}})
    return out


def r5_predictions(r5: dict | None, ks=costmodel.PREDICT_KS, link: str = costmodel.REFERENCE_LINK) -> list[dict]:
    """``prediction_rows`` of a committed multi-GPU run's baselines and measurements."""
    return prediction_rows(r5_bases(r5), (r5 or {}).get("measurements", []), ks, link)


def r5_predictions_html(rows: list[dict]) -> str:
    """One row per framework and form: the prediction at each k, and what was measured there."""
    if not rows:
        return "<p>No committed multi-GPU baselines to predict from.</p>"
    ks = [p.k for p in rows[0]["predictions"]]
    head = ["framework, form", "batch/GPU", "one GPU"] + [f"k = {k}" for k in ks]
    body = []
    for row in rows:
        cells = [f"{FRAMEWORK_NAMES[row['framework']]}, {FORM_NAMES.get(row['form'], row['form'])}",
                 str(row["batch"]), rate(row["single"]) + ("" if row["settled"] else " (did not settle)")]
        for p in row["predictions"]:
            got = row["measured"][p.k]
            meas = "; ".join(f"{m['mechanism']} {rate(m['measured_tokens_per_s'])}" for m in got)
            cells.append(f"predicted {rate(p.predicted_tokens_per_s)} ({pct(p.efficiency)})<br>"
                         + (f"measured: {html.escape(meas)}" if got else "<em>not measured</em>"))
        body.append(cells)
    return table(head, body)


# The lab notes were written when the book called the chapter "the seed"; read to a reader,
# they say "the chapter". Code spans and blocks are left as written (commands, form names).
_CHAPTER_WORDS = [
    (r"\b([Tt])he seed chapter\b", r"\1he chapter"), (r"\b([Tt])he seed's\b", r"\1he chapter's"),
    (r"\bSeed forms\b", "The chapter's forms"), (r"\b([Tt])he seed(?=\s+predicted)", r"\1he chapter"),
    (r"\bseed \+ beyond\b", "chapter + beyond"), (r"\((torch|JAX) seed\)", r"(\1, the chapter's form)"),
    (r"\b(torch|JAX) seed row\b", r"\1 row of the chapter's form"),
    (r"\b(JAX's|torch's) seed step\b", r"\1 step in the chapter's form"),
    (r"\bseed(?=:)", "chapter's form"), (r"(?<=\| )seed(?= \|)", "chapter's form"),
    (r"\b([Tt])he seed (form|rungs|ladders|box|row|step)\b", r"\1he chapter's \2"),
    (r"\bseed (form|forms|rungs|ladders|box|row|step)\b", r"chapter's \1"), (r"\bseed\b", "chapter"),
]


def chapter_words(text: str) -> str:
    """``text`` (markdown) with the old name of the chapter replaced outside code."""
    import re
    parts = re.split(r"(```.*?```|`[^`\n]*`)", text, flags=re.S)
    for i in range(0, len(parts), 2):
        for pattern, repl in _CHAPTER_WORDS:
            parts[i] = re.sub(pattern, repl, parts[i])
    return "".join(parts)
