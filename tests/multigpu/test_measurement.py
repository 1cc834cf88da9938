"""The typed data-parallel record: the settled baseline, efficiency (or why not), to_dict."""
import dataclasses
import json

import pytest
from conftest import timing_of

from perfladder.measure.timing import spread_of
from perfladder.multigpu.costmodel import predict
from perfladder.multigpu.measurement import (
    Baseline,
    DataParallelMeasurement,
    baseline_from_windows,
    not_measured,
    record,
    settle_baseline,
)


def attempts(*window_lists):
    """A fake ``measure()`` handing out the given windows, one list per call."""
    it = iter(window_lists)
    calls = []

    def measure():
        w = next(it)
        calls.append(w)
        return sorted(w)[len(w) // 2], w
    return measure, calls


def test_a_steady_baseline_is_measured_once():
    measure, calls = attempts([100.0, 101.0, 102.0])
    b = settle_baseline(measure)
    assert b.settled and len(calls) == 1 and b.tokens_per_s == 101.0
    assert b.spread == pytest.approx(2 / 101)


def test_a_noisy_baseline_is_measured_again_and_the_second_counts():
    measure, calls = attempts([80.0, 100.0, 120.0], [99.0, 100.0, 101.0])
    b = settle_baseline(measure)
    assert len(calls) == 2 and b.settled and b.tokens_per_s == 100.0 and len(b.attempts) == 2


def test_a_baseline_noisy_twice_gives_no_efficiency():
    measure, _ = attempts([80.0, 100.0, 120.0], [70.0, 100.0, 110.0])
    b = settle_baseline(measure)
    assert not b.settled
    m = record(framework="torch", mechanism="ddp", form="seed", k=2, per_rank_batch=64,
               seq_len=128, timing=timing_of([190.0, 200.0, 210.0]), baseline=b)
    assert m.efficiency_vs_linear is None
    assert "did not settle" in m.efficiency_note and "40.0%" in m.efficiency_note


def test_record_efficiency_prediction_and_json():
    base = baseline_from_windows([100.0, 100.0, 100.0])
    pred = predict(2, 64, 128, base.tokens_per_s, 1000, "pcie-host-staged")
    m = record(framework="jax", mechanism="mesh", form="fast", k=2, per_rank_batch=64,
               seq_len=128, timing=timing_of([150.0, 160.0, 170.0]), baseline=base, prediction=pred,
               bus_bw_measured=2 * pred.bus_bytes_per_s, peak_mem_bytes_per_gpu=[1, 2])
    assert m.measured_tokens_per_s == 160.0 and m.efficiency_vs_linear == pytest.approx(0.8)
    assert m.predicted_tokens_per_s == pred.predicted_tokens_per_s
    # a faster measured all-reduce -> a higher floor
    assert m.predicted_at_measured_bw_tokens_per_s > m.predicted_tokens_per_s
    assert m.spread == pytest.approx(20 / 160) and m.global_batch == 128
    d = json.loads(json.dumps(m.to_dict()))
    assert d["prediction"]["k"] == 2 and d["baseline"]["settled"] and d["global_batch"] == 128
    assert "80.0% of linear" in m.line()


def test_no_baseline_no_efficiency():
    m = record(framework="torch", mechanism="ddp", form="fast", k=2, per_rank_batch=8,
               seq_len=16, timing=timing_of([1.0]), baseline=None)
    assert m.efficiency_vs_linear is None and "no single-device baseline" in m.efficiency_note


def test_skips_carry_their_reason():
    m = not_measured(status="skipped", reason="one GPU visible", framework="jax",
                     mechanism="mesh", form="seed", k=2, per_rank_batch=64, seq_len=128)
    assert m.measured_tokens_per_s is None and "skipped -- one GPU visible" in m.line()
    with pytest.raises(ValueError, match="status='measured'.*skipped.*failed"):
        not_measured(status="measured", reason="x", framework="jax", mechanism="mesh",
                     form="seed", k=2, per_rank_batch=64, seq_len=128)


@pytest.mark.parametrize("field,value,valid", [("framework", "mxnet", "torch"),
                                               ("mechanism", "horovod", "ddp"),
                                               ("form", "medium", "seed")])
def test_bad_fields_list_the_valid_ones(field, value, valid):
    kw = dict(framework="torch", mechanism="ddp", form="seed", k=2, per_rank_batch=64, seq_len=128)
    kw[field] = value
    with pytest.raises(ValueError, match=f"{value!r}.*{valid}"):
        DataParallelMeasurement(**kw)


def test_spread_and_round_trip():
    assert spread_of([90.0, 100.0, 110.0]) == pytest.approx(0.2)
    b = baseline_from_windows([90.0, 100.0, 110.0])
    assert not b.settled and Baseline.from_dict(b.to_dict()) == b


def test_a_forms_recipe_follows_one_rule_for_both_sides():
    from perfladder.multigpu.measurement import given_recipe, recipe_of_form

    @dataclasses.dataclass(frozen=True)
    class Rec:
        batch: int

        @classmethod
        def from_dict(cls, d):
            return cls(**d)

    seed, fast = Rec(8), Rec(64)
    pick = lambda form, recipe=None: recipe_of_form(form, recipe, Rec.from_dict,  # noqa: E731
                                                    lambda: seed, lambda: fast)
    assert pick("seed") == seed and pick("fast") == fast
    assert pick("fast", {"batch": 16}) == Rec(16) and pick("seed", {"batch": 8}) == seed
    with pytest.raises(ValueError, match="form='seed' is the chapter's fixed recipe"):
        pick("seed", Rec(16))
    with pytest.raises(ValueError, match=r"form='slow' is not valid; valid choices: \('seed', 'fast'\)"):
        pick("slow")
    assert given_recipe("fast", {"batch": 16}, Rec.from_dict, "side.recipe_for") == Rec(16)
    with pytest.raises(ValueError, match=r"recipe=None: pass the recipe of form='seed', e.g. side\.recipe_for"):
        given_recipe("seed", None, Rec.from_dict, "side.recipe_for")
