"""One ceiling per run: the model's tokens/s at the bf16 matmul rate the run itself probed,
named with its probe, the one number every page, figure and inserted value reads for that run."""
from __future__ import annotations

import pytest
from _ladders import seed_ladder

from perfladder.kernels.ceiling import ceiling, model_flops_per_token, probe_spread, spread_sentence
from perfladder.results.committed import read_run, reference_run


def test_a_run_is_read_against_its_own_probe():
    a = seed_ladder(roofs={"matmul_bf16_tflops": 700.0, "source": "probe A"})
    b = seed_ladder(roofs={"matmul_bf16_tflops": 800.0, "source": "probe B"})
    ca, cb = ceiling(a), ceiling(b)
    fpt = model_flops_per_token(a.config)
    assert ca["tokens_per_s"] == pytest.approx(700e12 / fpt) and cb["tokens_per_s"] == pytest.approx(800e12 / fpt)
    assert ca["source"] == "probe A" and "probe A" in ca["label"] and "700 TFLOP/s" in ca["label"]
    assert ceiling(seed_ladder()) is None


def test_every_page_reads_the_same_ceiling_of_a_run():
    """The PyTorch reference run: its waterfall's line, its ladder page's inserted ceiling and
    the claims' ceiling are one number, its own probe's (not the device probe beside it, not the
    highest rate measured on the device)."""
    from perfladder.pages import claims, plot
    from perfladder.pages.story import ladder_numbers
    from perfladder.words import rate
    res = read_run(reference_run(framework="torch") / "torch.json")
    c = ceiling(res)
    assert c["tflops"] == res.roofs["matmul_bf16_tflops"]
    assert claims.ceiling(res) == c and plot.device_ceilings([res]) == [c]
    assert ladder_numbers(res)["ceiling_rate"] == rate(c["tokens_per_s"])
    assert ladder_numbers(res)["ceiling_source"] == c["source"]


def test_the_spread_of_one_devices_probes_is_said_once():
    runs = [seed_ladder(roofs={"matmul_bf16_tflops": tf}) for tf in (700.0, 790.0)]
    runs.append(seed_ladder(roofs={"matmul_bf16_tflops": 650.0}, framework="jax"))
    [torch, jax] = probe_spread(runs)
    assert (torch["framework"], torch["runs"], torch["low"], torch["high"]) == ("torch", 2, 700.0, 790.0)
    assert torch["spread"] == pytest.approx(790 / 700 - 1) and jax["runs"] == 1
    text = spread_sentence(runs)
    assert "between 700 and 790 TFLOP/s over 2 runs (13% apart)" in text and "its own probe" in text
    assert "JAX" not in text                              # one run: nothing to compare
    assert spread_sentence(runs[:1]) == ""
