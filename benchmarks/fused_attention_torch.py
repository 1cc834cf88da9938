"""The PyTorch attention part of ``benchmarks/fused_kernels.py`` (see there): the fused
attention kernel against the model's path, and its launch configurations
(``--attention-configs``)."""
from __future__ import annotations

from fused_kernels import Results, kernel_row, median_ms

# tried by a bare --attention-configs: part:block_m/block_n/num_warps, the defaults first
# (their registers for sm_90a: perfladder/torch/fused/attention.py)
TORCH_ATTENTION_SWEEP = ("fwd:64/32/4", "fwd:64/64/4", "fwd:64/16/4", "fwd:64/32/8", "fwd:64/64/8",
                         "fwd:128/64/8", "fwd:128/32/8",
                         "bwd:64/16/8", "bwd:64/16/4", "bwd:64/32/8", "bwd:64/32/4", "bwd:64/64/8",
                         "bwd:64/64/4", "bwd:128/16/8", "bwd:128/32/8")
MATCH_REL = 1e-2     # a configuration's bf16 output against the default's: summation order only


def torch_attention(args, res: Results, ladder, cc, sync) -> None:
    """The fused attention kernel against the model's path, and its launch configurations."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from perfladder.torch.fused import attention as fattn
    from perfladder.torch.model import rope_angles, rotate
    g, B, T, dev = ladder.gpt_config, args.batch, ladder.config.num_steps, ladder.device
    D, H, Dh = g.num_hiddens, g.num_heads, g.head_dim
    cos, sin = rope_angles(T, Dh, g.rope_base, dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    qkv = (2 * torch.randn(B, T, 3 * D, device=dev, generator=gen)).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(B, T, D, device=dev, generator=gen).to(torch.bfloat16)
    fwd_bwd = lambda f: lambda: torch.autograd.grad(f(qkv), qkv, dy)  # noqa: E731

    def model_path(backend=None):      # CausalAttention's unfused forward, from W_qkv's output
        def f(x):
            q, k, v = (u.reshape(B, T, H, Dh) for u in x.split(D, dim=-1))
            q, k, v = (u.transpose(1, 2) for u in (rotate(q, cos, sin), rotate(k, cos, sin), v))
            if backend is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=Dh ** -0.5)
            else:
                with sdpa_kernel(backend):
                    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=Dh ** -0.5)
            return y.transpose(1, 2).reshape(B, T, D)
        return cc(f)

    fused = lambda x: fattn.rope_attention(x, cos, sin, H)  # noqa: E731
    row = B * T * 2
    nbytes = row * 3 * D + row * D + (row * 3 * D + 2 * row * D + row * 3 * D) + 2 * B * H * T * 4
    try:   # fwd: read qkv, write y (+ lse); bwd: read qkv, y, dy (+ lse), write d(qkv)
        ref = model_path()
        res.put("kernels", "attention", kernel_row(
            lambda: ref(qkv), fwd_bwd(ref), lambda: fused(qkv), fwd_bwd(fused), sync, args.reps,
            nbytes=nbytes))
    except Exception as e:
        res.error("kernel attention", e)
    if ladder.on_gpu:
        backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
        for name, backend in backends.items():
            try:
                ref = model_path(backend)
                res.put("kernels", f"attention_ref_{name}", {
                    "fwd_ms": median_ms(lambda: ref(qkv), sync, args.reps),
                    "fwd_bwd_ms": median_ms(fwd_bwd(ref), sync, args.reps)})
            except Exception as e:
                res.error(f"kernel attention_ref_{name}", e)
        try:
            q, k, v = (torch.randn(B, H, T, Dh, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
                       for _ in range(3))
            dyh = dy.reshape(B, T, H, Dh).transpose(1, 2)

            def sdpa():
                with sdpa_kernel(backends["cudnn"]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=Dh ** -0.5)
            res.put("kernels", "attention_sdpa_cudnn", {
                "fwd_ms": median_ms(sdpa, sync, args.reps),
                "fwd_bwd_ms": median_ms(lambda: torch.autograd.grad(sdpa(), (q, k, v), dyh), sync, args.reps)})
        except Exception as e:
            res.error("kernel attention_sdpa_cudnn", e)
    if args.attention_configs:
        attention_sweep(args, res, fattn, qkv.detach(), dy, cos, sin, H, sync)
    if ladder.on_gpu:
        torch.cuda.empty_cache()


def attention_sweep(args, res: Results, fattn, qkv, dy, cos, sin, H: int, sync) -> None:
    """Each launch configuration of ``args.attention_configs``: its kernel's ms alone and whether
    its output matches the default configuration's; then the fastest matching one per part."""
    import torch
    for section in ("attention_configs", "attention_best"):
        res.data.setdefault(section, {})
    y, lse = fattn.rope_attention_fwd(qkv, cos, sin, H)
    runs = {"fwd": lambda: fattn.rope_attention_fwd(qkv, cos, sin, H)[0],
            "bwd": lambda: fattn.rope_attention_bwd(qkv, y, dy, lse, cos, sin, H)}
    want = {part: run().float() for part, run in runs.items()}          # the default configurations'
    for spec, part, cfg in args.attention_configs:
        config = fattn.FWD if part == "fwd" else fattn.BWD
        default = dict(config)
        config.update(cfg)
        try:
            got = runs[part]().float()
            rel = ((got - want[part]).norm() / want[part].norm()).item()
            res.put("attention_configs", spec, {
                "part": part, **cfg, "rel_vs_default": rel,
                "matches_default": bool(rel < MATCH_REL),     # NaN fails
                "ms": median_ms(runs[part], sync, args.reps)})
        except Exception as e:
            res.error(f"attention config {spec}", e)
        finally:
            config.clear()
            config.update(default)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    best = {}
    for part in runs:
        rows = {k: r for k, r in res.data["attention_configs"].items() if r["part"] == part and r["matches_default"]}
        if rows:
            spec = min(rows, key=lambda k: rows[k]["ms"])
            best[part] = {"config": spec, "ms": rows[spec]["ms"],
                          **{k: rows[spec][k] for k in ("block_m", "block_n", "num_warps")}}
    res.put("attention_best", "by_part", best)


def parse_attention_configs(text: str) -> list[tuple[str, str, dict]]:
    """``'fwd:64/32/4,bwd:64/16/8'`` (or ``'sweep'``: ``TORCH_ATTENTION_SWEEP``) ->
    ``[(spec, part, {block_m, block_n, num_warps}), ...]``; ValueError naming the entry that is
    not of that form."""
    if text == "sweep":
        text = ",".join(TORCH_ATTENTION_SWEEP)
    out = []
    for spec in text.split(","):
        part, _, sizes = spec.strip().partition(":")
        fields = sizes.split("/")
        if part not in ("fwd", "bwd") or len(fields) != 3 or not all(f.isdigit() for f in fields):
            raise ValueError(f"--attention-configs entry {spec!r} is not valid; valid: "
                             f"fwd:BLOCK_M/BLOCK_N/WARPS or bwd:BLOCK_M/BLOCK_N/WARPS, e.g. fwd:64/32/4")
        out.append((spec.strip(), part, dict(zip(("block_m", "block_n", "num_warps"), map(int, fields)))))
    return out
