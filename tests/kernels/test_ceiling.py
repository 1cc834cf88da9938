"""One ceiling per run: the model's tokens/s at the bf16 matmul rate the run itself probed,
named with its probe, the one number every page, figure and inserted value reads for that run."""
from __future__ import annotations

import pytest
from _ladders import seed_ladder

from perfladder.kernels.ceiling import (PROBED_WORDS, TIMED_WORDS, ceiling, model_flops_per_token,
                                        probe_spread, spread_sentence, timed_as)
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
    assert "PyTorch's probe (one product at a time) on the" in text
    assert "JAX" not in text                              # one run: nothing to compare
    assert spread_sentence(runs[:1]) == ""


def test_probes_timed_differently_are_never_one_spread():
    """A lone product reads a power-capped card at a higher clock than chains of products: a
    PyTorch run probed each way is two quantities, each with its own spread."""
    chain = "median of 10 CUDA-event-timed repeats after 3 warm-ups, each a chain of 10 dependent ..."
    lone = "median of 10 CUDA-event-timed repeats after 3 warm-ups; random data; matmul 8192^3"
    runs = [seed_ladder(roofs={"matmul_bf16_tflops": tf, "method": m})
            for tf, m in ((790.0, lone), (780.0, lone), (720.0, chain), (700.0, chain))]
    runs.append(seed_ladder(roofs={"matmul_bf16_tflops": 690.0, "method": "each a jitted loop of 10: ..."},
                            framework="jax"))
    spreads = probe_spread(runs)
    assert [(s["framework"], s["timed"], s["runs"], s["low"], s["high"]) for s in spreads] == [
        ("torch", "one product", 2, 780.0, 790.0), ("torch", "chains", 2, 700.0, 720.0),
        ("jax", "chains", 1, 690.0, 690.0)]
    text = spread_sentence(runs)
    assert "(one product at a time) on the NVIDIA H200 measured between 780 and 790" in text
    assert "(chains of products) on the NVIDIA H200 measured between 700 and 720" in text
    # every way of timing has its words, in the sentence and in the table of ceilings
    assert {timed_as(r.roofs) for r in runs} == set(TIMED_WORDS) == set(PROBED_WORDS)


def test_the_case_studys_reason_for_timing_chains_holds_in_its_committed_probe():
    """chapter13/case_study.md says a product timed alone reads higher than products back to back,
    citing the committed probe: in each of its files PyTorch's lone product is faster than every
    chain of 10 or more, and the logged SM clock fell below its maximum while they ran."""
    import csv
    import json

    from perfladder.paths import repo_root
    root = repo_root()
    folder = root / "benchmarks" / "results" / "h100-matmul-probe-2026-12-07"
    assert f"benchmarks/results/{folder.name}/" in (root / "chapter13" / "case_study.md").read_text()
    files = sorted(folder.glob("probe_*.json"))
    assert files
    for f in files:
        rates = json.loads(f.read_text())["torch"]
        chains = [v for k, v in rates.items() if k in ("loop10_scaled", "loop30_scaled")]
        assert len(chains) == 2 and rates["single_raw (device probe)"] > max(chains), f.name
    clocks = [int(row[1].split()[0]) for row in csv.reader((folder / "smi.csv").open(), skipinitialspace=True)]
    loaded = clocks[clocks.index(max(clocks)):]              # from the first sample at full clock on
    assert min(loaded) < 0.9 * max(clocks)
