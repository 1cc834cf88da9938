"""notebooks/01_pytorch_ladder.ipynb runs top to bottom (smoke config) and writes valid results."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "01_pytorch_ladder.ipynb"


@pytest.mark.slow
def test_pytorch_notebook_runs_and_writes_results(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    from perfladder.results import validate

    monkeypatch.setenv("PERFLADDER_CONFIG", "smoke")
    monkeypatch.setenv("PERFLADDER_RESULTS_DIR", str(tmp_path))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert any(c.source.startswith("## Beyond the seed") for c in nb.cells)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    data = json.loads((tmp_path / "torch.json").read_text())
    validate(data, source="torch.json")
    assert data["framework"] == "torch" and data["config"]["name"] == "smoke"
    assert [r["name"] for r in data["rungs"]] == ["R0", "R1", "R2", "R3c", "R3", "R4", "R5",
                                                  "B1", "B2", "B3", "B4", "B5", "B6", "B7"]
    assert any("kernels" in r["extra"] for r in data["rungs"] if r["name"].startswith("B"))
    assert data["learning"]["passed"]
    assert (tmp_path / "torch_waterfall.png").stat().st_size > 1000
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.outputs)
    assert "perfladder config: smoke" in printed and "Self CPU" in printed
    assert "learning check: " in printed and "wrote " in printed
