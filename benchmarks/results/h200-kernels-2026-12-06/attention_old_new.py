"""The Triton attention pair before (commit 49bb6a2, ops renamed) and after, and cuDNN SDPA, at the
full shape (batch from argv[2], default 2048), CUDA events, median of 20 after 3. JSON to argv[1]."""
import json, sys
import torch
import torch.nn.functional as F
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import old_attention
from perfladder.torch.fused import attention as new_attention

B = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
T, D, H, dev, bf = 128, 512, 8, "cuda", torch.bfloat16


def bench(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    return round(sorted(ts)[len(ts) // 2], 4)


torch.manual_seed(0)
qkv = torch.randn(B, T, 3 * D, device=dev, dtype=bf, requires_grad=True)
pos = torch.arange(T, device=dev).float()
inv = 1.0 / 10000 ** (torch.arange(0, D // H, 2, device=dev).float() / (D // H))
ang = torch.cat([pos[:, None] * inv[None]] * 2, dim=1)
cos, sin = ang.cos().contiguous(), ang.sin().contiguous()
dy = torch.randn(B, T, D, device=dev, dtype=bf)
out = {"device": torch.cuda.get_device_name(), "batch": B, "new_FWD": new_attention.FWD, "new_BWD": new_attention.BWD}
ys = {}
for name, mod in (("old", old_attention), ("new", new_attention)):
    f = lambda: mod.rope_attention(qkv, cos, sin, H)
    out[name + "_fwd_ms"] = bench(f)
    out[name + "_fwd_bwd_ms"] = bench(lambda: torch.autograd.grad(f(), qkv, dy))
    ys[name] = (f().float(), torch.autograd.grad(f(), qkv, dy)[0].float())
out["new_vs_old_max_abs_y"] = float((ys["new"][0] - ys["old"][0]).abs().max())
out["new_vs_old_max_abs_dqkv"] = float((ys["new"][1] - ys["old"][1]).abs().max())
q, k, v = (torch.randn(B, H, T, D // H, device=dev, dtype=bf, requires_grad=True) for _ in range(3))
do = torch.randn(B, H, T, D // H, device=dev, dtype=bf)
from torch.nn.attention import SDPBackend, sdpa_kernel
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    g = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out["cudnn_fwd_ms"] = bench(g)
    out["cudnn_fwd_bwd_ms"] = bench(lambda: torch.autograd.grad(g(), (q, k, v), do))
print(json.dumps(out))
json.dump(out, open(sys.argv[1], "w"), indent=1)
