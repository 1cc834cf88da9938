"""Attention kernels on the model's shapes: every SDPA backend timed alone (rung B7's evidence)."""
from __future__ import annotations

import contextlib
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from perfladder.torch.model import ATTN_BACKENDS
from perfladder.torch.timer import sync

BACKENDS = ("flash", "efficient", "cudnn", "math")   # the SDPA kernels B7 measures


def attention_backends(lab, batch_size: int, reps: int | None = None) -> dict:
    """Causal SDPA forward + backward on the model's q/k/v shape in bf16, for PyTorch's own
    choice ('default') and each of ``BACKENDS`` pinned: ``{name: {"available", "ms" | "error"}}``."""
    c = lab.gpt_config
    B, H, T, Dh = batch_size, c.num_heads, lab.config.num_steps, c.head_dim
    reps = reps or (20 if lab.on_gpu else 5)
    gen = torch.Generator(device=lab.device).manual_seed(lab.config.seed)
    q, k, v = (torch.randn(B, H, T, Dh, device=lab.device, dtype=torch.bfloat16,
                           generator=gen).requires_grad_() for _ in range(3))   # (B, H, T, Dh)
    dy = torch.randn(B, H, T, Dh, device=lab.device, dtype=torch.bfloat16, generator=gen)
    scale = 1.0 / Dh ** 0.5

    def call():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        torch.autograd.grad(y, (q, k, v), dy)

    out = {}
    picks = default_choice(q, k, v, scale)
    for name in ("default", *BACKENDS):
        ctx = contextlib.nullcontext() if name == "default" else sdpa_kernel(ATTN_BACKENDS[name])
        try:
            with ctx, warnings.catch_warnings():
                warnings.simplefilter("ignore")            # a refusal's reasons come as warnings
                call()
                sync()
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    call()
                    sync()
                    times.append(time.perf_counter() - t0)
            times.sort()
            out[name] = {"available": True, "ms": 1e3 * times[len(times) // 2]}
        except RuntimeError as e:
            out[name] = {"available": False, "error": str(e).strip().splitlines()[0][:300]}
    out["default"]["picks"] = picks
    return out


def default_choice(q, k, v, scale) -> str | None:
    """The backend PyTorch's own priority picks for these inputs (causal), by name; None when
    this torch cannot say (``torch._fused_sdp_choice`` is internal)."""
    by_value = {int(b.value): n for n, b in ATTN_BACKENDS.items() if b is not None}
    try:
        return by_value.get(int(torch._fused_sdp_choice(q, k, v, is_causal=True, scale=scale)))
    except (AttributeError, RuntimeError, TypeError):
        return None


def pick_backend(timings: dict) -> str:
    """The fastest available pinned backend in ``attention_backends``' output."""
    ok = {n: t["ms"] for n, t in timings.items() if n in BACKENDS and t.get("available")}
    if not ok:
        raise RuntimeError(f"no attention backend could run: {timings}")
    return min(ok, key=ok.get)
