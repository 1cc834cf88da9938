"""The JAX attention part of ``benchmarks/fused_kernels.py`` (see there): the fused attention
kernel (``perfladder.jax.fused.attention``) against the model's path, and its launch
configurations (``--attention-configs``).

``kernels["attention"]``: the reference is the model's path from the QKV projection to
``W_o``'s input (split, RoPE on q and k, ``jax.nn.dot_product_attention(implementation='xla')``,
heads merged), jitted, against the fused kernel under the module's launch configuration
(``launch``), forward alone and forward + backward; on a GPU also the model's path under cuDNN's
attention (rung B4's), ``kernels["attention_ref_cudnn"]``. ``kernels["attention_bias"]``: the
same kernels given the projection with its bias added by XLA (B8) against the kernels adding it
on load (B12), the backward with the bias gradient.

``--attention-configs``: each configuration's kernel (forward or backward) timed alone, its
output checked against the default configuration's, into ``attention_configs``, and the fastest
matching one of each part into ``attention_best`` (what ``FWD`` / ``BWD`` should become). A
configuration that fails (a GPU's shared memory, a compile) is an error of the run, recorded,
and the sweep goes on.

jax is imported inside the functions: ``main`` parses the configurations before any framework
is loaded.
"""
from __future__ import annotations

# tried by a bare --attention-configs: part:block_m/block_n/num_warps/num_stages of the
# forward, part:block/inner/num_warps/num_stages of the backward, the defaults first; registers
# per thread when compiled for sm_90a (Triton 3.6, tests/jax/test_fused_attention.py's route),
# none spilling unless said
JAX_ATTENTION_SWEEP = (
    "fwd:64/64/4/2",     # 127
    "fwd:64/64/4/1",     # 147
    "fwd:64/64/8/2",     # 120
    "fwd:64/32/4/2",     # 122
    "fwd:64/32/8/1",     # 84
    "fwd:128/64/8/2",    # 127: one program per head at T=128, its diagonal tile half masked
    "fwd:128/32/8/1",    # 123
    "fwd:128/128/8/1",   # 172
    "bwd:64/64/4/1",     # 255 and an 8-byte spill
    "bwd:64/32/4/2",     # 255
    "bwd:64/32/4/1",     # 237
    "bwd:64/32/4/3",     # 255
    "bwd:64/32/8/1",     # 168
    "bwd:64/32/8/2",     # 176
    "bwd:64/64/8/1",     # 255
    "bwd:64/64/8/2",     # 255
    "bwd:128/32/8/1",    # 240: one program per head at T=128
)
FIELDS = {"fwd": ("block_m", "block_n", "num_warps", "num_stages"),
          "bwd": ("block", "inner", "num_warps", "num_stages")}
BIAS_SUFFIX = "+bias"  # a row of B12's kernels (the bias on load) under the same launch configuration
MATCH_REL = 1e-2     # a configuration's bf16 output against the default's: summation order only


def parse_attention_configs(text: str) -> list[tuple[str, str, dict]]:
    """``'fwd:64/64/4/2,bwd:64/32/4/2'`` (or ``'sweep'``: ``JAX_ATTENTION_SWEEP``) ->
    ``[(spec, part, launch parameters), ...]``; ValueError naming the entry that is not of that
    form (blocks powers of two >= 16, as the kernels need)."""
    if text == "sweep":
        text = ",".join(JAX_ATTENTION_SWEEP)
    out = []
    for spec in text.split(","):
        spec = spec.strip()
        part, _, sizes = spec.partition(":")
        fields = sizes.split("/")
        ok = part in FIELDS and len(fields) == 4 and all(f.isdigit() for f in fields)
        if ok:
            values = [int(f) for f in fields]
            ok = all(b >= 16 and not b & (b - 1) for b in values[:2]) and values[2] > 0 and values[3] > 0
        if not ok:
            raise ValueError(f"--attention-configs entry {spec!r} is not valid; valid: "
                             f"fwd:BLOCK_M/BLOCK_N/WARPS/STAGES or bwd:BLOCK/INNER/WARPS/STAGES "
                             f"(blocks powers of two >= 16), e.g. fwd:64/64/4/2, or sweep")
        out.append((spec, part, dict(zip(FIELDS[part], values))))
    return out


def _model_path(impl: str, H: int, cos, sin):
    """CausalAttention's unfused path from W_qkv's output (B, T, 3D) to W_o's input (B, T, D)."""
    import jax
    import jax.numpy as jnp

    from perfladder.jax.model import rope

    def attention(qkv):
        B, T, D3 = qkv.shape
        q, k, v = (u.reshape(B, T, H, D3 // 3 // H) for u in jnp.split(qkv, 3, axis=-1))
        y = jax.nn.dot_product_attention(rope(q), rope(k), v, is_causal=True, implementation=impl)
        return y.reshape(B, T, D3 // 3)
    return attention


def jax_attention(args, res, ladder, kernel_row, median_ms) -> None:
    """The fused attention kernel against the model's path, and its launch configurations."""
    import jax
    import jax.numpy as jnp

    from perfladder.jax.fused import attention as fattn
    from perfladder.jax.model import rope_tables

    g, B, T = ladder.gpt_config, args.batch, ladder.config.num_steps
    H, D, Dh = g.num_heads, g.num_hiddens, g.head_dim
    k = jax.random.split(jax.random.key(1), 2)
    qkv = (2 * jax.random.normal(k[0], (B, T, 3 * D))).astype(jnp.bfloat16)
    dy = jax.random.normal(k[1], (B, T, D), jnp.bfloat16)
    cos, sin = rope_tables(T, Dh, float(g.rope_base))
    sync = jax.effects_barrier

    def calls(f):
        """``f`` jitted, forward and forward + backward, as calls that wait for their result
        (a new trace for each ``f``: the kernels read their launch parameters while traced)."""
        fwd, fwd_bwd = jax.jit(f), jax.jit(lambda x, d: jax.vjp(f, x)[1](d))
        return (lambda: jax.block_until_ready(fwd(qkv))), (lambda: jax.block_until_ready(fwd_bwd(qkv, dy)))

    row = B * T * 2
    # fwd: read qkv, write y and the logsumexp; bwd: read qkv, y, dy and the logsumexp, write d(qkv)
    nbytes = row * 3 * D + row * D + (row * 3 * D + 2 * row * D + row * 3 * D) + 2 * B * H * T * 4
    try:
        out = kernel_row(*calls(_model_path("xla", H, cos, sin)),
                         *calls(lambda x: fattn.rope_attention(x, cos, sin, H)), sync, args.reps, nbytes)
        launch = {name: dict(getattr(fattn, name)) for name in ("FWD", "FWD_BIAS", "BWD")}
        res.put("kernels", "attention", {**out, "launch": launch})
    except Exception as e:
        res.error("kernel attention", e)
    bias = jax.random.normal(jax.random.key(2), (3 * D,), jnp.bfloat16)

    def biased_calls(f):
        """``f(x, bias)`` jitted, forward and forward + backward (both gradients), as calls."""
        fwd, fwd_bwd = jax.jit(f), jax.jit(lambda x, b, d: jax.vjp(f, x, b)[1](d))
        return ((lambda: jax.block_until_ready(fwd(qkv, bias))),
                (lambda: jax.block_until_ready(fwd_bwd(qkv, bias, dy))))
    try:
        res.put("kernels", "attention_bias", kernel_row(
            *biased_calls(lambda x, b: fattn.rope_attention(x + b, cos, sin, H)),
            *biased_calls(lambda x, b: fattn.rope_attention(x, cos, sin, H, bias=b)),
            sync, args.reps, nbytes))
    except Exception as e:
        res.error("kernel attention_bias", e)
    if ladder.on_gpu:
        try:
            fwd, fwd_bwd = calls(_model_path("cudnn", H, cos, sin))
            res.put("kernels", "attention_ref_cudnn", {"fwd_ms": median_ms(fwd, sync, args.reps),
                                                       "fwd_bwd_ms": median_ms(fwd_bwd, sync, args.reps)})
        except Exception as e:
            res.error("kernel attention_ref_cudnn", e)
    if args.attention_configs:
        attention_sweep(args, res, fattn, qkv, bias, dy, cos, sin, H, sync, median_ms)


def attention_sweep(args, res, fattn, qkv, bias, dy, cos, sin, H: int, sync, median_ms) -> None:
    """Each launch configuration of ``args.attention_configs``, for B8's kernels (no bias) and for
    B12's (the QKV bias added on load, its gradient summed in the backward; rows ``SPEC+bias``):
    its kernel's ms alone and whether its output matches the default configuration's; then the
    fastest matching one per part and variant."""
    import jax
    import jax.numpy as jnp

    for section in ("attention_configs", "attention_best"):
        res.data.setdefault(section, {})
    interpret = fattn._interpret(None)
    cos, sin = jnp.asarray(cos), jnp.asarray(sin)

    def run(part, b, y, lse):
        """The part's kernel, traced now under the current launch parameters, as a call (the
        backward's on the default forward's ``y`` and ``lse``)."""
        if part == "fwd":
            f = jax.jit(lambda x, c: fattn._forward(x, c, cos, sin, H, interpret)[:1])
            return lambda: jax.block_until_ready(f(qkv, b))
        # d(qkv), and with a bias its gradient too (the sums a launch's row blocks change)
        f = jax.jit(lambda x, c, o, d, m: tuple(
            g for g in fattn._backward(x, c, o, d, m, cos, sin, H, interpret) if g is not None))
        return lambda: jax.block_until_ready(f(qkv, b, y, dy, lse))

    def rel_error(got, want) -> float:
        """The largest relative (Frobenius) difference of the outputs."""
        return max(float(jnp.linalg.norm(g.astype(jnp.float32) - w) / jnp.linalg.norm(w))
                   for g, w in zip(got, want))

    for suffix, b in (("", None), (BIAS_SUFFIX, bias)):
        y, lse = fattn._forward(qkv, b, cos, sin, H, interpret)   # lse as the backward takes it
        want = {part: [w.astype(jnp.float32) for w in run(part, b, y, lse)()]     # the defaults'
                for part in FIELDS}
        for spec, part, cfg in args.attention_configs:
            config = fattn.forward_launch(b is not None) if part == "fwd" else fattn.BWD
            default = dict(config)
            config.update(cfg)
            try:
                call = run(part, b, y, lse)
                rel = rel_error(call(), want[part])
                res.put("attention_configs", spec + suffix, {
                    "part": part, "bias": b is not None, **cfg, "rel_vs_default": rel,
                    "matches_default": bool(rel < MATCH_REL),     # NaN fails
                    "ms": median_ms(call, sync, args.reps)})
            except Exception as e:
                res.error(f"attention config {spec + suffix}", e)
            finally:
                config.clear()
                config.update(default)
    res.put("attention_best", "by_part", best_attention_configs(res.data["attention_configs"]))


def best_attention_configs(rows: dict) -> dict:
    """The fastest configuration of each part whose output matched the default's, B8's kernels
    and B12's (bias on load) apart: ``{part: {config, ms, launch parameters}}`` under ``fwd``,
    ``bwd``, ``fwd+bias``, ``bwd+bias``; a part with none left out."""
    best = {}
    for suffix, biased in (("", False), (BIAS_SUFFIX, True)):
        for part, fields in FIELDS.items():
            ok = {k: r for k, r in rows.items() if r["part"] == part and r["matches_default"]
                  and r.get("bias", False) == biased}
            if ok:
                spec = min(ok, key=lambda k: ok[k]["ms"])
                best[part + suffix] = {"config": spec, "ms": ok[spec]["ms"],
                                       **{f: ok[spec][f] for f in fields}}
    return best
