"""The PyTorch attention part of ``benchmarks/fused_kernels.py`` (see there): the fused
attention kernel against the model's path and cuDNN's and flash's SDPA."""
from __future__ import annotations

from fused_kernels import Results, kernel_row, median_ms


def torch_attention(args, res: Results, ladder, cc, sync) -> None:
    """The fused attention kernel against the model's path and the SDPA backends."""
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
    if ladder.on_gpu:
        torch.cuda.empty_cache()
