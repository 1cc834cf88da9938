"""perfladder.torch.timer: the dynamo compile counter, the recompile guard on a real compile,
and the stale-batch guards with real tensors."""
from __future__ import annotations

import pytest
import torch

from perfladder.measure.timing import RecompileError, StaleBatchError, Throughput
from perfladder.torch import device_name, has_gpu, throughput, versions
from perfladder.torch.timer import compile_count, fingerprint


def planted(warm_shape, timed_shape, warmup):
    """Batches of ``warm_shape`` for the warm-up, then ``timed_shape`` for ever after."""
    n = 0
    while True:
        shape = warm_shape if n < warmup else timed_shape
        n += 1
        X = torch.randint(0, 28, shape)
        yield X, X


@pytest.fixture(scope="module")
def compiled_step():
    @torch.compile(dynamic=False)
    def step(X, Y):
        return (X.float() * 2 + Y.float()).mean()
    return step


LOOSE = dict(target_spread=0.9)     # these tests are about the guards, not about settling


def test_compiled_step_steady_state_times_cleanly(compiled_step):
    tput = throughput(compiled_step, planted((4, 8), (4, 8), 2), warmup=2, timed=3, windows=2, **LOOSE)
    assert isinstance(tput, Throughput)
    assert tput.tokens_per_window == 3 * 4 * 8 and tput.batch_shape == (4, 8)
    assert tput.settled == 2 and len(tput.windows) >= 2 and all(w > 0 for w in tput.windows)
    assert tput.target_spread == 0.9 and tput.stable == (tput.spread <= 0.9)


def test_shape_change_inside_a_timed_window_raises(compiled_step):
    # warm-up at (4, 8), timed at (5, 8): the first timed step recompiles inside window 1
    with pytest.raises(RecompileError, match="inside timed window 1 "):
        throughput(compiled_step, planted((4, 8), (5, 8), 2), warmup=2, timed=3, windows=2)


def test_counter_counts_a_recompile(compiled_step):
    compiled_step(torch.ones(4, 8, dtype=torch.long), torch.ones(4, 8, dtype=torch.long))
    before = compile_count()
    compiled_step(torch.ones(4, 8, dtype=torch.long), torch.ones(4, 8, dtype=torch.long))
    assert compile_count() == before                        # cached graph: nothing new
    compiled_step(torch.ones(6, 8, dtype=torch.long), torch.ones(6, 8, dtype=torch.long))
    assert compile_count() > before                         # a new shape is a new compile


def test_eager_step_counts_no_compile():
    before = compile_count()
    tput = throughput(lambda X, Y: X.sum(), planted((2, 4), (2, 4), 1), warmup=1, timed=2, windows=1,
                      **LOOSE)
    assert compile_count() == before and tput.tokens_per_s > 0


def test_stale_batch_refused():
    X = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(StaleBatchError, match="same batch twice"):
        throughput(lambda X, Y: X.sum(), iter(lambda: (X, X), None), warmup=1, timed=2, windows=1)


def test_cached_content_under_new_tensors_refused_in_warmup():
    """A stream that clones one cached batch: new objects, same content (the fingerprint)."""
    X = torch.randint(0, 28, (2, 4))
    with pytest.raises(StaleBatchError, match="same content"):
        throughput(lambda X, Y: X.sum(), iter(lambda: (X.clone(), X.clone()), None),
                   warmup=2, timed=2, windows=1)


def test_fingerprint_reads_the_first_rows():
    X = torch.arange(12).reshape(3, 4)
    assert fingerprint(X) == X[:2].numpy().tobytes() != fingerprint(X + 1)


def test_bad_window_counts():
    with pytest.raises(ValueError, match="timed"):
        throughput(lambda X, Y: X, planted((1, 1), (1, 1), 0), warmup=0, timed=0, windows=1)


def test_device_description():
    assert has_gpu() == torch.cuda.is_available()
    assert device_name() == (torch.cuda.get_device_name(0) if has_gpu() else "cpu")
    v = versions()
    assert v["torch"] == torch.__version__ and "python" in v and "cuda" in v
