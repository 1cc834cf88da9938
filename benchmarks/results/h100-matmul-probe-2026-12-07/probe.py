"""Why does JAX's matmul probe read lower than PyTorch's on an H100? Times an 8192^3 bf16 matmul
several ways in JAX and in PyTorch in one process; writes JSON to argv[1]."""
import json, os, statistics, sys, time
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
from functools import partial
import jax, jax.numpy as jnp
N = 8192
FLOP = 2 * N ** 3
out = {"XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "device": jax.devices()[0].device_kind}

@partial(jax.jit, static_argnames=("inner",))
def loop(x, y, *, inner):
    return jax.lax.fori_loop(0, inner, lambda _, a: a @ y, x)

@jax.jit
def one(x, y):
    return x @ y

def med(fn, reps=7):
    jax.block_until_ready(fn())
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); jax.block_until_ready(fn()); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)

kx, ky = jax.random.split(jax.random.key(0))
x = jax.random.normal(kx, (N, N), jnp.float32).astype(jnp.bfloat16)
y_scaled = (jax.random.normal(ky, (N, N), jnp.float32) / jnp.sqrt(jnp.float32(N))).astype(jnp.bfloat16)
y_raw = jax.random.normal(ky, (N, N), jnp.float32).astype(jnp.bfloat16)
jax_rows = {}
for inner in (1, 3, 10, 30):
    jax_rows[f"loop{inner}_scaled"] = FLOP * inner / med(lambda: loop(x, y_scaled, inner=inner)) / 1e12
jax_rows["loop10_raw"] = FLOP * 10 / med(lambda: loop(x, y_raw, inner=10)) / 1e12
jax_rows["single_synced_raw"] = FLOP / med(lambda: one(x, y_raw)) / 1e12
def queued(k=20):
    r = None
    for _ in range(k):
        r = one(x, y_raw)
    return r
jax_rows["queued20_raw"] = FLOP * 20 / med(queued) / 1e12
jax_rows["hlo_custom_call"] = [l.strip()[:160] for l in one.lower(x, y_raw).compile().as_text().splitlines()
                               if "custom-call" in l or "fusion" in l][:6]
out["jax"] = jax_rows

import torch
tx = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
ty = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
tys = ty / N ** 0.5
def ev(fn, reps=10, warm=3):
    for _ in range(warm): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)
def tloop(inner, yy):
    a = tx
    for _ in range(inner):
        a = a @ yy
    return a
t_rows = {"single_raw (device probe)": FLOP / ev(lambda: tx @ ty) / 1e12}
for inner in (3, 10, 30):
    t_rows[f"loop{inner}_scaled"] = FLOP * inner / ev(lambda: tloop(inner, tys), reps=5) / 1e12
t_rows["loop10_raw_independent"] = FLOP * 10 / ev(lambda: [tx @ ty for _ in range(10)], reps=5) / 1e12
from perfladder.torch.device import probe_roofs as tprobe
from perfladder.jax.device import probe_roofs as jprobe
t_rows["perfladder.torch.device"] = tprobe()["matmul_bf16_tflops"]
out["torch"] = t_rows
out["perfladder.jax.device"] = jprobe()["matmul_bf16_tflops"]
# and JAX again after torch (clocks warm either way)
out["jax_again_loop10_scaled"] = FLOP * 10 / med(lambda: loop(x, y_scaled, inner=10)) / 1e12
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps(out, indent=1))
