"""The PyTorch part of ``benchmarks/attention_kernel.py`` (see there): the Triton attention kernel
with RoPE on load against the model's ops (inductor's RoPE + flash / cuDNN SDPA, and the RoPE
kernel + cuDNN), the FFN with GELU in its GEMMs against the compiled FFN, and the training step
with and without ``fused=('attention',)``, ``('mlp',)`` and ``residual='bf16'``."""
from __future__ import annotations

import time

from attention_kernel import CHECK_BATCH, STEP_COST_S, attention_bytes, best_of, rel
from fused_kernels import gate, median_ms

TORCH_STEPS = {   # name: GPT keywords; the first is the base the others are gated against
    "base": dict(fused=("rope", "gelu")),                        # today's fastest kernels (B9)
    "attention+bf16res": dict(fused=("gelu", "attention"), residual="bf16"),
    "attention": dict(fused=("gelu", "attention")),
    "bf16res": dict(fused=("rope", "gelu"), residual="bf16"),
    "attention+mlp+bf16res": dict(fused=("attention", "mlp"), residual="bf16"),
    "mlp": dict(fused=("rope", "mlp")),
    "all+bf16res": dict(fused=("addnorm", "attention", "mlp"), residual="bf16"),
}
# in priority order: what the time budget cuts is the tail
TORCH_DEFAULT = ("base", "attention+bf16res", "attention+mlp+bf16res", "attention", "bf16res", "mlp")
# launch configurations tried after the default (keys per step, warps, stages)
TORCH_FWD_SWEEP = [dict(block_n=32, num_warps=8, num_stages=1), dict(block_n=64, num_warps=4, num_stages=1),
                   dict(block_n=128, num_warps=8, num_stages=1)]
TORCH_BWD_SWEEP = [dict(block_n=64, num_warps=8, num_stages=1), dict(block_n=128, num_warps=8, num_stages=1)]
MLP_SWEEP = [dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
             dict(block_m=128, block_n=64, block_k=64, num_warps=4, num_stages=4)]


def ffn_part(args, res, torch, cuda: bool, dev, g, N: int, sync) -> callable:
    """The FFN (N tokens, bf16 autocast, fp32 parameters as in the model): the compiled reference
    and the fused GEMMs, checked against each other at the full size, then timed forward and
    forward+backward (gradients of x and the four parameters). Returns ``sweep()`` for the
    other GEMM configurations, run at the end."""
    import torch.nn.functional as F

    from perfladder.torch.fused import mlp as fmlp
    D, Fw = g.num_hiddens, g.ffn_mult * g.num_hiddens
    gen = torch.Generator(device=dev).manual_seed(1)
    d1, d2 = torch.nn.Linear(D, Fw).to(dev), torch.nn.Linear(Fw, D).to(dev)
    x = torch.randn(N, D, device=dev, generator=gen).requires_grad_()
    dy = torch.randn(N, D, device=dev, generator=gen).to(torch.bfloat16)
    params = (x, d1.weight, d1.bias, d2.weight, d2.bias)

    def autocast(f):
        def run(u):
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                return f(u)
        return run
    ref = autocast((torch.compile if cuda else (lambda f: f))(lambda u: d2(F.gelu(d1(u), approximate="tanh"))))
    fused = autocast(lambda u: fmlp.fused_ffn(u, d1, d2))
    nbytes = 2 * N * Fw * 2 * 3          # fused: writes h and g, reads h (the cuBLAS GEMMs not counted)

    def row(f) -> dict:
        out = {"fwd_ms": median_ms(lambda: f(x), sync, args.reps, args.warm),
               "fwd_bwd_ms": median_ms(lambda: torch.autograd.grad(f(x), params, dy), sync, args.reps, args.warm)}
        return {**out, "bwd_ms": out["fwd_bwd_ms"] - out["fwd_ms"]}

    want = []                            # the reference's y and gradients, computed once

    def check() -> dict:
        if not want:
            want.extend([ref(x).detach(), *torch.autograd.grad(ref(x), params, dy)])
        got = [fused(x).detach(), *torch.autograd.grad(fused(x), params, dy)]
        errs = {name: rel(a, b) for name, a, b in zip(("y", "dx", "dW1", "db1", "dW2", "db2"), got, want)}
        return {"rel_vs_ref": errs, "matches_reference": max(errs.values()) < 0.05}

    try:
        res.put("kernels", "ffn_inductor+cublas", row(ref))
    except Exception as e:
        res.error("kernel ffn_inductor+cublas", e)
    rows = {}

    def try_gemm(label, cfg):
        default = dict(fmlp.GEMM)
        fmlp.GEMM.update(cfg)
        try:
            rows[label] = {"gemm": dict(cfg), **check(), "epilogue_bytes": nbytes}
            rows[label].update(row(fused))
            res.put("mlp_configs", label, rows[label])
        except Exception as e:
            res.error(f"kernel ffn_fused {label}", e)
        finally:
            fmlp.GEMM.update(default)
        good = [r for r in rows.values() if r["matches_reference"]]
        if good:
            best = min(good, key=lambda r: r["fwd_bwd_ms"])
            res.put("kernels", "ffn_fused", {k: best[k] for k in ("fwd_ms", "fwd_bwd_ms", "bwd_ms", "gemm")})

    try_gemm("default", dict(fmlp.GEMM))

    def sweep():
        for cfg in MLP_SWEEP:
            if res.time_left() < 15:
                res.skip(f"kernel ffn_fused {cfg}")
                continue
            try_gemm(str(cfg), cfg)
    return sweep

# -- torch --------------------------------------------------------------------------------------
def run_torch(args, res) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from perfladder.data import TimeMachine
    from perfladder.torch import GPT, batches
    from perfladder.torch.device import versions
    from perfladder.torch.fused import attention as fattn
    from perfladder.torch.fused._launch import bf16_round_to_nearest
    from perfladder.torch.fused.rope import rope_qkv
    from perfladder.torch.model import rope_angles, rotate
    from perfladder.torch.step import make_optimizer, make_step
    from perfladder.torch.timer import sync, throughput

    cfg = args.config
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    res.data.update(versions=versions(), device=torch.cuda.get_device_name(0) if cuda else "cpu")
    data = TimeMachine(cfg.batch_size, cfg.num_steps, num_train=cfg.num_train, num_val=cfg.num_val)
    g = cfg.gpt(vocab_size=len(data.vocab))
    B, T, D, H, Dh = args.batch, cfg.num_steps, g.num_hiddens, g.num_heads, g.head_dim
    bf = torch.bfloat16
    cos, sin = rope_angles(T, Dh, g.rope_base, dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    qkv = (2 * torch.randn(B, T, 3 * D, device=dev, generator=gen)).to(bf).requires_grad_()
    dy = torch.randn(B, T, D, device=dev, generator=gen).to(bf)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION} if cuda \
        else {"math": SDPBackend.MATH}

    def reference(backend, rope_kernel=False):
        def f(x):                                                  # x (B, T, 3D)
            b, t = x.shape[:2]
            if rope_kernel:
                q, k, v = rope_qkv(x, cos, sin, H)                 # (b, t, H, Dh) each
            else:
                q, k, v = (u.reshape(b, t, H, Dh) for u in x.split(D, dim=-1))
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            q, k, v = (u.transpose(1, 2) for u in (q, k, v))       # (b, H, t, Dh)
            with sdpa_kernel(backend):
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                     scale=Dh ** -0.5)
            return y.transpose(1, 2).reshape(b, t, D)              # (b, t, D)
        return f

    fused = lambda x: fattn.rope_attention(x, cos, sin, H)  # noqa: E731
    fwd_bytes, bwd_bytes = attention_bytes(B, T, D, H)
    res.data["shapes"] = dict(B=B, T=T, D=D, H=H, Dh=Dh, dtype="bfloat16")
    res.data["fused_bytes"] = {"fwd": fwd_bytes, "bwd": bwd_bytes}

    def timings(f) -> dict:
        def fb():
            torch.autograd.grad(f(qkv), qkv, dy)
        out = {"fwd_ms": median_ms(lambda: f(qkv), sync, args.reps, args.warm),
               "fwd_bwd_ms": median_ms(fb, sync, args.reps, args.warm)}
        out["bwd_ms"] = out["fwd_bwd_ms"] - out["fwd_ms"]
        return out

    # 1. correctness: float64 on a slice of the batch, and the whole batch against the reference
    ref_name = next(iter(backends))
    ref = reference(backends[ref_name])
    try:
        x = qkv.detach()[:CHECK_BATCH].clone().requires_grad_()
        x64 = x.detach().double().requires_grad_()
        xr = x.detach().clone().requires_grad_()
        g64 = dy[:CHECK_BATCH]
        c64, s64 = cos.double(), sin.double()

        def exact_f(u):            # the model's ops in float64 (the rotation fp32 inside, as defined)
            b, t = u.shape[:2]
            q, k, v = (w.reshape(b, t, H, Dh) for w in u.split(D, dim=-1))
            q, k = rotate(q, c64, s64), rotate(k, c64, s64)
            q, k, v = (w.transpose(1, 2) for w in (q, k, v))
            with sdpa_kernel(SDPBackend.MATH):                     # float64: the math kernel
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                     scale=Dh ** -0.5)
            return y.transpose(1, 2).reshape(b, t, D)
        exact = exact_f(x64)
        exact.backward(g64.double())
        with bf16_round_to_nearest():              # CPU: the interpreter rounds as a GPU does
            yf = fused(x)
            yf.backward(g64)
        yr = ref(xr)
        yr.backward(g64)
        check = {"fused_fwd_rel": rel(yf, exact), "fused_bwd_rel": rel(x.grad, x64.grad),
                 f"{ref_name}_fwd_rel": rel(yr, exact), f"{ref_name}_bwd_rel": rel(xr.grad, x64.grad)}
        yf, yr = fused(qkv), ref(qkv)                              # the whole batch
        gf, gr = (torch.autograd.grad(y, qkv, dy)[0] for y in (yf, yr))
        check.update(full_batch_fwd_rel_vs_ref=rel(yf, yr), full_batch_bwd_rel_vs_ref=rel(gf, gr))
        check["passed"] = bool(check["fused_fwd_rel"] <= 1.5 * check[f"{ref_name}_fwd_rel"] + 1e-3
                               and check["fused_bwd_rel"] <= 1.5 * check[f"{ref_name}_bwd_rel"] + 1e-3
                               and check["full_batch_fwd_rel_vs_ref"] < 0.05
                               and check["full_batch_bwd_rel_vs_ref"] < 0.05)
        res.put("checks", "attention", check)
    except Exception as e:
        res.error("check attention", e)

    # 2. kernels (references computed once, for every launch configuration's check)
    cc = (lambda f: torch.compile(f)) if cuda else (lambda f: f)    # CPU smoke: eager references
    last = list(backends)[-1]
    eager_refs = {f"rope_kernel+{last}": lambda: reference(backends[last], rope_kernel=True)}
    compiled_refs = {f"inductor_rope+{n}": (lambda b=b: cc(reference(b))) for n, b in backends.items()}

    def time_refs(refs: dict) -> None:
        for name, make in refs.items():
            if res.time_left() < 15:
                res.skip(f"kernel {name}")
                continue
            try:
                res.put("kernels", name, timings(make()))
            except Exception as e:
                res.error(f"kernel {name}", e)
    default_fwd, default_bwd = dict(fattn.FWD), dict(fattn.BWD)
    rows = {}
    y_ref = ref(qkv).detach()
    g_ref = torch.autograd.grad(ref(qkv), qkv, dy)[0]

    def try_configs(tried) -> None:
        """Time the fused kernels under each (label, forward config, backward config), each
        checked against the reference at the full batch first."""
        for label, fcfg, bcfg in tried:
            if res.time_left() < 20:
                res.skip(f"kernel fused {label}")
                continue
            fattn.FWD.update(fcfg)
            fattn.BWD.update(bcfg)
            try:
                y = fused(qkv)
                gq = torch.autograd.grad(y, qkv, dy)[0]            # compiles both kernels
                ok = rel(y, y_ref) < 0.05 and rel(gq, g_ref) < 0.05
                row = {"fwd": dict(fcfg), "bwd": dict(bcfg), "matches_reference": ok, **timings(fused)}
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
    time_refs(eager_refs)

    # 3. training steps
    stream = batches(data, B, dev, seed=cfg.seed + 1)
    fixed = [next(stream) for _ in range(args.gate_steps)]
    ref_losses = None

    def run_steps(names) -> None:
        for name in names:
            if res.time_left() < (STEP_COST_S["torch"] if cuda else 5):
                res.skip(f"step {name}")
                continue
            run_step(name)

    def run_step(name: str) -> None:
        nonlocal ref_losses
        step = None
        try:
            torch.manual_seed(cfg.seed)
            model = GPT(g, embed="onehot", **TORCH_STEPS[name]).to(dev)
            step = make_step(model, make_optimizer(model, cfg.lr, "fused" if cuda else "default"),
                             compiled=cuda, bf16=True, device_type=dev.type,
                             mode="reduce-overhead" if cuda else None)
            t0 = time.perf_counter()
            losses = torch.stack([step(X, Y) for X, Y in fixed]).float().cpu().tolist()
            verdict = gate(losses, ref_losses)
            if ref_losses is None:
                ref_losses = losses
            row = {**{k: list(v) if isinstance(v, tuple) else v for k, v in TORCH_STEPS[name].items()},
                   "gate": verdict, "first_steps_s": time.perf_counter() - t0}
            if verdict["passed"]:
                tp = throughput(step, stream, warmup=args.warmup, timed=args.timed, windows=args.windows)
                row.update(tokens_per_s=tp.tokens_per_s, spread=tp.spread, step_ms=1e3 * tp.step_time_s)
            res.put("steps", name, row)
        except Exception as e:
            res.error(f"step {name}", e)
        finally:
            del step
            torch._dynamo.reset()
            if cuda:
                torch.cuda.empty_cache()

    # in priority order: the base and the headline configuration, the compiled references, the
    # FFN, the other steps, the other launch configurations -- what the budget cuts is the tail
    run_steps(args.torch_configs[:2])
    time_refs(compiled_refs)
    ffn_sweep = ffn_part(args, res, torch, cuda, dev, g, B * T, sync)
    if cuda:
        torch.cuda.empty_cache()
    run_steps(args.torch_configs[2:])
    if not args.no_sweep:
        try_configs([(f"fwd {c}", c, default_bwd) for c in TORCH_FWD_SWEEP]
                    + [(f"bwd {c}", default_fwd, c) for c in TORCH_BWD_SWEEP])
        ffn_sweep()


