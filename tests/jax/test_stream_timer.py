"""perfladder.jax.stream and perfladder.jax.timer: fresh constant-shape batches, the sync'd
timer, the compile counter and its recompile guard (the no-torch import rule is checked with
the other import rules, in tests/test_imports.py)."""
import shutil

from perfladder.jax.compiler import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
    fast_cpu_compiles()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from perfladder.jax import batches, device_name, has_gpu, throughput, versions  # noqa: E402
from perfladder.jax.timer import compile_count  # noqa: E402
from perfladder.measure.timing import BatchShapeError, RecompileError, Throughput  # noqa: E402


class Numbered:
    """A stand-in for TimeMachine whose row i is all i: batches reveal which rows they hold."""

    def __init__(self, n_train=50, n_val=7, T=4):
        rows = np.repeat(np.arange(n_train + n_val, dtype=np.int32)[:, None], T, axis=1)
        self.X, self.Y = rows, rows + 1000
        self.n_train = n_train

    def train_arrays(self):
        return self.X[: self.n_train], self.Y[: self.n_train]

    def val_arrays(self):
        return self.X[self.n_train:], self.Y[self.n_train:]


def rows(X):
    return [int(r) for r in np.asarray(X[:, 0])]


def test_batches_are_on_device_whole_and_fresh_every_epoch():
    data = Numbered(n_train=50)
    stream = batches(data, 8)                 # 6 whole batches per epoch, 2 rows dropped
    epochs = []
    for _ in range(3):
        seen = []
        for _ in range(6):
            X, Y = next(stream)
            assert isinstance(X, jax.Array) and X.shape == (8, 4) and X.dtype == jnp.int32
            assert np.array_equal(np.asarray(Y), np.asarray(X) + 1000)   # pairs stay paired
            seen += rows(X)
        assert len(set(seen)) == 48 and set(seen) <= set(range(50))      # no row twice per epoch
        epochs.append(seen)
    assert epochs[0] != epochs[1] != epochs[2]                           # a fresh permutation each
    other = batches(data, 8, seed=1)
    assert rows(next(other)[0]) != epochs[0][:8]


def test_never_the_same_batch_object_twice():
    stream = batches(Numbered(n_train=16), 8)                 # 2 batches per epoch
    prev = None
    for _ in range(7):
        X, _ = next(stream)
        assert X is not prev
        prev = X


def test_val_split_and_bad_inputs():
    data = Numbered(n_train=50, n_val=7)
    X, _ = next(batches(data, 7, split="val"))
    assert sorted(rows(X)) == list(range(50, 57))
    with pytest.raises(ValueError, match=r"split='test'.*valid choices"):
        batches(data, 4, split="test")
    with pytest.raises(ValueError, match="larger than the data"):
        batches(data, 51)                                     # raised at the call, not at next()
    with pytest.raises(ValueError, match="positive integer"):
        batches(data, 0)


def test_compile_counter_counts_compilations_not_cache_hits():
    f = jax.jit(lambda x: jnp.tanh(x) * 3.0 - 1.0)
    a, b, c = jnp.ones((3, 5)), jnp.zeros((3, 5)), jnp.ones((4, 5))   # made before counting
    before = compile_count()
    f(a).block_until_ready()
    once = compile_count()
    assert once == before + 1
    f(b).block_until_ready()
    assert compile_count() == once                            # same shape: cache hit
    f(c).block_until_ready()
    assert compile_count() > once                             # new shape: compiled


def _stream(specs):
    for i, (b, t, dtype) in enumerate(specs):
        X = jnp.full((b, t), i, dtype)
        yield X, X


def test_throughput_counts_tokens_and_windows():
    step = jax.jit(lambda X, Y: (X * Y).sum())
    t = throughput(step, _stream([(4, 8, jnp.int32)] * 20), warmup=2, timed=3, windows=4,
                   max_windows=4)                        # stop after 4 windows, settled or not
    assert isinstance(t, Throughput) and isinstance(t.stable, bool)
    assert len(t.windows) == 4 and t.tokens_per_window == 3 * 4 * 8 and t.batch_shape == (4, 8)
    assert t.tokens_per_s > 0 and t.spread >= 0


def test_recompile_inside_a_timed_window_raises():
    """Same shape, new dtype: the jitted step retraces and XLA compiles mid-window."""
    step = jax.jit(lambda X, Y: (X + Y).astype(jnp.float32).mean())
    specs = [(4, 8, jnp.int32)] * 6 + [(4, 8, jnp.int16)] * 3   # warm-up 2, window 1, then window 2
    with pytest.raises(RecompileError, match=r"window 2\b"):
        throughput(step, _stream(specs), warmup=2, timed=3, windows=3)


def test_new_batch_shape_inside_a_timed_window_raises():
    step = jax.jit(lambda X, Y: (X + Y).astype(jnp.float32).mean())
    specs = [(4, 8, jnp.int32)] * 6 + [(5, 8, jnp.int32)] * 3
    with pytest.raises((BatchShapeError, RecompileError), match=r"window 2\b"):
        throughput(step, _stream(specs), warmup=2, timed=3, windows=3)
    # a shape change during warm-up is what warm-up is for
    specs = [(3, 8, jnp.int32)] + [(4, 8, jnp.int32)] * 7
    assert throughput(step, _stream(specs), warmup=2, timed=3, windows=2,
                      max_windows=2).batch_shape == (4, 8)


def test_device_helpers():
    gpu = any(d.platform == "gpu" for d in jax.devices())
    assert has_gpu() == gpu
    assert device_name() == (jax.devices()[0].device_kind if gpu else "cpu")
    v = versions()
    assert {"python", "jax", "jaxlib", "flax", "optax", "backend"} <= set(v)
    assert v["jax"] == jax.__version__


def test_a_blind_compile_counter_refuses_to_time(monkeypatch):
    import perfladder.jax.timer as timer
    monkeypatch.setattr(timer, "COMPILE_EVENT", "/no/such/event")   # as if jax renamed it
    monkeypatch.setattr(timer, "_verified", False)
    step = jax.jit(lambda X, Y: (X * Y).sum())
    with pytest.raises(RuntimeError, match="recompile guard would be blind"):
        throughput(step, _stream([(4, 8, jnp.int32)] * 10), warmup=1, timed=2, windows=1)


def test_stream_position_counts_batches_across_epochs():
    stream = batches(Numbered(n_train=16), 8)                 # 2 batches per epoch
    assert stream.position == 0
    firsts = []
    for i in range(5):
        X, _ = next(stream)
        firsts.append(rows(X))
        assert stream.position == i + 1
    assert sorted(firsts[0] + firsts[1]) == list(range(16))   # one epoch, every row once
    assert firsts[0] + firsts[1] != firsts[2] + firsts[3]     # the next epoch: a new permutation


@pytest.mark.parametrize("eager, attempts", [(True, 1), (False, 2)])
def test_an_unsettled_un_jitted_step_is_measured_once(monkeypatch, eager, attempts):
    """The un-jitted R0 is a price list: one brief attempt even when it wanders; a jitted step
    that does not settle is measured once more."""
    import perfladder.jax.lab as lab_module
    from perfladder.config import get_config
    calls = []

    def wandering(step, stream, settings):
        calls.append(settings)
        return Throughput(tokens_per_s=1.0, windows=[1.0, 2.0], seconds=[0.01, 0.01],
                          steps_per_window=settings.timed, tokens_per_window=1,
                          warmup=settings.warmup, stable=False)
    monkeypatch.setattr(lab_module, "throughput", wandering)
    lab = lab_module.JaxLab(get_config("smoke"))
    m = lab.measure(None, 8, stream=iter(()), eager=eager)
    t, remeasured = m.throughput, m.remeasured
    assert m.memory is None                      # JAX reads its memory from the compiler's plan
    assert len(calls) == attempts and remeasured == (attempts == 2) and t.stable is False
    if eager:
        assert calls[0].max_windows == lab_module.EAGER_MAX_WINDOWS and calls[0].warmup == 1
