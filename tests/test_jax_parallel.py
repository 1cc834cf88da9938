"""R5 on four forced CPU host devices, in a subprocess (XLA reads the device count once, at
backend start): sharded and FSDP steps give the unsharded step's losses on the same global
batch, the stream lays batches out per device, and the R5 rung records its cost model."""
import json
import os
import subprocess
import sys

import pytest

from perfladder.jax.parallel import dp_floor, fsdp_spec

SCRIPT = r'''
import json
from perfladder.jax.timer import fast_cpu_compiles
fast_cpu_compiles()
import jax, jax.numpy as jnp
from perfladder.config import get_config
from perfladder.jax import Ladder, batches
from perfladder.jax.parallel import batch_sharding, make_data_mesh, place_state, shardings_of
from perfladder.jax.rungs import r5_data_parallel

cfg = get_config("smoke")
ladder = Ladder(cfg)
mesh = make_data_mesh(4)
X, Y = next(batches(ladder.data, 4 * cfg.batch_size))          # one global batch

def losses(layout):
    model, opt = ladder.build(jnp.float32)                       # same init every time
    x, y = X, Y
    if layout:
        place_state(mesh, model, opt, fsdp=layout == "fsdp")
        x, y = jax.device_put(X, batch_sharding(mesh)), jax.device_put(Y, batch_sharding(mesh))
    return [float(ladder.step(model, opt, x, y)) for _ in range(3)], model

out = {"devices": jax.device_count()}
out["single"], _ = losses(None)
out["dp"], m = losses("dp")
out["dp_specs"] = sorted(set(shardings_of(m).values()))
out["fsdp"], m = losses("fsdp")
out["fsdp_specs"] = shardings_of(m)
Xs, _ = next(batches(ladder.data, 8, sharding=batch_sharding(mesh)))
out["stream_shards"] = sorted(tuple(s.data.shape) for s in Xs.addressable_shards)
out["r5"] = r5_data_parallel(ladder, k=4).to_dict()
print("RESULT" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def four_devices():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT"):]), proc.stdout


def test_sharded_steps_match_the_unsharded_step(four_devices):
    out, _ = four_devices
    assert out["devices"] == 4
    # fp32; only the order of the cross-device sums differs -> agreement to ~1e-7 relative
    assert out["dp"] == pytest.approx(out["single"], rel=1e-5)
    assert out["fsdp"] == pytest.approx(out["single"], rel=1e-5)
    assert out["single"][2] < out["single"][0]                  # and the steps did train


def test_layouts(four_devices):
    out, _ = four_devices
    assert out["dp_specs"] == ["P()"]                           # data parallel: all replicated
    specs = out["fsdp_specs"]
    assert specs["blks/0/ffn/dense1/kernel"] == "P(None, 'data')"   # (D, 4D): the 4D axis
    assert specs["token_emb/embedding"] == "P(None, 'data')"        # (28, D): 28 % 4 == 0, D larger
    assert all("data" in s for p, s in specs.items() if "kernel" in p)
    assert out["stream_shards"] == [[2, 16]] * 4                # batch 8 split four ways


def test_r5_rung_records_the_cost_model_before_measuring(four_devices):
    out, stdout = four_devices
    r5 = out["r5"]
    assert r5["kind"] == "multi-gpu" and r5["tokens_per_s"] > 0
    assert r5["batch_size"] == 4 * 32 and r5["precision"] == "bf16"
    cost = r5["extra"]["cost_model"]
    assert cost["k"] == 4 and cost["floor_tokens_per_s"] <= cost["ceiling_tokens_per_s"]
    printed = stdout.index("R5 cost model (k=4)")
    assert printed < stdout.index("RESULT")


def test_cost_model_and_fsdp_spec_by_hand():
    c = dp_floor(k=2, num_params=1_000_000, tokens_per_step=1000, t_compute=0.01, bandwidth=1e9)
    assert c["grad_bytes"] == 4_000_000
    assert c["t_comm_s"] == pytest.approx(2 * 0.5 * 4e6 / 1e9)   # ring: 2(k-1)/k of the bytes
    assert c["floor_tokens_per_s"] == pytest.approx(2 * 1000 / (0.01 + 0.004))
    assert c["ceiling_tokens_per_s"] == pytest.approx(2 * 1000 / 0.01)
    assert tuple(fsdp_spec((512, 2048), 4)) == (None, "data")
    assert tuple(fsdp_spec((28, 512), 3)) == ()                  # neither axis divides by 3
    assert tuple(fsdp_spec((30, 512), 3)) == ("data", None)
