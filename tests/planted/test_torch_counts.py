"""Planted miscounts around a PyTorch measurement, each refused at run time by a named check
(``perfladder.measure.counts``), and misaligned targets refused by the learning check.

    bug                                            caught by
    tokens counted per row, not per token          token count (rate x seconds vs B x T x steps)
    FLOPs formula without the backward (2N)        flop count, when the lab starts
    attention's 12 L T D halved                    flop count, when the lab starts
    two ranks fed the same batch (real streams)    distinct batches (the worker's check)
    one rank's tokens counted twice                global rate (global tokens / elapsed)
    targets equal to the inputs (misaligned)       learning check, by the reference model
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from _torch_gate_helpers import CFG, DATA, model, one_thread, step  # noqa: F401

from perfladder.config import get_config
from perfladder.measure.counts import GLOBAL_RATE_RTOL, CountError, check_distinct, check_tokens
from perfladder.measure.learning import LearningError
from perfladder.torch import evaluate, timer
from perfladder.torch import lab as torch_lab
from perfladder.torch.parallel import launch as ddp
from perfladder.torch.parallel import worker
from perfladder.torch.rungs.recipes import seed_recipe
from perfladder.torch.stream import batches

pytestmark = pytest.mark.planted


def test_tokens_counted_per_row_are_caught_by_the_token_count(monkeypatch):
    s = step()
    honest = timer.throughput(s, batches(DATA, CFG.batch_size, "cpu", seed=3), warmup=1, timed=2,
                              windows=2, target_spread=0.9)
    assert check_tokens(honest) == CFG.batch_size * CFG.num_steps * 2
    real = timer.measure
    monkeypatch.setattr(timer, "measure", lambda step, stream, hooks, settings: real(
        step, stream, dataclasses.replace(hooks, num_tokens=lambda X: X.shape[0]), settings))
    planted = timer.throughput(s, batches(DATA, CFG.batch_size, "cpu", seed=4), warmup=1, timed=2,
                               windows=2, target_spread=0.9)
    with pytest.raises(CountError, match="off by") as e:
        check_tokens(planted, "R0's timed step")
    assert e.value.gate == "token count"


@pytest.mark.parametrize("formula, term", [
    (lambda N, L, T, D: 2 * N + 12 * L * T * D, "6N"),
    (lambda N, L, T, D: 6 * N + 6 * L * T * D, "12LD"),
], ids=["no-backward", "attention-halved"])
def test_a_flops_formula_miscount_is_caught_when_the_lab_starts(monkeypatch, formula, term):
    lab = torch_lab.TorchLab(get_config("smoke"))
    assert lab.flop_check["counter"].endswith("FlopCounterMode")
    assert any("checked against" in n for n in lab.result.notes)
    monkeypatch.setattr(torch_lab, "flops_per_token", formula)
    with pytest.raises(CountError, match=f"the {term} term") as e:
        torch_lab.TorchLab(get_config("smoke"))
    assert e.value.gate == "flop count"


def _spec():
    return ddp.make_spec(CFG, "seed", seed_recipe(CFG), parallel="none", backend="gloo")


def test_two_ranks_fed_the_same_batch_are_caught_by_distinct_batches():
    """The worker's own streams (``worker.build``) for ranks 0 and 1: different batches; the
    planted kind -- every rank seeded as rank 0 -- is refused."""
    spec, cpu = _spec(), torch.device("cpu")
    honest = [worker.batch_digest(worker.build(spec, cpu, rank)[2]) for rank in (0, 1)]
    assert check_distinct(honest) == honest
    planted = [worker.batch_digest(worker.build(spec, cpu, 0)[2]) for _ in (0, 1)]
    with pytest.raises(CountError, match=r"ranks \[\[0, 1\]\] were fed the same batch") as e:
        check_distinct(planted)
    assert e.value.gate == "distinct batches"


def test_one_rank_counted_twice_is_caught_by_the_global_rate():
    """The launch's own summary (``summarize``) of two ranks whose clocks close apart credits every
    rank's tokens over the slowest rank's seconds, as the gate counts them; a summary that counts
    one rank twice is refused."""
    spec = {**_spec(), "timed": 3}
    tokens = CFG.batch_size * CFG.num_steps * 3                      # one rank's window
    secs = [[0.10, 0.10], [0.20, 0.10]]                              # rank 1 closes later
    ranks = [{"seconds": s, "windows": [tokens / x for x in s], "batch_shape": [CFG.batch_size, CFG.num_steps]}
             for s in secs]
    res = ddp.summarize(ranks, spec)
    assert res["windows"] == pytest.approx([2 * tokens / 0.20, 2 * tokens / 0.10])
    assert ddp.check_global_rate(res, spec) == pytest.approx(res["windows"])
    summed = [sum(w) for w in zip(*(r["windows"] for r in ranks))]   # each rank's own rate, summed:
    with pytest.raises(CountError, match="global tokens"):           # credits rank 0 for time it waited
        ddp.check_global_rate({**res, "windows": summed}, spec)
    res["windows"] = [w + tokens / 0.20 for w in res["windows"]]     # rank 1 counted twice
    with pytest.raises(CountError, match="global tokens") as e:
        ddp.check_global_rate(res, spec)
    assert e.value.gate == "global rate" and GLOBAL_RATE_RTOL < 0.5


def test_misaligned_targets_are_caught_by_the_learning_check():
    """Targets equal to the inputs: the model learns to copy its current token -- the training
    loss falls -- and the reference model's held-out loss says it learned nothing useful."""
    s = step(model(), bf16=True)
    stream = ((X, X) for X, _ in batches(DATA, CFG.big_batch, "cpu", seed=1000))
    with pytest.raises(LearningError) as e:
        evaluate.learning_check(s, stream, DATA, steps=60)
    c = e.value.check
    assert e.value.gate == "learning check" and c.last < c.first and c.val_after > c.threshold
