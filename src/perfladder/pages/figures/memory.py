"""What each rung's step holds in memory: computed from its shapes beside what the run measured
(framework-free).

Computed, per rung (``need``), in bytes:

* parameters: P fp32 weights (``Workload.params``), 4P;
* gradients: one fp32 gradient per weight, 4P;
* optimizer state: AdamW's two fp32 moments, 8P;
* activations: what the backward pass keeps, per block and token: the residual stream entering
  each of the two sub-layers (2D in the stream's dtype), and in the compute dtype the two
  LayerNorm outputs, q, k and v, the attention output and the FFN's hidden layer before and
  after GELU (6D + 2F), plus attention's fp32 row statistics (H); then the logits (V fp32 and
  V in the compute dtype). Under activation checkpointing a block keeps only its input (D in
  the stream's dtype) and one block's activations are alive again during its backward.

Measured: the run's own figure (``RungResult.memory``): PyTorch's peak allocated bytes, or
XLA's planned temporaries (``memory_analysis().temp_size_in_bytes``), which leave out the
program's arguments (weights and optimizer state): those are added to it, computed, so the two
bars count the same things. Where the measured bar stands above the computed one, the rest is
workspace (matmul and attention scratch, the allocator's rounding, temporaries the count
leaves out).
"""
from __future__ import annotations

from perfladder.pages.figures.workload import workload
from perfladder.pages.plot import PAGE_WIDTH_IN, dead_ends
from perfladder.results.record import LadderResult, RungResult

PARTS = ("parameters", "gradients", "optimizer state", "activations")
COLORS = {"parameters": "#4c72b0", "gradients": "#55a868", "optimizer state": "#c44e52",
          "activations": "#dd8452", "measured": "#555555", "outside the measurement": "#bbbbbb"}
TEMPORARIES = "planned temporaries"
GB = 1e9


def need(result: LadderResult, r: RungResult) -> dict[str, float]:
    """``{part: bytes}`` the step must hold at its peak, computed (module docstring)."""
    w = workload(result, r)
    N, D, L, V, H = w.tokens, w.width, w.blocks, w.vocab, w.heads
    F, a, s = w.ffn_mult * w.width, w.act_bytes, w.stream_bytes
    P = w.params
    per_block = N * (2 * D * s + (6 * D + 2 * F) * a + H * 4)
    logits = N * V * (4 + a)
    if (r.recipe or {}).get("checkpoint"):
        acts = L * N * D * s + per_block + logits
    else:
        acts = L * per_block + logits
    return {"parameters": 4.0 * P, "gradients": 4.0 * P, "optimizer state": 8.0 * P, "activations": float(acts)}


def rows(result: LadderResult) -> list[dict]:
    """One row per measured waterfall rung: ``{'name', 'need': {part: bytes}, 'computed',
    'measured' (bytes, comparable to 'computed'), 'kind', 'outside' (bytes the measurement
    leaves out, added computed), 'dead_end'}``."""
    dead = dead_ends(result)
    out = []
    for r in result.waterfall():
        n = need(result, r)
        mem = r.memory
        measured = None if mem is None or mem.bytes is None else float(mem.bytes)
        outside = 0.0
        if measured is not None and mem.kind == TEMPORARIES:
            outside = n["parameters"] + n["optimizer state"]
            measured += outside
        out.append({"name": r.name, "need": n, "computed": sum(n.values()), "measured": measured,
                    "kind": None if mem is None else mem.kind, "outside": outside,
                    "dead_end": r.name in dead})
    return out


def under(row: dict) -> bool:
    """A measured figure under half of what the step must hold: the measurement missed memory
    (taken before it began), not a step that holds less than its tensors."""
    return row["measured"] is not None and row["measured"] < 0.5 * row["computed"]


def figure(result: LadderResult, capacity_gb: float | None = None):
    """Per rung, a stacked bar of the computed parts and beside it the measured bar; the
    device's memory as a line when ``capacity_gb`` is given."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from perfladder.pages.claims import is_smoke
    data = rows(result)
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH_IN, 3.8), layout="constrained")
    w = 0.38
    kinds = set()
    for i, row in enumerate(data):
        bottom = 0.0
        for part in PARTS:
            v = row["need"][part] / GB
            ax.bar(i - w / 2, v, w, bottom=bottom, color=COLORS[part], gid=f"computed:{row['name']}:{part}")
            bottom += v
        if row["measured"] is not None:
            kinds.add(row["kind"])
            if row["outside"]:
                ax.bar(i + w / 2, row["outside"] / GB, w, color=COLORS["outside the measurement"],
                       gid=f"outside:{row['name']}")
            ax.bar(i + w / 2, (row["measured"] - row["outside"]) / GB, w, bottom=row["outside"] / GB,
                   color=COLORS["measured"], gid=f"measured:{row['name']}")
            ax.text(i + w / 2, row["measured"] / GB, f"{row['measured'] / GB:.1f}" + (" *" if under(row) else ""),
                    ha="center", va="bottom", fontsize=5.5, gid=f"value:{row['name']}")
    if capacity_gb:
        ax.axhline(capacity_gb, color="#222222", linestyle="--", linewidth=1)
        ax.text(len(data) - 0.5, capacity_gb, f"the device's {capacity_gb:.0f} GB", ha="right",
                va="bottom", fontsize=7)
    ax.set_xticks(range(len(data)))
    ax.set_xticklabels([r["name"] + (" (dead end)" if r["dead_end"] else "") for r in data], fontsize=7,
                       rotation=35, ha="right", rotation_mode="anchor")
    ax.set_ylabel("GB", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.spines[["top", "right"]].set_visible(False)
    smoke = " [SMOKE: not performance numbers]" if is_smoke(result) else ""
    ax.set_title(f"{result.framework} on {result.device}: memory per rung, computed (left) and measured "
                 f"(right){smoke}", fontsize=9)
    handles = [Patch(color=COLORS[p], label=f"{p} (computed)") for p in PARTS]
    handles.append(Patch(color=COLORS["measured"], label="measured (" + ", ".join(sorted(k for k in kinds if k)) + ")"))
    if any(under(r) for r in data):
        handles.append(Patch(color="white", label="*: under half the computed; memory taken before the\n"
                                                  "measurement began is not in it"))
    if any(r["outside"] for r in data):
        handles.append(Patch(color=COLORS["outside the measurement"],
                             label="weights, AdamW moments (computed): not in XLA's temporaries"))
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=6.5, frameon=False)
    return fig
