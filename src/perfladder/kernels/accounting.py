"""The accounting of a kernel report and of the profiles beside it, derived in one place from
the raw measurements (no framework imports).

* ``workload_of(framework, recipe, ...)``: what a recipe's step computes, as the roofline's
  ``Workload``: its residual stream in the recipe's own dtype (PyTorch's ``residual``, JAX's
  compute dtype), no RoPE pass of its own when the attention kernel rotates q and k
  (``fused=("attention", ...)`` in either framework) and no GELU pass when the FFN's GEMMs
  apply it (PyTorch's ``fused=("mlp", ...)`` or ``("epilogue", ...)``);
* ``of_run(kb, roofs, ...)``: the roofline of a kernel report at a run's own probed ceilings,
  every row judged by ``accounting_error`` (a group far above its roof is flagged, never read
  as a kernel "at its roof"); ``recorded_report``: the report a rung records, its roofline in it;
* ``rederive(result)``: the derived fields of a ``LadderResult`` read back from a file
  recomputed from its raw data by today's rules -- each profile's category shares and each
  kernel report's categories by the one taxonomy (``perfladder.kernels.categorize``), each
  roofline from its report's own recipe and roofs. Raw measurements (windows, kernel times,
  probed ceilings) are never touched; what the raw data cannot give is said in the record's
  notes (``benchmarks/results/README.md`` lists both).
"""
from __future__ import annotations

import dataclasses

from perfladder.kernels.breakdown import KernelBreakdown
from perfladder.kernels.roofline import Roofs, Workload, roofline

FRAMEWORKS = ("torch", "jax")
# A group measured above its roof by more than this is an accounting error (bytes or FLOPs the
# group was charged that its kernels do not move or do): a kernel can beat a probe's plain
# copy or large matmul by a little, never by half again.
ROOF_ERROR = 1.5


# -- what a recipe's step computes ---------------------------------------------------------------
def stream_fp32(framework: str, recipe: dict, precision: str) -> bool:
    """Is the residual stream fp32? PyTorch: under autocast the stream stays fp32 unless the
    recipe rounds it (``residual='bf16'``); JAX: the stream is in the compute dtype."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework={framework!r} is not valid; valid choices: {FRAMEWORKS}")
    if precision != "bf16":
        return True
    if framework == "torch":
        return (recipe or {}).get("residual", "fp32") != "bf16"
    return False


def rope_in_attention(recipe: dict) -> bool:
    """Does the step's attention kernel rotate q and k itself (either framework's fused
    attention), leaving no RoPE pass to charge as elementwise?"""
    return "attention" in ((recipe or {}).get("fused") or ())


def gelu_in_matmul(recipe: dict) -> bool:
    """Do the step's FFN GEMMs apply GELU and its derivative (PyTorch's fused 'mlp' or
    'epilogue'), leaving no GELU pass to charge as elementwise?"""
    return bool({"mlp", "epilogue"} & set((recipe or {}).get("fused") or ()))


def gelu_fwd_in_matmul(recipe: dict) -> bool:
    """Is GELU's forward in FC1's GEMM epilogue while its backward is a kernel of its own (JAX's
    'gelu_bias_grad': XLA fuses the plain forward into cuBLASLt's GELU epilogue)?"""
    return "gelu_bias_grad" in ((recipe or {}).get("fused") or ())


def workload_of(framework: str, recipe: dict, gpt, *, batch: int, seq: int, precision: str,
                embed: str | None = None) -> Workload:
    """The roofline's ``Workload`` of ``recipe`` (a recipe's ``to_dict()``) on model ``gpt``."""
    recipe = recipe or {}
    return Workload(batch=batch, seq=seq, width=gpt.num_hiddens, heads=gpt.num_heads,
                    blocks=gpt.num_blks, vocab=gpt.vocab_size, precision=precision,
                    stream_fp32=stream_fp32(framework, recipe, precision),
                    embed=embed or recipe.get("embed", "gather"),
                    rope_in_attention=rope_in_attention(recipe), gelu_in_matmul=gelu_in_matmul(recipe),
                 gelu_fwd_in_matmul=gelu_fwd_in_matmul(recipe))


# -- judging a roofline's rows -------------------------------------------------------------------
def roof_fraction(row: dict) -> float | None:
    """The larger of a roofline row's copy-bandwidth and matmul-rate fractions (``None`` when
    it has neither)."""
    fracs = [row[k] for k in ("bw_frac", "mm_frac") if row.get(k) is not None]
    return max(fracs) if fracs else None


def accounting_error(row: dict) -> str:
    """Why a roofline row cannot be read as a kernel at its roof ("" when it can)."""
    f = roof_fraction(row)
    if f is None or f <= ROOF_ERROR:
        return ""
    return (f"{row['group']} measured at {100 * f:.0f}% of its roof: an accounting error, not a "
            f"fast kernel (past {100 * ROOF_ERROR:.0f}% the group is charged bytes or FLOPs its "
            "kernels do not move or do)")


def judged(rl: dict) -> dict:
    """A roofline dict with every row's ``roof_fraction`` and ``accounting_error``, and the
    errors listed once (``accounting_errors``)."""
    rows = [{**r, "roof_fraction": roof_fraction(r), "accounting_error": accounting_error(r)}
            for r in rl.get("rows", [])]
    return {**rl, "rows": rows, "accounting_errors": [r["accounting_error"] for r in rows
                                                      if r["accounting_error"]]}


def of_run(kb, roofs: dict | None, gpt, *, batch: int, seq: int, precision: str,
           framework: str, recipe: dict) -> dict | None:
    """The judged roofline of a kernel report, from a run's own ``LadderResult.roofs`` (``None``
    when the run probed no ceilings: there is nothing to read the rates against)."""
    if not roofs or not roofs.get("copy_gbps") or not roofs.get("matmul_bf16_tflops"):
        return None
    key = "matmul_bf16_tflops" if precision == "bf16" else "matmul_tf32_tflops"
    r = Roofs(copy_bytes_per_s=1e9 * roofs["copy_gbps"], matmul_flops_per_s=1e12 * roofs[key],
              source=roofs.get("source", ""))
    w = workload_of(framework, recipe, gpt, batch=batch, seq=seq, precision=precision)
    return judged(roofline(kb, w, r).to_dict())


def recorded_report(kb, roofs: dict | None, gpt, recipe, *, seq: int, framework: str) -> dict:
    """A kernel report as a rung records it, either framework: the breakdown
    (``KernelBreakdown.to_dict()``), the ``recipe`` profiled and its judged ``roofline``."""
    d = kb.to_dict()
    d["recipe"] = recipe.to_dict()
    d["roofline"] = of_run(kb, roofs, gpt, batch=recipe.batch_size, seq=seq, precision=recipe.precision,
                           framework=framework, recipe=d["recipe"])
    return d


# -- a file read back ----------------------------------------------------------------------------
def reread_report(kb: dict, framework: str) -> dict:
    """A stored kernel report (``KernelBreakdown.to_dict()`` plus its ``recipe`` and
    ``roofline``) with its derived fields recomputed: its categories by today's taxonomy
    (``KernelBreakdown.recategorized``) and its roofline from its own workload shapes and
    roofs, with the stream dtype and the RoPE pass of its own recipe, every row judged."""
    try:
        old = KernelBreakdown.from_dict(kb)
    except ValueError:               # not a full breakdown (an older file's summary): as it is
        return kb
    new = old.recategorized()
    out = kb if new is old else {**kb, **new.to_dict()}
    if out.get("busy") != new.busy:            # a sum over the wall time is no busy fraction
        out = {**out, "busy": new.busy}
    rl, recipe = kb.get("roofline"), kb.get("recipe")
    if not (rl and rl.get("workload") and rl.get("roofs")):
        return out
    w = dict(rl["workload"])
    if recipe is not None:
        w.update(stream_fp32=stream_fp32(framework, recipe, w.get("precision", "bf16")),
                 rope_in_attention=rope_in_attention(recipe), gelu_in_matmul=gelu_in_matmul(recipe),
                 gelu_fwd_in_matmul=gelu_fwd_in_matmul(recipe))
    names = {f.name for f in dataclasses.fields(Workload)}
    rf = rl["roofs"]
    redone = roofline(new, Workload(**{k: v for k, v in w.items() if k in names}),
                      Roofs(copy_bytes_per_s=rf["copy_bytes_per_s"],
                            matmul_flops_per_s=rf["matmul_flops_per_s"], source=rf.get("source", "")),
                      title=rl.get("title", "")).to_dict()
    return {**out, "roofline": judged(redone)}


def rederive(result):
    """``result`` (a ``LadderResult`` read from a file) with the derived fields this module owns
    recomputed from its raw data, in place; the verdicts and regimes are then derived again
    by ``result.finalize()``. Returns ``result``."""
    for r in result.rungs:
        if r.profile is not None:
            r.profile = r.profile.recategorized()
        if r.kernels:
            r.kernels = reread_report(r.kernels, result.framework)
    return result.finalize()
