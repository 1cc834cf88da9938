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
