"""The JAX attention kernel (``perfladder.jax.fused.attention``) in ``fused_kernels.py --framework
jax --parts kernels``: timed against the model's own attention, and its launch configurations
swept (``--attention-configs``).

``kernels["attention"]``: the reference is the model's path from the QKV projection to ``W_o``'s
input (split, RoPE on q and k, ``jax.nn.dot_product_attention(implementation='xla')``, heads
merged), and on a GPU the same with cuDNN's attention (rung B4's); the fused kernel under the
module's launch configuration; forward alone and forward + backward, bf16, the full model's
shape at the batch given.

``attention_configs``: each named configuration changes one kernel's launch parameters (the
other keeps the module's): a ``fwd-*`` one is judged by its forward's ms, a ``bwd-*`` one by
forward + backward (the forward the module's); ``attention_best`` names the fastest of each,
ready to paste into ``FWD`` / ``BWD``. A configuration that fails (a GPU's shared memory, a
compile) is recorded with its error and the sweep goes on. The candidates compiled for sm_90a
without register spills (Triton 3.6, tests/jax/test_fused_attention.py's route) except where
said.

jax is imported inside the functions: the script's ``main`` reads the configurations' names
before any framework is loaded.
"""
from __future__ import annotations

# (block_m, block_n, num_warps, num_stages) of the forward; (block, inner, num_warps,
# num_stages) of the backward. Registers per thread on sm_90a in the comments.
_FWD = ((64, 64, 4, 2),     # 127: the module's
        (64, 64, 4, 1),     # 147
        (64, 64, 8, 2),     # 120
        (64, 32, 4, 2),     # 122
        (64, 32, 8, 1),     # 84
        (128, 64, 8, 2),    # 127: one program per head at T=128, the diagonal tile half masked
        (128, 32, 8, 1),    # 123
        (128, 128, 8, 1))   # 172
_BWD = ((64, 32, 4, 2),     # 255: the module's
        (64, 32, 4, 1),     # 237
        (64, 32, 4, 3),     # 255
        (64, 32, 8, 1),     # 168
        (64, 32, 8, 2),     # 176
        (64, 64, 8, 1),     # 255
        (64, 64, 8, 2),     # 255
        (64, 64, 4, 1),     # 255 and an 8-byte spill
        (128, 32, 8, 1))    # 240: one program per head at T=128

ATTENTION_CONFIGS = {
    **{f"fwd-{m}x{n}-w{w}-s{s}": ("fwd", dict(block_m=m, block_n=n, num_warps=w, num_stages=s))
       for m, n, w, s in _FWD},
    **{f"bwd-{b}x{i}-w{w}-s{s}": ("bwd", dict(block=b, inner=i, num_warps=w, num_stages=s))
       for b, i, w, s in _BWD},
}


def check_attention_configs(value: str | None) -> list[str]:
    """The configurations ``--attention-configs`` names ('all': every one); a ValueError naming
    the bad ones and the valid choices."""
    if value is None:
        return []
    names = list(ATTENTION_CONFIGS) if value == "all" else value.split(",")
    bad = [n for n in names if n not in ATTENTION_CONFIGS]
    if bad:
        raise ValueError(f"--attention-configs {bad} not valid; valid choices: all, "
                         f"{', '.join(ATTENTION_CONFIGS)}")
    return names


def _model_attention(impl: str, H: int):
    """The model's attention path from the (B, T, 3D) projection to W_o's input."""
    import jax
    import jax.numpy as jnp

    from perfladder.jax.model import rope

    def attention(qkv):
        B, T, D3 = qkv.shape
        q, k, v = (u.reshape(B, T, H, D3 // 3 // H) for u in jnp.split(qkv, 3, axis=-1))
        y = jax.nn.dot_product_attention(rope(q), rope(k), v, is_causal=True, implementation=impl)
        return y.reshape(B, T, D3 // 3)
    return attention


def time_attention(args, res, ladder, kernel_row, median_ms) -> None:
    """``kernels["attention"]``, then the sweep of ``args.attention_configs``."""
    import jax
    import jax.numpy as jnp

    from perfladder.jax.fused import attention as fattn
    from perfladder.jax.model import rope_tables

    g, B, T = ladder.gpt_config, args.batch, ladder.config.num_steps
    H, D, Dh = g.num_heads, g.num_hiddens, g.head_dim
    k = jax.random.split(jax.random.key(1), 2)
    qkv = jax.random.normal(k[0], (B, T, 3 * D), jnp.bfloat16)
    dy = jax.random.normal(k[1], (B, T, D), jnp.bfloat16)
    cos, sin = rope_tables(T, Dh, float(g.rope_base))
    sync = jax.effects_barrier

    def timed(f):
        """jitted forward and forward + backward of ``f`` as zero-argument calls (a new trace
        for each ``f``: the kernels read their launch parameters while traced)."""
        fwd = jax.jit(f)
        fwd_bwd = jax.jit(lambda x, d: jax.vjp(f, x)[1](d))
        return (lambda: jax.block_until_ready(fwd(qkv))), (lambda: jax.block_until_ready(fwd_bwd(qkv, dy)))

    def fused(x):
        return fattn.rope_attention(x, cos, sin, H)

    N, a = B * T, 2
    lse_bytes = B * H * T * 4
    # forward: qkv in, y and the logsumexp out; backward: qkv, y, dy, logsumexp in, d(qkv) out
    nbytes = (4 + 8) * N * D * a + 2 * lse_bytes
    try:
        row = kernel_row(*timed(_model_attention("xla", H)), *timed(fused), sync, args.reps, nbytes)
        row["reference"] = "split + RoPE + jax.nn.dot_product_attention(implementation='xla') + merge"
        row["launch"] = {"FWD": dict(fattn.FWD), "BWD": dict(fattn.BWD)}
        if ladder.on_gpu:
            try:
                cf, cfb = timed(_model_attention("cudnn", H))
                row["cudnn_fwd_ms"], row["cudnn_fwd_bwd_ms"] = median_ms(cf, sync, args.reps), median_ms(cfb, sync, args.reps)
                row["speedup_fwd_bwd_vs_cudnn"] = row["cudnn_fwd_bwd_ms"] / row["fused_fwd_bwd_ms"]
            except Exception as e:                 # a cuDNN without this attention: said, not fatal
                row["cudnn_error"] = f"{type(e).__name__}: {e}"[:500]
        else:
            row["cudnn_error"] = "cuDNN attention needs a GPU"
        res.put("kernels", "attention", row)
    except Exception as e:
        res.error("kernel attention", e)
        return

    if not args.attention_configs:
        return
    res.data.setdefault("attention_configs", {})
    for name in args.attention_configs:
        side, params = ATTENTION_CONFIGS[name]
        table = fattn.FWD if side == "fwd" else fattn.BWD
        saved = dict(table)
        table.update(params)
        try:
            f, fb = timed(lambda x: fattn.rope_attention(x, cos, sin, H))
            out = {"side": side, "launch": dict(params), "fwd_ms": median_ms(f, sync, args.reps)}
            if side == "bwd":
                out["fwd_bwd_ms"] = median_ms(fb, sync, args.reps)
        except Exception as e:                     # one configuration's failure is its result
            out = {"side": side, "launch": dict(params), "error": f"{type(e).__name__}: {e}"[:1500]}
        finally:
            table.clear()
            table.update(saved)
        res.put("attention_configs", name, out)
    res.data["attention_best"] = best_attention_configs(res.data["attention_configs"])
    res.save()


def best_attention_configs(rows: dict) -> dict:
    """The fastest measured configuration of each kernel: {'FWD': ..., 'BWD': ...} (name, launch
    parameters and ms), a kernel with none measured left out."""
    best = {}
    for side, key, metric in (("fwd", "FWD", "fwd_ms"), ("bwd", "BWD", "fwd_bwd_ms")):
        ok = [(r[metric], n, r["launch"]) for n, r in rows.items() if r["side"] == side and metric in r]
        if ok:
            ms, name, launch = min(ok, key=lambda t: t[0])
            best[key] = {"name": name, "launch": launch, metric: ms}
    return best

