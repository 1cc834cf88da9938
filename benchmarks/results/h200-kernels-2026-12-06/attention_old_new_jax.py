"""The Pallas attention pair before (commit 49bb6a2) and after, jitted, at the full shape (batch
argv[2], default 2048): forward and forward+backward, median of 20 after 3 (block_until_ready).
JSON to argv[1]."""
import json, sys, time
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import jax
import jax.numpy as jnp
import numpy as np
import old_attention_jax
from perfladder.jax.fused import attention as new_attention

B = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
T, D, H = 128, 512, 8


def bench(f, *a, reps=20, warm=3):
    for _ in range(warm):
        jax.block_until_ready(f(*a))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t0)
    return round(sorted(ts)[len(ts) // 2] * 1e3, 4)


k1, k2 = jax.random.split(jax.random.key(0))
qkv = jax.random.normal(k1, (B, T, 3 * D), jnp.bfloat16)
dy = jax.random.normal(k2, (B, T, D), jnp.bfloat16)
pos = np.arange(T, dtype=np.float32)
inv = 1.0 / 10000 ** (np.arange(0, D // H, 2, dtype=np.float32) / (D // H))
ang = np.concatenate([pos[:, None] * inv[None]] * 2, axis=1)
cos, sin = jnp.asarray(np.cos(ang)), jnp.asarray(np.sin(ang))
out = {"device": str(jax.devices()[0].device_kind), "batch": B,
       "new_FWD": new_attention.FWD, "new_BWD": new_attention.BWD}
ys = {}
for name, mod in (("old", old_attention_jax), ("new", new_attention)):
    fwd = jax.jit(lambda q: mod.rope_attention(q, cos, sin, H))
    fb = jax.jit(lambda q, g: jax.vjp(lambda x: mod.rope_attention(x, cos, sin, H), q)[1](g)[0])
    out[name + "_fwd_ms"] = bench(fwd, qkv)
    out[name + "_fwd_bwd_ms"] = bench(fb, qkv, dy)
    ys[name] = (np.asarray(fwd(qkv), np.float32), np.asarray(fb(qkv, dy), np.float32))
out["new_vs_old_max_abs_y"] = float(np.abs(ys["new"][0] - ys["old"][0]).max())
out["new_vs_old_max_abs_dqkv"] = float(np.abs(ys["new"][1] - ys["old"][1]).max())
print(json.dumps(out))
json.dump(out, open(sys.argv[1], "w"), indent=1)
