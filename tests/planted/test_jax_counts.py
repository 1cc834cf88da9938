"""Planted miscounts around a JAX measurement, each refused at run time by a named check, and
misaligned targets refused by the learning check.

    bug                                              caught by
    tokens counted per row, not per token            token count (rate x seconds vs B x T x steps)
    FLOPs formula without the backward (2N)          flop count, when the lab starts
    one cached batch, 1-step warm-up (R0's timer)    content fingerprint after the last window
    devices fed the same rows (real streams)         distinct batches (two host devices, subprocess)
    targets equal to the inputs (misaligned)         learning check, by the reference model
"""
import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from _jax_gate_helpers import CFG, DATA, model  # first: cheap CPU compiles

from perfladder.config import get_config  # noqa: E402
from perfladder.jax import evaluate, timer  # noqa: E402
from perfladder.jax import lab as jax_lab  # noqa: E402
from perfladder.jax.step import TrainStep, make_optimizer  # noqa: E402
from perfladder.jax.stream import batches  # noqa: E402
from perfladder.measure.counts import CountError, check_tokens  # noqa: E402
from perfladder.measure.learning import LearningError  # noqa: E402
from perfladder.measure.timing import StaleBatchError  # noqa: E402

pytestmark = pytest.mark.planted


def eager_step():
    m = model()
    return TrainStep(m, make_optimizer(m, CFG.lr), jit="none")


def test_tokens_counted_per_row_are_caught_by_the_token_count(monkeypatch):
    s = eager_step()
    honest = timer.throughput(s, batches(DATA, CFG.batch_size, seed=3), warmup=1, timed=2,
                              windows=2, target_spread=0.9)
    assert check_tokens(honest) == CFG.batch_size * CFG.num_steps * 2
    real = timer.measure
    monkeypatch.setattr(timer, "measure", lambda step, stream, hooks, settings: real(
        step, stream, dataclasses.replace(hooks, num_tokens=lambda X: X.shape[0]), settings))
    planted = timer.throughput(s, batches(DATA, CFG.batch_size, seed=4), warmup=1, timed=2,
                               windows=2, target_spread=0.9)
    with pytest.raises(CountError, match="off by") as e:
        check_tokens(planted)
    assert e.value.gate == "token count"


def test_a_flops_formula_without_the_backward_is_caught_when_the_lab_starts(monkeypatch):
    lab = jax_lab.JaxLab(get_config("smoke"), probe=False)
    assert lab.flop_check["counter"].startswith("the jaxpr")
    monkeypatch.setattr(jax_lab, "flops_per_token", lambda N, L, T, D: 2 * N + 12 * L * T * D)
    with pytest.raises(CountError, match="the 6N term") as e:
        jax_lab.JaxLab(get_config("smoke"), probe=False)
    assert e.value.gate == "flop count"


def test_one_cached_batch_is_caught_after_a_one_step_warmup():
    """JAX's un-jitted R0 warms up one step: too few batches to compare in warm-up, so the
    fingerprint of the measurement's last two batches is what refuses a cached stream."""
    X, Y = next(batches(DATA, CFG.batch_size, seed=5))
    cached = ((X + 0, Y) for _ in iter(int, 1))                      # new objects, one content
    with pytest.raises(StaleBatchError, match="last two batches"):
        timer.throughput(eager_step(), cached, warmup=1, timed=2, windows=2, target_spread=0.9)


SCRIPT = r'''
import json
from perfladder.jax.compiler import fast_cpu_compiles
fast_cpu_compiles()
import jax, jax.numpy as jnp
from perfladder.config import get_config
from perfladder.jax import stream as jstream
from perfladder.jax.checks import distinct_devices
from perfladder.jax.parallel.launch import local_batches
from perfladder.jax.parallel.layout import batch_sharding, make_data_mesh
from perfladder.jax.parallel.measure import corpus
from perfladder.measure.counts import CountError

cfg = get_config("smoke")
data, mesh, out = corpus(cfg), make_data_mesh(2), {}
out["per_device"] = distinct_devices(next(local_batches(data, cfg.batch_size, mesh, seed=300))[0])
X, _ = next(jstream.batches(data, 2 * cfg.batch_size, seed=7, sharding=batch_sharding(mesh)))
out["sharded"] = distinct_devices(X)
real = jstream.Batches
jstream.Batches = lambda *a: real(*a[:-1], 0)        # planted: every device the same seed
try:
    distinct_devices(next(local_batches(data, cfg.batch_size, mesh, seed=300))[0])
    out["planted"] = "passed"
except CountError as e:
    out["planted"] = [e.gate, str(e)]
print("RESULT" + json.dumps(out))
'''


def test_devices_fed_the_same_rows_are_caught_by_distinct_batches():
    """The real per-device streams (``local_batches``, one per device) and the sharded stream
    on two host devices: every device's rows differ; every device seeded alike is refused."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))[6:])
    assert len(set(out["per_device"])) == 2 and len(set(out["sharded"])) == 2
    gate, message = out["planted"]
    assert gate == "distinct batches" and "devices [[0, 1]] were fed the same batch" in message


def test_misaligned_targets_are_caught_by_the_learning_check():
    m = model(jnp.bfloat16)
    opt = make_optimizer(m, CFG.lr)
    st = TrainStep(m, opt, jit="nnx")
    stream = ((X, X) for X, _ in batches(DATA, CFG.big_batch, seed=1000))
    with pytest.raises(LearningError) as e:
        evaluate.learning_check(st, stream, DATA, model=m, steps=60)
    c = e.value.check
    assert e.value.gate == "learning check" and c.last < c.first and c.val_after > c.threshold
