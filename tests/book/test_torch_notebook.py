"""notebooks/01_pytorch_ladder.ipynb ran top to bottom in a fresh kernel (smoke config, CPU)
and wrote valid results: read from the session's smoke build of the book (conftest.smoke_book),
which executes every notebook once for the book tests and these."""
from __future__ import annotations

import pytest

from perfladder.results.record import LadderResult


def _outputs(nb) -> str:
    parts = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            parts.append(o.get("text", ""))
            parts += [str(v) for k, v in o.get("data", {}).items() if k in ("text/html", "text/plain")]
    return "\n".join(parts)


@pytest.mark.slow
def test_pytorch_notebook_runs_and_writes_results(smoke_book):
    nb = smoke_book.notebook("01_pytorch_ladder")
    import perfladder.torch as fw

    result = LadderResult.read(smoke_book.results / "torch.json")
    assert result.framework == "torch" and result.config["name"] == "smoke"
    assert [r.name for r in result.rungs] == [n for n, r in fw.RUNGS.items() if not r.optional]
    assert any(r.kernels for r in result.rungs)                       # the live kernel breakdown
    assert result.learning is not None and result.learning.passed
    assert (smoke_book.results / "torch_waterfall.png").stat().st_size > 1000
    text = _outputs(nb)
    assert "perfladder config: smoke" in text
    for r in result.rungs:                                             # one live check per rung
        assert f"[smoke check, not a performance number (cpu)] {r.name} (" in text, r.name
    assert "Reference run: NVIDIA H200" in text                        # the committed run, shown
    from perfladder.pages.claims import call
    from perfladder.results.committed import read_run, reference_run
    ref = read_run(reference_run(framework="torch") / "torch.json")
    credited = call(ref, ref.rung("R1")).credited                     # its card, by the credit rule:
    assert "R1 compile: " in text and (("x R0" in text) if credited     # a ratio where one is credited,
                                      else "no verdict on time against R0" in text)   # else why not
    # R5 on a CPU build: the committed two-GPU measurements, prediction beside measurement
    assert "predicted, no overlap (an upper estimate) | model ceiling (all-reduce hidden) | measured tokens/s" in text
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 5        # waterfall, memory, timeline, roofline, loss curve
