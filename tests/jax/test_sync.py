"""The sync that closes every timed window waits for the device (JAX).

``jax.block_until_ready`` calls ``block_until_ready()`` on every leaf of the step's output,
so a fake output whose work completes only when it is blocked on drives the real timer
(``perfladder.jax.timer.throughput``): the planted per-step times come back only if every
window waits, and a sync that only asked whether the output is ready is refused by the
``ready`` check. On a GPU, a window of a known amount of device work must not be under-timed."""
import shutil

from perfladder.jax.compiler import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles
    fast_cpu_compiles()

import time  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from perfladder.jax import timer  # noqa: E402
from perfladder.measure import timing  # noqa: E402
from perfladder.measure.timing import SyncError  # noqa: E402

B, T, STEP_S = 4, 8, 0.05


class FakeDevice:
    def __init__(self):
        self.now, self.pending, self.blocks = 0.0, 0.0, 0

    def perf_counter(self):
        return self.now


class Out:
    """What a step returns at once; its work is done when something blocks on it."""

    def __init__(self, dev):
        self.dev = dev

    def block_until_ready(self):
        d = self.dev
        d.now, d.pending = d.now + d.pending, 0.0
        d.blocks += 1
        return self

    def is_ready(self):
        return self.dev.pending == 0.0


def stream():
    i = 0
    while True:
        i += 1
        X = np.arange(B * T, dtype=np.int32).reshape(B, T) + i
        yield X, X


def step_on(dev):
    def step(X, Y):
        dev.pending += STEP_S
        return Out(dev)
    return step


def test_every_window_closes_by_blocking_on_the_output(monkeypatch):
    dev = FakeDevice()
    monkeypatch.setattr(timing, "time", dev)
    tp = timer.throughput(step_on(dev), stream(), warmup=2, timed=3, windows=3, target_spread=0.5)
    assert dev.blocks == 1 + len(tp.windows)
    assert tp.seconds == pytest.approx([3 * STEP_S] * len(tp.windows))
    assert tp.tokens_per_s == pytest.approx(B * T / STEP_S)


def test_a_sync_that_only_asks_is_refused(monkeypatch):
    """The planted kind: the window closed by ``is_ready()`` (a question) instead of a wait."""
    dev = FakeDevice()
    monkeypatch.setattr(timing, "time", dev)
    monkeypatch.setattr(timer.jax, "block_until_ready",
                        lambda out: [leaf.is_ready() for leaf in timer.jax.tree.leaves(out)])
    with pytest.raises(SyncError, match="still busy"):
        timer.throughput(step_on(dev), stream(), warmup=2, timed=3, windows=3, target_spread=0.5)


GRADS_S, UPDATE_S = 0.02, 0.03


class TwoPrograms(FakeDevice):
    """A step dispatched as two programs, its gradients (whose loss it returns) then its update
    (written to the parameters, not returned): the loss of a step is ready once the update of
    the step before is, so blocking on it leaves the last update running."""

    def __init__(self):
        super().__init__()
        self.tail, self.written = 0.0, None

    def step(self, X, Y):
        self.pending += GRADS_S + UPDATE_S
        self.tail = UPDATE_S
        self.written = Written(self)
        return Loss(self)


class Loss(Out):
    def block_until_ready(self):
        d = self.dev
        d.now, d.pending = d.now + d.pending - d.tail, d.tail
        return self

    def is_ready(self):
        return self.dev.pending <= self.dev.tail


class Written(Out):
    def block_until_ready(self):
        self.dev.tail = 0.0
        return super().block_until_ready()


@pytest.fixture
def two(monkeypatch):
    dev = TwoPrograms()
    monkeypatch.setattr(timing, "time", dev)
    real = timer.jax.live_arrays
    monkeypatch.setattr(timer.jax, "live_arrays", lambda: [*real(), dev.written])
    return dev


def closing(monkeypatch, seen):
    """``Window.close`` that first records ``seen()``: what was left when each window closed."""
    real, at_close = timing.Window.close, []

    def close(window, steps, what):
        at_close.append(seen())
        return real(window, steps, what)
    monkeypatch.setattr(timing.Window, "close", close)
    return at_close


def test_a_step_in_two_programs_is_timed_to_the_end_of_its_update(two, monkeypatch):
    """Every window closes with no update left running. (Its seconds alone cannot tell: a
    window that closed before its last update would time the one its predecessor left.)"""
    left = closing(monkeypatch, lambda: two.pending)
    tp = timer.throughput(two.step, stream(), warmup=2, timed=3, windows=3, target_spread=0.5)
    assert tp.seconds == pytest.approx([3 * (GRADS_S + UPDATE_S)] * len(tp.windows))
    assert left == [0.0] * len(tp.windows)


@pytest.mark.planted
def test_a_sync_on_the_loss_alone_is_refused(two, monkeypatch):
    """The planted kind: the old sync, which waited on the step's output (the loss) only."""
    import dataclasses
    monkeypatch.setattr(timer, "HOOKS", dataclasses.replace(
        timer.HOOKS, sync=lambda out: timer.jax.block_until_ready(out)))
    with pytest.raises(SyncError, match="timed window 1 closed while the device was still busy"):
        timer.throughput(two.step, stream(), warmup=2, timed=3, windows=3, target_spread=0.5)


def test_a_real_update_program_that_sleeps_is_inside_every_window(monkeypatch):
    """A JAX step whose update is a second jitted program, slowed by a host callback: when each
    window closes, every update dispatched so far has finished. (XLA:CPU runs a program whose
    inputs are ready in the calling thread, at times: whether a sync on the loss alone would
    leave the update running here varies from run to run; the fakes above plant it for sure.)"""
    import jax
    import jax.numpy as jnp
    dispatched, finished = [0], [0]

    def slow(g):
        time.sleep(0.05)
        finished[0] += 1
        return g

    grads = jax.jit(jax.value_and_grad(lambda w, X: jnp.mean((X @ w) ** 2)))
    update = jax.jit(lambda w, g: w - 0.1 * jax.pure_callback(
        slow, jax.ShapeDtypeStruct(g.shape, g.dtype), g))

    class Step:
        w = jnp.ones((T, 2))

        def __call__(self, X, Y):
            loss, g = grads(self.w, X)
            self.w = update(self.w, g)
            dispatched[0] += 1
            return loss

    at_close = closing(monkeypatch, lambda: (dispatched[0], finished[0]))

    def jax_stream():
        for X, _ in stream():
            yield jnp.asarray(X, jnp.float32), None
    timer.throughput(Step(), jax_stream(), warmup=1, timed=3, windows=1)
    assert at_close == [(4, 4)]                      # the warm-up step and the window's three


@pytest.mark.gpu
def test_a_window_of_known_device_work_is_not_under_timed():
    """A jitted loop of matmuls whose length one blocked call measures; the timer's windows must
    hold all of it (dispatch returns long before the device is done)."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def work(x):
        return jax.lax.fori_loop(0, 200, lambda i, a: jnp.tanh(a @ a), x)

    x = jnp.eye(4096, dtype=jnp.float32) * 0.5
    jax.block_until_ready(work(x))                           # compiled
    t0 = time.perf_counter()
    jax.block_until_ready(work(x))
    device_s = time.perf_counter() - t0                      # one step, waited for

    def step(X, Y):
        return work(x)

    def dev_stream():
        for X, Y in stream():
            yield jnp.asarray(X), jnp.asarray(Y)
    tp = timer.throughput(step, dev_stream(), warmup=1, timed=3, windows=3, target_spread=0.5)
    assert min(tp.seconds) >= 0.8 * 3 * device_s, (tp.seconds, device_s)
