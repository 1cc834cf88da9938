"""R5's DDP worker on CPU (gloo, 2 processes), the launcher's input checks, and the data-parallel
rungs: the prediction written before anything launches, and the measurement beside it."""
from __future__ import annotations

import pytest
import torch

from perfladder.config import get_config
from perfladder.evidence import Timing
from perfladder.results import RungResult
from perfladder.torch import RUNGS, TorchLab, ddp
from perfladder.torch import multigpu as mg
from perfladder.torch.ddp import allreduce_seconds, cost_model_floor, ddp_tokens
from perfladder.torch.recipe import Recipe

CFG = get_config("smoke")


def test_gloo_two_ranks_hold_identical_parameters_after_a_step(tmp_path):
    res = ddp_tokens(2, CFG, backend="gloo", compiled=False, bf16=False, check_steps=1,
                     bench_allreduce=False, out_dir=tmp_path, timeout=300)
    r0, r1 = res["ranks"]
    assert (r0["rank"], r1["rank"], r0["world_size"]) == (0, 1, 2)
    assert r0["first_batch_digest"] != r1["first_batch_digest"]      # each rank saw its own data
    assert r0["init_digest"] == r1["init_digest"]                    # same start
    assert r0["params_digest"] != r0["init_digest"]                  # and the step moved them
    p0, p1 = (torch.load(tmp_path / f"params_rank{r}.pt") for r in (0, 1))
    assert torch.equal(p0, p1)                                       # DDP kept the ranks identical


def test_nccl_k_larger_than_devices_is_an_error():
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=f"k={n + 1} .* {n} are present"):
        ddp_tokens(n + 1, CFG, backend="nccl")


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_k(k):
    with pytest.raises(ValueError, match="k="):
        ddp_tokens(k, CFG, backend="gloo")


def test_bad_backend_lists_choices():
    with pytest.raises(ValueError, match="'mpi'.*nccl.*gloo"):
        ddp_tokens(2, CFG, backend="mpi")


def test_cost_model_floor():
    # 2 ranks, 1 s compute, 1e9 params * 4 B at 4e9 B/s: ring moves 2*(1/2)*4e9 B -> 1 s
    assert allreduce_seconds(1_000_000_000, 2, 4e9) == pytest.approx(1.0)
    p = cost_model_floor(2, 64, 128, 1.0, 1_000_000_000, 4e9)
    assert p["floor_tokens_per_s"] == pytest.approx(2 * 64 * 128 / 2.0)
    assert p["linear_tokens_per_s"] == pytest.approx(2 * 64 * 128)
    assert cost_model_floor(4, 64, 128, 1.0, 10, 1e12)["floor_tokens_per_s"] == pytest.approx(
        4 * 64 * 128, rel=1e-6)                                       # free comm -> linear


def test_worker_refuses_to_run_outside_torchrun(monkeypatch, capsys):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(SystemExit):
        ddp.main(["--spec", "spec.json", "--out", "out"])
    assert "torchrun" in capsys.readouterr().err


def test_multi_gpu_rungs_are_declared_last():
    assert [n for n, r in RUNGS.items() if r.stage == "multi-gpu"] == list(RUNGS)[-2:] == ["R5", "R5x"]
    assert RUNGS["R5"].builds_on == "R0" and RUNGS["R5x"].builds_on is None    # R5x: the fastest
    assert all(RUNGS[n].kind == "multi-gpu" for n in ("R5", "R5x"))


def _planted_base(lab, rate=512.0, stable=True):
    """R0 as if measured at ``rate`` tokens/s (t_compute = B*T/rate = 0.25 s for the smoke sizes)."""
    lab.result.add(RungResult(name="R0", key="eager", label="eager", tokens_per_s=rate,
                              batch_size=CFG.batch_size, seq_len=CFG.num_steps,
                              timing=Timing(windows=[rate] * 3, seconds=[1.0] * 3, settled=3,
                                            stable=stable, target_spread=0.3, steps_per_window=3,
                                            warmup=2)))


def test_one_device_predicts_and_says_it_measured_nothing(capsys):
    lab = TorchLab(CFG)
    _planted_base(lab)
    r5 = mg.data_parallel(lab, "R5", "DDP", lab.seed_recipe(), "R0")
    printed = capsys.readouterr().out
    assert printed.index("prediction k=2") < printed.index("prediction k=8")
    assert r5.kind == "skipped" and r5.tokens_per_s is None
    assert "data parallelism needs at least 2" in r5.error and "predicted, not measured" in r5.error
    p = r5.prediction
    assert [q["k"] for q in p.points] == list(mg.PREDICT_KS)
    t_compute = CFG.batch_size * CFG.num_steps / 512.0
    assert all(q["t_compute_s"] == pytest.approx(t_compute) for q in p.points)
    assert p.points[0]["linear_tokens_per_s"] == pytest.approx(2 * 512.0)
    assert p.points[0]["floor_tokens_per_s"] < p.points[0]["linear_tokens_per_s"]
    assert p.predicted_tokens_per_s == p.points[0]["floor_tokens_per_s"] and p.measured_tokens_per_s is None
    assert p.assumptions["single_device_source"] == "R0" and p.assumptions["backend"] == "gloo"


def test_an_unsettled_base_is_measured_again_for_the_prediction(monkeypatch):
    lab = TorchLab(CFG)
    _planted_base(lab, stable=False)
    timed = []
    real = lab.measure
    monkeypatch.setattr(lab, "measure", lambda *a, **kw: timed.append(a) or real(*a, **kw))
    rate, source = mg.single_rate(lab, "R0", lab.seed_recipe())
    assert source == "measured for this rung" and rate > 0 and len(timed) == 1
    _, source = mg.single_rate(lab, "R9", lab.seed_recipe())      # a base not in this run
    assert source == "measured for this rung"


def test_ddp_rung_predicts_then_measures_with_two_cpu_ranks(monkeypatch, capsys):
    """R5's whole path -- prediction, launch, aggregation into a RungResult -- with two gloo
    ranks on CPU standing in for two GPUs (on a GPU box the same code launches nccl)."""
    lab = TorchLab(CFG)
    _planted_base(lab)
    lab.on_gpu = True                                   # pretend: two devices ...
    monkeypatch.setattr(mg.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(lab, "reset_memory", lambda: None)
    launched = []

    def on_cpu(k, config, backend, **kw):               # ... that are two CPU processes
        out = ddp_tokens(k, config, backend="gloo", batch_size=kw["batch_size"], compiled=False,
                         bf16=kw["bf16"], bench_allreduce=True, timeout=300)
        launched.append((k, backend, out))
        return out
    monkeypatch.setattr(mg.ddp, "ddp_tokens", on_cpu)
    recipe = Recipe(batch_size=CFG.batch_size)
    r5 = mg.data_parallel(lab, "R5", "DDP", recipe, "R0")
    printed = capsys.readouterr().out
    assert "prediction k=2" in printed and launched[0][:2] == (2, "nccl")
    assert r5.kind == "multi-gpu" and r5.tokens_per_s > 0 and r5.label == "DDP x2"
    assert len(r5.windows) == CFG.windows and isinstance(r5.stable, bool)
    assert r5.timing.target_spread == CFG.target_spread
    assert r5.prediction.measured_tokens_per_s == r5.tokens_per_s
    assert r5.prediction.predicted_tokens_per_s == r5.prediction.points[0]["floor_tokens_per_s"]
    d = r5.details
    assert d["k"] == 2 and d["per_rank_batch"] == CFG.batch_size and d["bus_bw_measured"] > 0
    assert d["efficiency_vs_linear"] == pytest.approx(r5.tokens_per_s / (2 * 512.0))
    assert r5.precision == "tf32" and r5.batch_size == CFG.batch_size
    # a rank that settled and stopped early would leave the other waiting in the all-reduce:
    # every rank times exactly config.windows windows, and the rung adds them up
    ranks = launched[0][2]["ranks"]
    assert [len(r["windows"]) for r in ranks] == [CFG.windows, CFG.windows]
    assert r5.windows == pytest.approx([a + b for a, b in zip(*(r["windows"] for r in ranks))])
    assert r5.tokens_per_s == pytest.approx(sum(r["tokens_per_s"] for r in ranks))
    assert r5.stable == all(r["stable"] for r in ranks)
