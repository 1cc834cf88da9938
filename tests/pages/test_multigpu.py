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
    assert text.splitlines()[1].split(" | ")[3:6] == ["2.00M", "1.50M", "n/a"]
    assert mp.measurements("torch", "R5x", root=tmp_path / "missing") == []
