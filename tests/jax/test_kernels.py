"""perfladder.jax.kernels on CPU: a real jax.profiler trace of a tiny jitted AdamW step."""
from __future__ import annotations

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from perfladder import kernels as K  # noqa: E402
from perfladder.jax import kernels as jk  # noqa: E402
from perfladder.jax.program import hlo_module_name  # noqa: E402
from perfladder.measure.timing import RecompileError  # noqa: E402

D_IN, D_H, V, B = 32, 64, 16, 16


def _loss(p, X, Y):
    h = jnp.tanh(X @ p["w1"])                                            # (B, D_H)
    h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
    logits = h @ p["w2"]                                                 # (B, V)
    return optax.softmax_cross_entropy_with_integer_labels(logits, Y).mean()


OPT = optax.adamw(1e-3)


@jax.jit
def _train(p, s, X, Y):
    loss, g = jax.value_and_grad(_loss)(p, X, Y)
    u, s = OPT.update(g, s, p)
    return optax.apply_updates(p, u), s, loss


class TinyStep:
    """``step(X, Y) -> loss`` holding its parameters and AdamW state, like the ladder's steps."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.p = {"w1": jnp.asarray(rng.normal(size=(D_IN, D_H)) * 0.1, jnp.float32),
                  "w2": jnp.asarray(rng.normal(size=(D_H, V)) * 0.1, jnp.float32)}
        self.s = OPT.init(self.p)

    def __call__(self, X, Y):
        self.p, self.s, loss = _train(self.p, self.s, X, Y)
        return loss


def stream(batch=B, seed=1):
    """Fresh (X, Y) device arrays every call, from host data (no extra XLA module per batch)."""
    rng = np.random.default_rng(seed)
    while True:
        yield (jnp.asarray(rng.normal(size=(batch, D_IN)), jnp.float32),
               jnp.asarray(rng.integers(0, V, size=(batch,)), jnp.int32))


@pytest.fixture(scope="module")
def tiny():
    step = TinyStep()
    X, Y = next(stream())
    hlo = jk.compiled_hlo_text(_train, step.p, step.s, X, Y)
    with_hlo = jk.kernel_breakdown(step, stream(), steps=2, warmup=1, hlo_text=hlo)
    by_name = jk.kernel_breakdown(step, stream(seed=2), steps=2, warmup=1)
    return step, hlo, with_hlo, by_name


def test_breakdown_on_cpu_is_real_and_consistent(tiny):
    _, _, b, _ = tiny
    assert b.framework == "jax" and b.device == "cpu" and b.steps == 2
    assert b.num_events > 0 and b.total_us > 0 and b.wall_us > 0
    assert math.isclose(sum(b.category_share.values()), 1.0)
    assert sum(b.category_us.values()) == pytest.approx(b.total_us)
    assert [k.total_us for k in b.top] == sorted((k.total_us for k in b.top), reverse=True)
    assert any("CPU run" in n for n in b.notes)


def test_hlo_text_resolves_fusions(tiny):
    _, hlo, b, by_name = tiny
    assert hlo_module_name(hlo) == "jit__train"
    # the module text finds the dots (XLA:CPU hides some in ynn fusions) and the AdamW update
    assert b.category_us["matmul"] > 0
    assert b.category_us["optimizer"] > 0
    assert any("matched ops of HLO module 'jit__train'" in n for n in b.notes)
    # names alone cannot see the optimizer inside XLA's fusions, and say so
    assert by_name.category_us["optimizer"] == 0
    assert any("no hlo_text" in n for n in by_name.notes)


def test_breakdown_from_the_raw_trace(tiny):
    """perfetto=False (the per-rung profiles on CPU) reads the xplane.pb: the same categories."""
    step, hlo, b, _ = tiny
    raw = jk.kernel_breakdown(step, stream(seed=3), steps=2, warmup=0, hlo_text=hlo, perfetto=False)
    assert raw.device == "cpu" and raw.total_us > 0
    assert {c for c, us in raw.category_us.items() if us} == {c for c, us in b.category_us.items() if us}


def test_real_trace_files_agree(tmp_path):
    """The perfetto JSON and the raw xplane.pb (the fallback) give the same XLA ops."""
    f = jax.jit(lambda a, b: jnp.tanh(a @ b).sum())
    a = jnp.ones((64, 64))
    f(a, a).block_until_ready()
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        f(a, a).block_until_ready()
    path = jk._trace_file(str(tmp_path))
    assert path is not None and path.endswith("perfetto_trace.json.gz")
    from_json = K.parse_chrome_trace(path, expect="cpu")
    from_pb = K.select_kernel_events(jk._xspace_rows(str(tmp_path)), expect="cpu")
    assert from_json.device == from_pb.device == "cpu"
    assert sorted(n for n, _ in from_json) == sorted(n for n, _ in from_pb)
    assert sum(d for _, d in from_json) == pytest.approx(sum(d for _, d in from_pb), rel=1e-3)
    assert {m for _, m in from_json.ops} == {"jit__lambda"}


def test_the_trace_records_no_python_calls(tmp_path):
    """The breakdown's trace leaves Python's own calls out (they only cost the time to stop it)
    and keeps the XLA ops it reads."""
    f = jax.jit(lambda a, b: jnp.tanh(a @ b).sum())
    a = jnp.ones((32, 32))
    f(a, a).block_until_ready()

    def python_work():
        return sum(i for i in range(50))
    jk._start(str(tmp_path), perfetto=False)
    python_work()
    f(a, a).block_until_ready()
    jax.profiler.stop_trace()
    rows = jk._xspace_rows(str(tmp_path))
    assert not [n for _, _, n, *_ in rows if n.startswith("$")]       # '$file:line function'
    assert K.select_kernel_events(rows, expect="cpu")


def test_recompile_while_profiling_raises(monkeypatch):
    # A real retrace under the profiler costs ~15 s on this CPU; the guard only reads the
    # counter, so make the counter move the way one compilation inside the trace would.
    step = TinyStep()
    calls = iter(range(100))
    monkeypatch.setattr(jk, "compile_count", lambda: 5 * next(calls))
    with pytest.raises(RecompileError, match="5 compilation.*while profiling"):
        jk.kernel_breakdown(step, stream(), steps=1, warmup=1)


@pytest.mark.parametrize("kw, match", [({"steps": 0}, "steps=0"), ({"warmup": -1}, "warmup=-1"),
                                       ({"top": 0}, "top=0"), ({"hlo_text": "nope"}, "HloModule")])
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        jk.kernel_breakdown(TinyStep(), stream(), **kw)


def test_compiled_hlo_text_needs_the_jitted_function():
    with pytest.raises(TypeError, match="lower"):
        jk.compiled_hlo_text(lambda x: x, 1.0)


def test_device_probe_runs_small_on_cpu():
    """The probe JaxLab runs on a GPU (roofs), at a toy size: every key, positive rates."""
    from perfladder.jax.device import probe_roofs
    roofs = probe_roofs(n=64, copy_mib=1, inner=2, reps=2)
    assert set(roofs) == {"matmul_bf16_tflops", "matmul_tf32_tflops", "copy_gbps", "source", "method"}
    assert roofs["matmul_bf16_tflops"] > 0 and roofs["matmul_tf32_tflops"] > 0 and roofs["copy_gbps"] > 0
    from perfladder.kernels.ceiling import timed_as
    assert timed_as(roofs) == "chains"                # the pages read it as the sustained rate
    with pytest.raises(ValueError, match="reps=0 must be a positive integer"):
        probe_roofs(reps=0)
