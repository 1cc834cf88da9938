"""R5's DDP worker on CPU (gloo, 2 processes) and the launcher's input checks."""
from __future__ import annotations

import pytest
import torch

from perfladder.config import get_config
from perfladder.torch import ddp_tokens
from perfladder.torch import ddp
from perfladder.torch.ddp import allreduce_seconds, cost_model_floor

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


def test_ddp_rung_predicts_then_measures_on_cpu(capsys):
    """R5's whole path (prediction, launch, aggregation, RungResult) with gloo on CPU;
    on a GPU box the same function runs with nccl. t_compute is planted as R3's."""
    from perfladder.timing import Throughput
    from perfladder.torch import Ladder
    from perfladder.torch.rungs import ddp_rung
    ladder = Ladder(CFG)
    ladder.throughputs["R3"] = Throughput(tokens_per_s=512.0, windows=[512.0], seconds=[1.0],
                                          steps_per_window=1, tokens_per_window=512, warmup=0)
    r5 = ddp_rung(ladder, [2], backend="gloo", compiled=False, bf16=False)
    printed = capsys.readouterr().out
    assert printed.index("R5 prediction k=2") < printed.index("R5 measured k=2")
    pred = ladder.predictions["R5"][0]
    assert pred["t_compute_s"] == 1.0 and pred["k"] == 2
    assert pred["floor_tokens_per_s"] < pred["linear_tokens_per_s"] == 2 * 32 * 16
    assert r5.name == "R5" and r5.kind == "multi-gpu" and r5.tokens_per_s > 0
    assert len(r5.windows) == CFG.windows and r5.extra["runs"][0]["bus_bw_measured"] > 0
    assert r5.ratio_prev is None and r5.mfu is None and r5.precision == "fp32"
    assert ladder.result.rungs == [r5]
