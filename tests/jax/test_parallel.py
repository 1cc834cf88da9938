"""The multi-GPU rungs on four forced CPU host devices, in a subprocess (XLA reads the device
count once, at backend start): sharded and FSDP steps give the unsharded step's losses on the
same global batch, the stream lays batches out per device, and R5 writes down the cost
model's prediction before it measures."""
import json
import os
import subprocess
import sys

import pytest

from perfladder.jax.parallel.layout import fsdp_spec

SCRIPT = r'''
import json
from perfladder.jax.compiler import fast_cpu_compiles
fast_cpu_compiles()
import jax
from perfladder.config import get_config
from perfladder.jax import JaxLab, Ladder, Recipe, batches
from perfladder.jax.parallel.layout import batch_sharding, make_data_mesh, place_state, shardings_of

cfg = get_config("smoke")
lab = JaxLab(cfg)
mesh = make_data_mesh(4)
X, Y = next(batches(lab.data, 4 * cfg.batch_size))              # one global batch

def losses(layout):
    place = None if layout is None else (
        lambda model, opt: place_state(mesh, model, opt, fsdp=layout == "fsdp"))
    step = lab.build_step(Recipe(batch_size=4 * cfg.batch_size), place)   # same init every time
    x, y = X, Y
    if layout:
        x, y = jax.device_put(X, batch_sharding(mesh)), jax.device_put(Y, batch_sharding(mesh))
    return [float(step(x, y)) for _ in range(3)], step.model

out = {"devices": jax.device_count()}
out["single"], _ = losses(None)
out["dp"], m = losses("dp")
out["dp_specs"] = sorted(set(shardings_of(m).values()))
out["fsdp"], m = losses("fsdp")
out["fsdp_specs"] = shardings_of(m)
Xs, _ = next(batches(lab.data, 8, sharding=batch_sharding(mesh)))
out["stream_shards"] = sorted(tuple(s.data.shape) for s in Xs.addressable_shards)
run = Ladder(cfg)
placed = []

def page_place_state(mesh, *nodes, fsdp=False):      # a page's own cell: the library's, counted
    placed.append((mesh.devices.size, fsdp))
    place_state(mesh, *nodes, fsdp=fsdp)

out["r5"] = run.run("R5", place_state=page_place_state).to_dict()
out["placed_by_the_page"] = placed

# the all-reduce gate against an explicit data-parallel gradient: each device's own rows, then
# pmean over the devices (honest) or psum (the planted bug: k times the gradient)
from flax import nnx
from jax.sharding import PartitionSpec as P
from perfladder.jax.parallel import allreduce as ar
from perfladder.jax.step import loss_fn
from perfladder.measure.allreduce import AllReduceGateError
recipe = Recipe(batch_size=4 * cfg.batch_size)
laid = lab.model(recipe)
place_state(mesh, laid)
xg, yg = jax.device_put(X, batch_sharding(mesh)), jax.device_put(Y, batch_sharding(mesh))

def explicit(reduce):
    def grads(model, X, Y):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        def local(p, X, Y):
            g = jax.grad(lambda p: loss_fn(nnx.merge(graphdef, p, rest), X, Y))(p)
            return reduce(g, "data")
        # check_vma off: the local gradient stays local (no psum implied by replicated inputs);
        # jitted, as the library's own gradient is: op by op it took 19 of this script's 26 CPU-s
        return jax.tree.leaves(jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                                                     out_specs=P(), check_vma=False))(params, X, Y))
    return grads

for name, reduce in (("pmean", jax.lax.pmean), ("psum", jax.lax.psum)):
    ar.mesh_grads = explicit(reduce)
    try:
        gates = ar.check_allreduce(laid, xg, yg, lambda: lab.model(recipe), precision="fp32")
        out[name] = [g.values["scale"] for g in gates]
    except AllReduceGateError as e:
        out[name] = [e.gate, str(e)]
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


def test_r5_measures_after_writing_down_its_prediction(four_devices):
    """R5 runs R1's fp32 step at R1's batch per device; R5x / R5f take the same path
    (``perfladder.jax.rungs.multigpu.sharded``) with another recipe, and R5f the FSDP layout of the test above."""
    out, stdout = four_devices
    r5 = out["r5"]
    assert r5["kind"] == "multi-gpu" and r5["tokens_per_s"] > 0 and r5["builds_on"] == "R1"
    assert r5["batch_size"] == 4 * 8 and r5["precision"] == "fp32" and r5["recipe"]["jit"] == "nnx"
    d = r5["details"]
    assert d["layout"] == "replicated" and d["k"] == 4 and d["per_rank_batch"] == 8
    assert d["bus_bw_measured"] > 0 and len(d["peak_mem_bytes_per_gpu"]) == 4
    assert d["efficiency_vs_linear"] is not None or "did not settle" in d["efficiency_note"]
    p = r5["prediction"]
    assert [pt["k"] for pt in p["points"]] == [2, 4, 8]             # printed for k = 2, 4, 8
    assert all(pt["predicted_tokens_per_s"] <= pt["linear_tokens_per_s"] for pt in p["points"])
    assert p["measured_tokens_per_s"] == r5["tokens_per_s"]
    assert p["predicted_tokens_per_s"] <= 4 * p["assumptions"]["single_device_tokens_per_s"]
    assert p["assumptions"]["single_device_source"] == "measured here on one device"
    assert r5["profile"]["device_ms"] > 0 and r5["receipt"]["observed"]["logits"] == "float32"
    assert stdout.index("R5 jax predict k=4") < stdout.index("RESULT")
    assert out["placed_by_the_page"] and all(p == [4, False] for p in out["placed_by_the_page"])
    reduced = [g for g in r5["gates"] if g["name"] == "all-reduce gate"]   # checked at its start
    assert [g["detail"]["who"] for g in reduced] == [f"device {i}" for i in range(4)]
    assert all(g["passed"] and g["detail"]["ranks"] == 4 and g["values"]["grad"] < 1e-5 for g in reduced)


def test_the_allreduce_gate_refuses_a_sum_where_the_mean_belongs(four_devices):
    out, _ = four_devices
    assert len(out["pmean"]) == 4 and max(out["pmean"]) < 1e-5      # the mean: every device passes
    gate, message = out["psum"]
    assert gate == "all-reduce gate" and "summed where the mean belongs (4 x)" in message


def test_the_allreduce_comparison_on_one_device():
    import jax.numpy as jnp
    import numpy as np

    from perfladder.jax.parallel.allreduce import compare
    from perfladder.measure.allreduce import AllReduceGateError
    want = [np.linspace(-1.0, 1.0, 12).reshape(3, 4), np.arange(5.0)]
    got = [jnp.asarray(w, jnp.float32) for w in want]
    assert compare(got, want, precision="fp32", ranks=2)[0].values["scale"] < 1e-6
    with pytest.raises(AllReduceGateError, match="summed where the mean belongs \\(2 x\\)"):
        compare([2 * g for g in got], want, precision="bf16", ranks=2)


def test_fsdp_spec_by_hand():
    assert tuple(fsdp_spec((512, 2048), 4)) == (None, "data")
    assert tuple(fsdp_spec((28, 512), 3)) == ()                  # neither axis divides by 3
    assert tuple(fsdp_spec((30, 512), 3)) == ("data", None)
