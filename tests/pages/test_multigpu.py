"""The committed 2-GPU measurements the R5 cells of a ladder page show when the page's own run
has none (framework-free)."""
from __future__ import annotations

import json

from perfladder.pages import multigpu as mp


def test_committed_measurements_by_rung_and_framework():
    seed = mp.measurements("torch", "R5")
    assert seed and all(m["form"] == "seed" and m["mechanism"] == "ddp" for m in seed)
    fsdp = mp.measurements("jax", "R5f")
    assert fsdp and all(m["mechanism"] == "mesh-fsdp" for m in fsdp)
    assert mp.measurements("torch", "B1") == []
    for m in seed + fsdp:                    # prediction beside measurement, from the file itself
        assert m["predicted_tokens_per_s"] > 0 and m["measured_tokens_per_s"] > 0


def test_table_puts_the_prediction_beside_the_measurement(tmp_path):
    rows = [{"framework": "torch", "mechanism": "ddp", "form": "fast", "k": 2, "per_rank_batch": 8,
             "status": "measured", "predicted_tokens_per_s": 2.0e6, "measured_tokens_per_s": 1.5e6,
             "efficiency_vs_linear": None, "bus_bw_measured": 3e11, "spread": 0.01}]
    (tmp_path / "r5.json").write_text(json.dumps({"measurements": rows}))
    got = mp.measurements("torch", "R5x", root=tmp_path)
    assert got == rows
    html, text = mp.table_html(got), mp.table_text(got)
    assert "<table" in html and "2.00M" in html and "1.50M" in html and "n/a" in html
    assert text.splitlines()[1].split(" | ")[3:7] == ["2.00M", "-", "1.50M", "n/a"]   # no stored terms
    assert mp.measurements("torch", "R5x", root=tmp_path / "missing") == []


def test_the_table_calls_the_prediction_an_upper_estimate_and_prints_the_models_ceiling():
    """The committed run's no-overlap predictions are exceeded by none of its measurements: the
    table names the prediction an upper estimate (never a floor) and prints the model's own
    ceiling (the all-reduce wholly hidden), which bounds every measurement from above."""
    from perfladder.multigpu import costmodel
    rows = [m for rung in ("R5", "R5x", "R5f") for fw in ("torch", "jax") for m in mp.measurements(fw, rung)]
    assert rows and all(not h.endswith("floor)") for h in mp.HEAD) and "floor" not in " ".join(mp.HEAD)
    for m in rows:
        ceiling = mp.ceiling_of(m)
        assert ceiling == costmodel.ceiling_tokens_per_s(m["prediction"])
        assert m["measured_tokens_per_s"] <= m["predicted_tokens_per_s"] <= ceiling
    assert "floor" not in " ".join(costmodel.predict(2, 64, 128, 5e5, 18_929_664).assumptions)


def test_one_prediction_per_r5_rung_on_a_page():
    """A one-GPU run's R5 rung priced its own prediction from its own R0; the page shows the
    committed two-GPU measurement beside it, with that measurement's prediction. The card and
    the table show the same one."""
    from perfladder.pages import cards
    from perfladder.results.committed import read_run, reference_run
    from perfladder.words import rate
    res = read_run(reference_run(framework="torch") / "torch.json")
    r5 = res.rung("R5")
    assert not r5.measured and r5.prediction is not None
    [m] = mp.measurements("torch", "R5")
    assert r5.prediction.predicted_tokens_per_s != m["predicted_tokens_per_s"]    # two were priced
    shown = mp.shown_prediction("torch", r5)
    assert shown["predicted"] == m["predicted_tokens_per_s"] and shown["k"] == m["k"]
    line = dict(cards.card_rows(res, r5))["prediction"]
    assert f"predicted {rate(m['predicted_tokens_per_s'])} tokens/s at k = 2" in line
    assert rate(r5.prediction.predicted_tokens_per_s) not in line
    assert rate(m["predicted_tokens_per_s"]) in mp.table_text([m])


def test_the_page_names_the_link_the_committed_run_was_priced_with():
    row = mp.measurements("torch", "R5x")[0]
    assert row["prediction"]["link"] == "nvlink4-h200" and mp.joined_by(row) == "joined by NVLink"
    pcie = {**row, "prediction": {**row["prediction"], "link": "pcie-host-staged"}}
    assert mp.joined_by(pcie) == "joined by PCIe without peer-to-peer (4x RTX 4090): GPU -> host memory -> GPU"
    assert mp.joined_by({}) == "joined by an unrecorded link"
