"""The library checks what it is given: token ids in both GPTs (shape, dtype, range; the JAX
one raises instead of returning NaN), a stream that ends and zero-token batches in the timer,
negative sizes in the cost model. Each is one ValueError naming the value and what is valid."""
from __future__ import annotations

import numpy as np
import pytest

from perfladder.measure.timing import StreamEndedError, TimerHooks, WindowSettings, measure
from perfladder.multigpu.costmodel import (
    hierarchical_allreduce_seconds,
    ring_allreduce_seconds,
)

BAD_IDS = [  # (ids as numpy, the words of the error)
    (np.zeros(4, np.int64), r"shape \(batch, seq_len\); got shape \(4,\)"),
    (np.zeros((2, 3, 4), np.int64), r"got shape \(2, 3, 4\)"),
    (np.zeros((2, 3), np.float32), r"must be integers.*float32"),
    (np.full((2, 3), 28, np.int64), r"token id 28 is out of range: valid ids are 0 to 27 \(vocab_size=28\)"),
    (np.full((2, 3), -1, np.int64), r"token id -1 is out of range"),
    (np.zeros((0, 3), np.int64), r"shape \(0, 3\) hold no tokens"),
]


@pytest.mark.parametrize("ids, says", BAD_IDS)
def test_torch_gpt_checks_its_token_ids(ids, says):
    torch = pytest.importorskip("torch")
    from perfladder.torch.model import GPT
    torch.manual_seed(0)
    model = GPT(28, num_hiddens=16, num_blks=1, num_heads=2)
    with pytest.raises(ValueError, match=says):
        model(torch.from_numpy(ids))
    assert model(torch.zeros(2, 3, dtype=torch.int32)).shape == (2, 3, 28)      # int32 is fine


@pytest.fixture(scope="module")
def jax_gpt():
    pytest.importorskip("jax")
    from flax import nnx

    from perfladder.jax.model import GPT
    return GPT(28, num_hiddens=16, num_blks=1, num_heads=2, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("ids, says", BAD_IDS)
def test_jax_gpt_checks_its_token_ids(jax_gpt, ids, says):
    import jax.numpy as jnp
    with pytest.raises(ValueError, match=says):
        jax_gpt(jnp.asarray(ids))


def test_jax_gpt_under_jit_checks_shape_and_dtype_at_trace_time(jax_gpt):
    import jax.numpy as jnp
    from flax import nnx
    call = nnx.jit(lambda m, X: m(X))
    assert call(jax_gpt, jnp.zeros((2, 3), jnp.int32)).shape == (2, 3, 28)
    with pytest.raises(ValueError, match=r"got shape \(6,\)"):
        call(jax_gpt, jnp.zeros(6, jnp.int32))
    with pytest.raises(ValueError, match="must be integers"):
        call(jax_gpt, jnp.zeros((2, 3), jnp.float32))


TIMER = (TimerHooks(sync=lambda out: None, compile_count=lambda: 0, num_tokens=lambda X: X.size,
                    shape_of=lambda X: X.shape), WindowSettings(warmup=1, timed=2, windows=2))


def test_a_stream_that_ends_says_how_many_batches_it_gave():
    batches = iter([(np.full((2, 2), i), None) for i in range(3)])
    with pytest.raises(StreamEndedError, match=r"ended after 3 batches; a measurement needs "
                                               r"warmup=1 \+ at least windows=2 x timed=2 = 5"):
        measure(lambda X, Y: X, batches, *TIMER)


def test_zero_token_batches_are_refused_before_any_division():
    def empty():
        i = 0
        while True:
            i += 1
            yield np.full((0, 4), i), None
    with pytest.raises(ValueError, match=r"batch of shape \(0, 4\) holds 0 tokens"):
        measure(lambda X, Y: X, empty(), *TIMER)


@pytest.mark.parametrize("nbytes", [-1, -7.5e7, float("nan"), True])
def test_the_cost_model_refuses_negative_and_absurd_sizes(nbytes):
    with pytest.raises(ValueError, match=rf"nbytes={nbytes!r} must be a finite number of bytes >= 0"):
        ring_allreduce_seconds(nbytes, 2, 1e9)
    with pytest.raises(ValueError, match="nbytes="):
        hierarchical_allreduce_seconds(nbytes, 16, 8, "nvlink4-h200", "ib-ndr400")
    assert ring_allreduce_seconds(0, 2, 1e9) == 0.0
