"""The JAX part of ``benchmarks/attention_kernel.py`` (see there): the Pallas attention kernel
with RoPE on load against the model's ops with cuDNN attention, and the training step with and
without ``fused=('attention',)`` and with the stream in fp32 (JAX's bf16 model already keeps a
bf16 residual stream, so ``residual='fp32'`` is what the bf16 stream is measured against here)."""
from __future__ import annotations

import time

from attention_kernel import CHECK_BATCH, STEP_COST_S, attention_bytes, best_of
from fused_kernels import gate, median_ms

JAX_STEPS = {    # name: GPT keywords (on top of bf16 compute and the fp32 embedding lookup)
    "base": dict(attn_impl="cudnn"),                                   # today's fastest (B4/B5)
    "attention": dict(fused=("attention",)),
    "fp32res": dict(attn_impl="cudnn", residual="fp32"),
    "attention+addnorm": dict(fused=("addnorm", "attention")),
}
JAX_DEFAULT = ("base", "attention", "fp32res")
JAX_FWD_SWEEP = [dict(block_n=128, num_warps=8), dict(block_n=64, num_warps=4)]
JAX_BWD_SWEEP = [dict(block_n=32, num_warps=8), dict(block_n=64, num_warps=4)]


def run_jax(args, res) -> None:
    from perfladder.jax.compiler import fast_cpu_compiles
    from perfladder.jax.device import has_gpu
    if not has_gpu():
        fast_cpu_compiles()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from perfladder.data import TimeMachine
    from perfladder.jax import GPT, batches
    from perfladder.jax.device import device_name, versions
    from perfladder.jax.fused import attention as fattn
    from perfladder.jax.model import rope, rope_tables
    from perfladder.jax.step import make_optimizer, make_split_step
    from perfladder.jax.timer import throughput

    on_gpu = jax.default_backend() == "gpu"
    impl = "cudnn" if on_gpu else "xla"          # cuDNN attention exists only on a GPU
    res.data.update(versions=versions(), device=device_name())
    cfg = args.config
    data = TimeMachine(cfg.batch_size, cfg.num_steps, num_train=cfg.num_train, num_val=cfg.num_val)
    g = cfg.gpt(vocab_size=len(data.vocab))
    B, T, D, H, Dh = args.batch, cfg.num_steps, g.num_hiddens, g.num_heads, g.head_dim
    bf, f32 = jnp.bfloat16, jnp.float32
    cos, sin = rope_tables(T, Dh, g.rope_base)
    k = jax.random.split(jax.random.key(0), 2)
    qkv = (2 * jax.random.normal(k[0], (B, T, 3 * D), f32)).astype(bf)
    dy = jax.random.normal(k[1], (B, T, D), f32).astype(bf)
    res.data["shapes"] = dict(B=B, T=T, D=D, H=H, Dh=Dh, dtype="bfloat16")
    fwd_bytes, bwd_bytes = attention_bytes(B, T, D, H)
    res.data["fused_bytes"] = {"fwd": fwd_bytes, "bwd": bwd_bytes}
    sync = lambda: None  # noqa: E731  (every call below blocks on its result)

    def reference(implementation):
        def f(x):                                                       # x (b, t, 3D)
            b, t = x.shape[:2]
            q, kk, v = (u.reshape(b, t, H, Dh) for u in jnp.split(x, 3, axis=-1))
            y = jax.nn.dot_product_attention(rope(q), rope(kk), v, is_causal=True,
                                             implementation=implementation)
            return y.reshape(b, t, D)                                   # (b, t, D)
        return f

    def fused(x):
        return fattn.rope_attention(x, cos, sin, H)

    def grad_of(f):
        return jax.jit(lambda x, gy: jax.vjp(f, x)[1](gy)[0])

    def rel(a, b) -> float:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    def timings(f) -> dict:
        fwd, fb = jax.jit(f), grad_of(f)
        out = {"fwd_ms": median_ms(lambda: jax.block_until_ready(fwd(qkv)), sync, args.reps, args.warm),
               "fwd_bwd_ms": median_ms(lambda: jax.block_until_ready(fb(qkv, dy)), sync, args.reps, args.warm)}
        out["bwd_ms"] = out["fwd_bwd_ms"] - out["fwd_ms"]
        return out

    ref = reference(impl)
    # 1. correctness: against the model's ops in fp32 at HIGHEST precision, and at the full batch
    try:
        x, gx = qkv[:CHECK_BATCH], dy[:CHECK_BATCH]
        with jax.default_matmul_precision("highest"):
            exact_f = reference("xla")
            ey = jax.jit(exact_f)(x.astype(f32))
            eg = grad_of(exact_f)(x.astype(f32), gx.astype(f32))
        check = {"fused_fwd_rel": rel(jax.jit(fused)(x), ey), "fused_bwd_rel": rel(grad_of(fused)(x, gx), eg),
                 f"{impl}_fwd_rel": rel(jax.jit(ref)(x), ey), f"{impl}_bwd_rel": rel(grad_of(ref)(x, gx), eg),
                 "full_batch_fwd_rel_vs_ref": rel(jax.jit(fused)(qkv), jax.jit(ref)(qkv)),
                 "full_batch_bwd_rel_vs_ref": rel(grad_of(fused)(qkv, dy), grad_of(ref)(qkv, dy))}
        check["passed"] = bool(check["fused_fwd_rel"] <= 1.5 * check[f"{impl}_fwd_rel"] + 1e-3
                               and check["fused_bwd_rel"] <= 1.5 * check[f"{impl}_bwd_rel"] + 1e-3
                               and check["full_batch_fwd_rel_vs_ref"] < 0.05
                               and check["full_batch_bwd_rel_vs_ref"] < 0.05)
        res.put("checks", "attention", check)
    except Exception as e:
        res.error("check attention", e)

    # 2. kernels
    try:
        res.put("kernels", f"xla_rope+{impl}", timings(ref))
    except Exception as e:
        res.error(f"kernel xla_rope+{impl}", e)
    default_fwd, default_bwd = dict(fattn.FWD), dict(fattn.BWD)
    rows = {}

    def try_configs(tried) -> None:
        for label, fcfg, bcfg in tried:
            if res.time_left() < 20:
                res.skip(f"kernel fused {label}")
                continue
            fattn.FWD.update(fcfg)
            fattn.BWD.update(bcfg)
            try:
                f = lambda x: fattn.rope_attention(x, cos, sin, H)  # noqa: E731  (a fresh trace per config)
                ok = (rel(jax.jit(f)(qkv), jax.jit(ref)(qkv)) < 0.05
                      and rel(grad_of(f)(qkv, dy), grad_of(ref)(qkv, dy)) < 0.05)
                row = {"fwd": dict(fcfg), "bwd": dict(bcfg), "matches_reference": ok, **timings(f)}
                row["fwd_gbps"] = fwd_bytes / row["fwd_ms"] / 1e6
                row["bwd_gbps"] = bwd_bytes / max(row["bwd_ms"], 1e-9) / 1e6
                rows[label] = row
                res.put("fused_configs", label, row)
            except Exception as e:
                res.error(f"kernel fused {label}", e)
            finally:
                fattn.FWD.update(default_fwd)
                fattn.BWD.update(default_bwd)
        best_of(res, rows)

    try_configs([("default", default_fwd, default_bwd)])

    # 3. training steps
    stream = batches(data, B, seed=cfg.seed + 1)
    fixed = [next(stream) for _ in range(args.gate_steps)]
    ref_losses = None
    for name in args.jax_configs:
        if res.time_left() < (STEP_COST_S["jax"] if on_gpu else 5):
            res.skip(f"step {name}")
            continue
        try:
            kw = dict(JAX_STEPS[name])
            if kw.get("attn_impl") == "cudnn" and not on_gpu:
                kw["attn_impl"] = None
            model = GPT(g, rngs=nnx.Rngs(cfg.seed), dtype=bf, param_dtype=f32, embed_fp32=True, **kw)
            step = make_split_step(model, make_optimizer(model, cfg.lr))
            t0 = time.perf_counter()
            losses = [float(step(X, Y)) for X, Y in fixed]
            verdict = gate(losses, ref_losses)
            if ref_losses is None:
                ref_losses = losses
            row = {**{k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()},
                   "gate": verdict, "first_steps_s": time.perf_counter() - t0}
            if verdict["passed"]:
                tp = throughput(step, stream, warmup=args.warmup, timed=args.timed, windows=args.windows)
                row.update(tokens_per_s=tp.tokens_per_s, spread=tp.spread, step_ms=1e3 * tp.step_time_s)
            res.put("steps", name, row)
            del step, model
        except Exception as e:
            res.error(f"step {name}", e)

    # 4. the other launch configurations, when there is time
    if not args.no_sweep:
        try_configs([(f"fwd {c}", c, default_bwd) for c in JAX_FWD_SWEEP]
                    + [(f"bwd {c}", default_fwd, c) for c in JAX_BWD_SWEEP])
