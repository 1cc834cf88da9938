"""One-off probe (H200/H100): cuBLASLt FFN epilogues through nvmath-python and the attention kernels
at the full shape (batch 2048, T 128, D 512, H 8), each timed with CUDA events (median of 20 after 3).
Writes one JSON to argv[1]."""
import json, sys, traceback
import torch
import torch.nn.functional as F

out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
dev, bf = "cuda", torch.bfloat16
B, T, D, H = 2048, 128, 512, 8
M, FF = B * T, 4 * D


def bench(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return round(ts[len(ts) // 2], 4)


def part(name, f):
    try:
        out[name] = f()
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-1500:]}
    print(name, json.dumps(out[name])[:600], flush=True)


torch.manual_seed(0)
x = torch.randn(M, D, device=dev, dtype=bf)
w1 = (torch.randn(FF, D, device=dev) * 0.02).to(bf)      # FC1 (out, in)
b1 = (torch.randn(FF, device=dev) * 0.02).to(bf)
w2 = (torch.randn(D, FF, device=dev) * 0.02).to(bf)      # FC2 (out, in)
dy = torch.randn(M, D, device=dev, dtype=bf)


def ffn_reference():
    fwd = torch.compile(lambda x: (lambda h: (h, F.gelu(h, approximate="tanh")))(F.linear(x, w1, b1)))
    h, g = fwd(x)

    def dgelu(dy, h):
        hh = h.float().requires_grad_()
        return torch.autograd.grad(F.gelu(hh, approximate="tanh"), hh, (dy @ w2).float())[0]
    bwd = torch.compile(lambda dy, h: (lambda dh: (dh.to(bf), dh.sum(0)))(dgelu(dy, h)))
    r = {"fc1_gelu_ms": bench(lambda: fwd(x)), "mm_fc1_ms": bench(lambda: F.linear(x, w1, b1)),
         "fc2_dgrad_dgelu_bgrad_ms": bench(lambda: bwd(dy, h)), "mm_fc2_dgrad_ms": bench(lambda: dy @ w2)}
    r["addmm_activation_gelu_ms"] = bench(lambda: torch._addmm_activation(b1, x, w1.t(), use_gelu=True))
    ga = torch._addmm_activation(b1, x, w1.t(), use_gelu=True)
    r["addmm_activation_max_abs_diff_vs_tanh_gelu"] = float((ga.float() - g.float()).abs().max())
    return r


def ffn_nvmath():
    import nvmath
    from nvmath.linalg.advanced import Matmul, MatmulEpilog as E
    r = {"nvmath": nvmath.__version__}
    h_ref = F.linear(x, w1, b1).float()
    g_ref = F.gelu(h_ref, approximate="tanh")
    # transposed product (F, M) = w1 (F, D) @ x^T (D, M): the bias runs along the result's rows
    mm = Matmul(w1, x.t())
    mm.plan(epilog=E.GELU_AUX_BIAS, epilog_inputs={"bias": b1})
    g_t, aux = mm.execute()
    torch.cuda.synchronize()
    h_t = aux["gelu_aux"]
    r["fwd_out_shape"], r["fwd_out_stride"] = list(g_t.shape), list(g_t.stride())
    r["fwd_aux_shape"], r["fwd_aux_stride"], r["fwd_aux_dtype"] = list(h_t.shape), list(h_t.stride()), str(h_t.dtype)
    r["fwd_g_max_abs_diff"] = float((g_t.t().float() - g_ref).abs().max())
    r["fwd_h_max_abs_diff"] = float((h_t.t().float() - h_ref).abs().max())
    r["fc1_gelu_aux_bias_ms"] = bench(lambda: mm.execute())
    # FC2's input gradient, transposed: (F, M) = w2^T (F, D) @ dy^T (D, M), dgelu with h^T, bias grad over M
    mb = Matmul(w2.t(), dy.t())
    mb.plan(epilog=E.DGELU_BGRAD, epilog_inputs={"gelu_aux": h_t})
    dh_t, aux2 = mb.execute()
    torch.cuda.synchronize()
    hh = h_ref.clone().requires_grad_()
    dh_ref = torch.autograd.grad(F.gelu(hh, approximate="tanh"), hh, (dy @ w2).float())[0]
    r["bwd_keys"] = list(aux2)
    r["bwd_dh_max_abs_diff"] = float((dh_t.t().float() - dh_ref).abs().max())
    r["bwd_dh_ref_max"] = float(dh_ref.abs().max())
    bg = aux2.get("dgelu_bgrad")
    if bg is not None:
        r["bwd_bgrad_max_abs_diff"] = float((bg.float().flatten() - dh_ref.sum(0)).abs().max())
        r["bwd_bgrad_ref_max"] = float(dh_ref.sum(0).abs().max())
    r["fc2_dgrad_dgelu_bgrad_ms"] = bench(lambda: mb.execute())
    # host cost of one execute (plan reused)
    import time
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(50):
        mm.execute()
    t1 = time.perf_counter(); torch.cuda.synchronize()
    r["host_us_per_execute"] = round((t1 - t0) / 50 * 1e6, 1)
    return r


def attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from perfladder.torch.fused.attention import rope_attention
    q, k, v = (torch.randn(B, H, T, D // H, device=dev, dtype=bf, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, T, D // H, device=dev, dtype=bf)
    r = {}
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        with sdpa_kernel(be):
            f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
            r[name + "_fwd_ms"] = bench(f)
            r[name + "_fwd_bwd_ms"] = bench(lambda: torch.autograd.grad(f(), (q, k, v), do))
    qkv = torch.randn(B, T, 3 * D, device=dev, dtype=bf, requires_grad=True)
    pos = torch.arange(T, device=dev).float()
    inv = 1.0 / 10000 ** (torch.arange(0, D // H, 2, device=dev).float() / (D // H))
    ang = torch.cat([pos[:, None] * inv[None]] * 2, dim=1)
    cos, sin = ang.cos().contiguous(), ang.sin().contiguous()
    dyy = torch.randn(B, T, D, device=dev, dtype=bf)
    r["triton_rope_fwd_ms"] = bench(lambda: rope_attention(qkv, cos, sin, H))
    r["triton_rope_fwd_bwd_ms"] = bench(lambda: torch.autograd.grad(rope_attention(qkv, cos, sin, H), qkv, dyy))
    return r


part("ffn_reference", ffn_reference)
part("ffn_nvmath", ffn_nvmath)
part("attention", attention)
with open(sys.argv[1], "w") as fh:
    json.dump(out, fh, indent=1)
