"""R5's DDP worker on CPU (gloo, 2 processes), the launcher's input checks, and the data-parallel
rungs: the prediction written before anything launches, and the measurement beside it."""
from __future__ import annotations

import pytest
import torch

from perfladder.config import get_config
from perfladder.ladder.engine import Chain, run_rung
from perfladder.measure.evidence import Timing
from perfladder.results.record import RungResult
from perfladder.torch import RUNGS, TorchLab
from perfladder.torch.parallel import launch as ddp
from perfladder.torch.recipe import Recipe
from perfladder.torch.rungs import multigpu as mg

CFG = get_config("smoke")


def test_gloo_two_ranks_hold_identical_parameters_after_a_step(tmp_path):
    res = ddp.data_parallel_tokens(2, CFG, "seed", parallel="ddp", backend="gloo", check_steps=1,
                                   bench_allreduce=False, out_dir=tmp_path, timeout=300)
    r0, r1 = res["ranks"]
    assert (r0["rank"], r1["rank"], r0["world_size"]) == (0, 1, 2)
    assert r0["first_batch_digest"] != r1["first_batch_digest"]      # each rank saw its own data
    assert r0["batch_digests"] == r1["batch_digests"] and len(set(r0["batch_digests"])) == 2   # checked
    assert r0["init_digest"] == r1["init_digest"]                    # same start
    assert r0["params_digest"] != r0["init_digest"]                  # and the step moved them
    p0, p1 = (torch.load(tmp_path / f"params_rank{r}.pt") for r in (0, 1))
    assert torch.equal(p0, p1)                                       # DDP kept the ranks identical


def test_nccl_k_larger_than_devices_is_an_error():
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=f"k={n + 1} .* {n} are present"):
        ddp.data_parallel_tokens(n + 1, CFG, backend="nccl")


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_k(k):
    with pytest.raises(ValueError, match="k="):
        ddp.data_parallel_tokens(k, CFG, backend="gloo")


def test_bad_backend_lists_choices():
    with pytest.raises(ValueError, match="'mpi'.*nccl.*gloo"):
        ddp.data_parallel_tokens(2, CFG, backend="mpi")


def test_worker_refuses_to_run_outside_torchrun(monkeypatch, capsys):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(SystemExit):
        ddp.main(["--spec", "spec.json", "--out", "out"])
    assert "torchrun" in capsys.readouterr().err


def test_multi_gpu_rungs_are_declared_last():
    assert [n for n, r in RUNGS.items() if r.stage == "multi-gpu"] == list(RUNGS)[-3:] == ["R5", "R5x", "R5f"]
    assert RUNGS["R5"].builds_on == "R0" and RUNGS["R5x"].builds_on is None    # R5x: the fastest
    assert all(RUNGS[n].kind == "multi-gpu" for n in ("R5", "R5x", "R5f"))


def _planted_base(lab, rate=512.0, windows=None):
    """R0 as if measured at ``rate`` tokens/s (t_compute = B*T/rate for the smoke sizes)."""
    windows = windows or [rate] * 3
    lab.result.add(RungResult(name="R0", key="eager", label="eager", tokens_per_s=rate,
                              batch_size=CFG.batch_size, seq_len=CFG.num_steps,
                              timing=Timing(windows=windows, seconds=[1.0] * 3, settled=3,
                                            stable=True, target_spread=0.3, steps_per_window=3,
                                            warmup=2)))


def test_one_device_predicts_and_says_it_measured_nothing(capsys):
    lab = TorchLab(CFG)
    _planted_base(lab)
    r5 = run_rung(RUNGS["R5"], lab, Chain(RUNGS, lab))
    printed = capsys.readouterr().out
    assert printed.index("predict k=2") < printed.index("predict k=8")   # printed before anything
    assert r5.kind == "skipped" and r5.tokens_per_s is None
    assert "at least 2" in r5.error and "not measured" in r5.error
    p = r5.prediction
    assert [q["k"] for q in p.points] == list(mg.PREDICT_KS)
    t_compute = CFG.batch_size * CFG.num_steps / 512.0
    assert all(q["t_compute_s"] == pytest.approx(t_compute) for q in p.points)
    assert p.points[0]["linear_tokens_per_s"] == pytest.approx(2 * 512.0)
    assert p.points[0]["predicted_tokens_per_s"] < p.points[0]["linear_tokens_per_s"]
    assert p.predicted_tokens_per_s == p.points[0]["predicted_tokens_per_s"]
    assert p.measured_tokens_per_s is None
    assert p.assumptions["single_gpu_source"] == "R0" and p.assumptions["link"]["name"] == "gloo-loopback"


@pytest.mark.parametrize("windows, settled", [(None, True), ([400.0, 512.0, 620.0], False)])
def test_ddp_rung_predicts_then_measures_with_two_cpu_ranks(monkeypatch, capsys, windows, settled):
    """R5's whole path -- prediction, launch, aggregation into a RungResult -- with two gloo
    ranks on CPU standing in for two GPUs; a base that did not settle gives no efficiency."""
    lab = TorchLab(CFG)
    _planted_base(lab, windows=windows)
    lab.on_gpu = True                                   # pretend: two devices ...
    monkeypatch.setattr(mg.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(lab, "reset_memory", lambda: None)
    real, launched = mg.dataparallel.measure, []

    def on_cpu(k, config, form, recipe, **kw):          # ... that are two CPU processes
        assert "R5 torch predict k=8" in capsys.readouterr().out        # predicted before launch
        launched.append((k, form, kw["parallel"], kw["link"]))
        return real(k, config, form, recipe, backend="gloo", timeout=300,
                    **{n: v for n, v in kw.items() if n != "link"}, link="gloo-loopback")
    monkeypatch.setattr(mg.dataparallel, "measure", on_cpu)
    r5 = run_rung(RUNGS["R5"], lab, Chain(RUNGS, lab))
    assert launched == [(2, "seed", "ddp", "nvlink4-h200")]
    assert r5.kind == "multi-gpu" and r5.tokens_per_s > 0 and r5.details["mechanism"] == "DDP x2", r5.error
    assert len(r5.windows) == CFG.windows and isinstance(r5.stable, bool)
    assert r5.prediction.measured_tokens_per_s == r5.tokens_per_s
    d = r5.details
    assert d["k"] == 2 and d["per_rank_batch"] == CFG.batch_size and d["bus_bw_measured"] > 0
    if settled:
        assert d["efficiency_vs_linear"] == pytest.approx(r5.tokens_per_s / (2 * 512.0))
    else:
        assert d["efficiency_vs_linear"] is None and "did not settle" in d["efficiency_note"]
    assert r5.precision == "tf32" and r5.batch_size == CFG.batch_size


def test_the_fast_form_carries_what_ddp_can_and_says_what_it_cannot():
    r = Recipe(batch_size=8, compiled=True, bf16=True, cudagraphs=True, optimizer="fused",
               embed="onehot", fused=("rope",))
    d, dropped = mg.ddp_recipe(r)
    assert d["fused"] == ["rope"] and d["optimizer"] == "fused" and d["embed"] == "onehot"
    assert d["mode"] is None and dropped == ["cudagraphs"]
