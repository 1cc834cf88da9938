"""Planted bugs around the JAX timer that only tests caught before Gates III, each now refused
at run time by a named check.

    bug                                                 caught by
    a stream re-yielding its first epoch (objects)      Draws: the batches an epoch apart, at once
    the same, as copies (new objects, same content)     Draws: their fingerprints, after the windows
    a multi-process rate summed over the processes      global rate, on the rate recorded
    (a step in two programs, the loss waited on alone:  SyncError, tests/jax/test_sync.py)
"""
import pytest  # noqa: E402
from _jax_gate_helpers import CFG, DATA  # first: cheap CPU compiles

from perfladder.jax import timer  # noqa: E402
from perfladder.jax.parallel import launch  # noqa: E402
from perfladder.jax.rungs.recipes import seed_recipe  # noqa: E402
from perfladder.jax.stream import Batches, batches  # noqa: E402
from perfladder.measure.counts import CountError  # noqa: E402
from perfladder.measure.evidence import Timing  # noqa: E402
from perfladder.measure.timing import StaleBatchError  # noqa: E402

pytestmark = pytest.mark.planted


class Replaying(Batches):
    """The planted stream: its first epoch gathered, then re-yielded (``copies``: as new arrays)."""
    copies = False

    def __next__(self):
        epoch, b = divmod(self.position, self.per_epoch)
        if epoch == 0:
            self.cache = getattr(self, "cache", []) + [super().__next__()]
            return self.cache[-1]
        self.position += 1
        X, Y = self.cache[b]
        return (X + 0, Y + 0) if self.copies else (X, Y)


def planted(copies):
    s = batches(DATA, CFG.big_batch, seed=11)
    s.__class__ = type("Replaying", (Replaying,), {"copies": copies})
    return s


def step(X, Y):
    return (X - Y).sum()


@pytest.mark.parametrize("copies, said", [(False, "the same tensor object"), (True, "the same content")])
def test_a_stream_re_yielding_its_first_epoch_is_refused(copies, said):
    honest = batches(DATA, CFG.big_batch, seed=11)
    t = timer.throughput(step, honest, warmup=1, timed=2, windows=2, target_spread=0.9)
    assert t.windows and honest.position > honest.per_epoch      # drawn on past the boundary
    with pytest.raises(StaleBatchError, match=f"stream.per_epoch={honest.per_epoch}.*are {said}"):
        timer.throughput(step, planted(copies), warmup=1, timed=2, windows=2, target_spread=0.9)


def summary(windows, seconds, k=2, timed=2):
    """What ``launch.run`` hands back from process 0 (``launch_local``), with its windows."""
    return {"k": k, "num_processes": k, "device": "cpu", "peak_mem_bytes_per_gpu": [None] * k,
            "timing": Timing(windows=windows, seconds=seconds[0], settled=len(windows), stable=True,
                             target_spread=0.5, steps_per_window=timed, warmup=1).to_dict(),
            "windows_per_process": [[0.0] * len(windows)] * k, "seconds_per_process": seconds,
            "bus_bw_per_process": [1.0] * k, "memory_stats_process0": {}}


@pytest.mark.parametrize("summed", [False, True], ids=["combined", "summed"])
def test_a_multi_process_rate_summed_over_processes_is_refused_once_combined(monkeypatch, summed):
    """Each process times the same global steps; process 0's windows are the global tokens over
    its seconds. The planted kind adds the processes' rates up -- k times the real one -- after
    each process's own check has passed: the rate recorded is what is checked."""
    B = seed_recipe(CFG).batch_size
    tokens = 2 * B * CFG.num_steps * 2                                 # k x B x T x timed
    seconds = [[0.10, 0.10], [0.11, 0.10]]
    own = [tokens / s for s in seconds[0]]
    windows = [sum(tokens / s[w] for s in seconds) for w in range(2)] if summed else own
    monkeypatch.setattr(launch, "launch_local", lambda *a, **kw: summary(windows, seconds))
    if not summed:
        m = launch.measure_distributed(2, CFG, "seed", seed_recipe(CFG), timed=2)
        assert m.status == "measured" and m.windows == own
        return
    with pytest.raises(CountError, match="2 processes' combined rate: window 1 reports") as e:
        launch.measure_distributed(2, CFG, "seed", seed_recipe(CFG), timed=2)
    assert e.value.gate == "global rate"
