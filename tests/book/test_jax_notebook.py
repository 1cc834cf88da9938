"""notebooks/02_jax_ladder.ipynb ran top to bottom in a fresh kernel (smoke config, CPU) and
wrote a valid jax.json and the waterfall PNG: read from the session's smoke build of the book
(conftest.smoke_book), which executes every notebook once for the book tests and these."""
import pytest

from perfladder.results.record import LadderResult


def _stream(nb) -> str:
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs if o.get("output_type") == "stream")


def _displayed(nb) -> str:
    return "\n".join(str(o.get("data", {}).get("text/plain", "")) for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs if o.get("output_type") == "display_data")


@pytest.mark.slow
def test_jax_notebook_runs_and_writes_results(smoke_book):
    nb = smoke_book.notebook("02_jax_ladder")
    import perfladder.jax as fw

    result = LadderResult.read(smoke_book.results / "jax.json")
    assert result.framework == "jax" and result.config["name"] == "smoke" and result.baseline == "R1"
    assert [r.name for r in result.rungs] == [n for n, r in fw.RUNGS.items() if not r.optional]
    assert any(r.kernels for r in result.rungs)
    # XLA:CPU's fusions named with the part of the GPT each came from (perfladder.jax.frames)
    report = next(r.kernels for r in result.rungs if r.kernels)
    assert any(k["name"].endswith(("[GELU]", "[LayerNorm]", "[attention]")) for k in report["top"])
    assert result.rung("R2a").receipt.observed and not result.rung("R2a").receipt.ok
    assert result.rung("R2").receipt.ok
    assert result.learning is not None and result.learning.passed
    assert (smoke_book.results / "jax_waterfall.png").stat().st_size > 1000
    text = _stream(nb)
    assert "perfladder config: smoke" in text
    # the R2 lesson, step by step, each with its receipt
    assert "receipt, the first activation: float32" in text            # the naive cast
    assert "receipt, the first activation: bfloat16" in text           # rebuilt with a compute dtype
    assert "attention refused q, k float32 with v bfloat16" in text    # mixed dtypes, refused
    assert "-> attention: bfloat16" in text                            # the RoPE cast fix
    shown = _displayed(nb)
    assert "R2 (+bf16 (threaded)) ran" in shown and "logits bfloat16 (matches bf16)" in shown
    assert "R2a (naive bf16 cast) ran" in shown and "(does not match bf16)" in shown
    # R5 on a CPU build: the committed two-GPU mesh measurements, as on the PyTorch page
    assert "predicted, no overlap (an upper estimate) | model ceiling (all-reduce hidden) | measured tokens/s" in shown and "mesh | 2 |" in shown
