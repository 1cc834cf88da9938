"""notebooks/02_jax_ladder.ipynb ran top to bottom in a fresh kernel (smoke config, CPU) and
wrote a valid jax.json and the waterfall PNG: read from the session's smoke build of the book
(conftest.smoke_book), which executes every notebook once for the book tests and these."""
import json
import re

import pytest


@pytest.mark.slow
def test_jax_notebook_runs_and_writes_results(smoke_book):
    nb = smoke_book.notebook("02_jax_ladder")
    results = smoke_book.results
    from perfladder.results import LadderResult, validate
    data = json.loads((results / "jax.json").read_text())
    validate(data)
    result = LadderResult.from_dict(data)
    assert result.framework == "jax" and result.config["name"] == "smoke" and result.baseline == "R1"
    assert [r.name for r in result.rungs] == ["R0", "R1", "R2a", "R2", "R3c", "R3", "R4", "R5",
                                              "B1", "B2", "B3", "B4", "B5", "B6"]
    trained = [re.match(r"learning check: trained (\w+)'s configuration", n) for n in result.notes]
    fastest = [m.group(1) for m in trained if m]
    assert len(fastest) == 1 and "kernels" in result.rung(fastest[0]).extra   # kernel breakdown
    assert result.rung("R2a").extra["receipt"] == "float32"
    assert result.rung("R2").extra["receipt"] == "bfloat16"
    assert result.learning is not None and result.learning.passed
    assert (results / "jax_waterfall.png").stat().st_size > 1000
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs if o.get("output_type") == "stream")
    assert "perfladder config: smoke" in text and "receipt: first activation is float32" in text
    assert "one device visible" in text and "prediction for k=8" in text
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert len(images) >= 3                          # seed waterfall, continued waterfall, loss curve
    assert "fastest configuration: B" in text or "fastest configuration: R3" in text
    headings = [c.source for c in nb.cells if c.cell_type == "markdown"]
    assert any(h.lstrip().startswith("## Beyond the seed") for h in headings)
