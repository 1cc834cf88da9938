"""A rung's shapes and dtypes, read from its recorded recipe (framework-free): the one place
the figures turn a torch or JAX recipe into a ``perfladder.kernels.roofline.Workload``."""
from __future__ import annotations

from perfladder.kernels.roofline import Roofs, Workload
from perfladder.pages.claims import config_of
from perfladder.results.record import LadderResult, RungResult


def is_bf16(recipe: dict) -> bool:
    """torch recipes say ``bf16: True``; JAX recipes ``dtype: 'bfloat16'``."""
    return bool(recipe.get("bf16")) or recipe.get("dtype") == "bfloat16"


def workload(result: LadderResult, r: RungResult) -> Workload:
    """What ``r``'s step computes: the run's model at ``r``'s batch, precision, residual stream
    (fp32 under PyTorch autocast unless ``residual='bf16'``; the compute dtype in JAX) and
    embedding."""
    cfg = config_of(result)
    gpt = cfg.gpt()
    rec = r.recipe or {}
    bf16 = is_bf16(rec)
    stream_fp32 = (not bf16) or (result.framework == "torch" and rec.get("residual", "fp32") != "bf16")
    return Workload(batch=int(rec.get("batch_size") or cfg.batch_size), seq=cfg.num_steps,
                    width=gpt.num_hiddens, heads=gpt.num_heads, blocks=gpt.num_blks,
                    vocab=gpt.vocab_size, ffn_mult=gpt.ffn_mult, precision="bf16" if bf16 else "fp32",
                    stream_fp32=stream_fp32, embed=rec.get("embed") if rec.get("embed") in ("gather", "onehot")
                    else "gather")


def roofs_of(result: LadderResult, precision: str = "bf16") -> Roofs | None:
    """The run's own measured ceilings (``LadderResult.roofs``, the device probe of the same
    run) as ``Roofs``; ``None`` when the run probed none (a CPU run)."""
    roofs = result.roofs or {}
    key = "matmul_bf16_tflops" if precision == "bf16" else "matmul_tf32_tflops"
    if not roofs.get("copy_gbps") or not roofs.get(key):
        return None
    return Roofs(copy_bytes_per_s=1e9 * roofs["copy_gbps"], matmul_flops_per_s=1e12 * roofs[key],
                 source=roofs.get("source", ""))
