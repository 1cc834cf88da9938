"""notebooks/01_pytorch_ladder.ipynb ran top to bottom in a fresh kernel (smoke config, CPU)
and wrote valid results: read from the session's smoke build of the book (conftest.smoke_book),
which executes every notebook once for the book tests and these."""
from __future__ import annotations

import json

import pytest

from perfladder.results import validate


@pytest.mark.slow
def test_pytorch_notebook_runs_and_writes_results(smoke_book):
    nb = smoke_book.notebook("01_pytorch_ladder")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert any(c.source.startswith("## Beyond the seed") for c in nb.cells)

    data = json.loads((smoke_book.results / "torch.json").read_text())
    validate(data, source="torch.json")
    assert data["framework"] == "torch" and data["config"]["name"] == "smoke"
    assert [r["name"] for r in data["rungs"]] == ["R0", "R1", "R2", "R3c", "R3", "R4", "R5",
                                                  "B1", "B2", "B3", "B4", "B5", "B6", "B7"]
    assert any("kernels" in r["extra"] for r in data["rungs"] if r["name"].startswith("B"))
    assert data["learning"]["passed"]
    assert (smoke_book.results / "torch_waterfall.png").stat().st_size > 1000
    printed = "".join(o.get("text", "") for c in code for o in c.outputs)
    assert "perfladder config: smoke" in printed and "Self CPU" in printed
    assert "learning check: " in printed and "wrote " in printed
