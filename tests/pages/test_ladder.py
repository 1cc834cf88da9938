"""perfladder.pages.ladder: the live ladder runs through the real engine on a fake lab; on a smoke build
the page shows the committed reference run; ``save`` writes this build's ladder."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402
from _ladders import H200, ROOT, FakeModule  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.pages.ladder import LadderPage  # noqa: E402
from perfladder.results.committed import read_run  # noqa: E402
from perfladder.results.record import LadderResult  # noqa: E402


@pytest.fixture
def reference():
    return read_run(H200 / "torch.json")


def smoke_page(reference=None, **kw) -> LadderPage:
    return LadderPage("torch", get_config("smoke"), module=FakeModule(), reference=reference, **kw)


def test_smoke_page_runs_live_and_shows_the_reference(capsys, reference):
    page = smoke_page(reference)
    head = capsys.readouterr().out
    assert head.startswith("=" * 78) and "smoke configuration" in head
    assert "NOT performance results" in head and "NVIDIA H200" in head and "2026-11-29" in head
    assert page.shown is reference and page.live is page.ladder.result
    page.run("R0")
    page.run("R1")
    page.run("R2")
    out = capsys.readouterr().out
    assert [r.name for r in page.live.rungs] == ["R0", "R1", "R2"]          # ran live, in order
    assert "[smoke check, not a performance number (cpu)] R2 (+bf16) ran" in out
    assert "receipt logits bfloat16 (matches bf16)" in out
    assert "Reference run: NVIDIA H200, 2026-11-29" in out
    assert "R2 +bf16: 555k tokens/s, 0.79x R1, slower" in out                 # the reference's result
    assert "host-bound" in out


def test_smoke_page_says_when_the_reference_lacks_a_rung(capsys, reference):
    page = smoke_page(reference)
    for name in ("R0", "R1", "R2", "R3"):
        page.run(name)
    capsys.readouterr()
    reference.rungs = [r for r in reference.rungs if r.key != "fused_adamw"]
    page.run("B1")
    out = capsys.readouterr().out
    assert "has no rung for this technique (fused_adamw)" in out


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_reference_without_r5_still_shows_the_committed_multi_gpu_run(capsys, reference, framework):
    """The single-GPU reference ladder has no R5; the page shows the committed two-GPU
    measurements under the R5 cell in both frameworks, prediction beside measurement."""
    page = LadderPage(framework, get_config("smoke"), module=FakeModule(), reference=reference)
    for name in ("R0", "R1", "R2", "R3"):
        page.run(name)
    reference.rungs = [r for r in reference.rungs if not r.name.startswith("R5")]
    capsys.readouterr()
    page.run("R5")
    out = capsys.readouterr().out
    assert "does not measure data parallelism; the committed multi-GPU run does" in out
    assert "has no rung for this technique" not in out
    assert "predicted, no overlap (an upper estimate) | model ceiling (all-reduce hidden) | measured tokens/s" in out
    mech = {"torch": "ddp", "jax": "mesh"}[framework]
    assert any(line.startswith(f"{mech} | 2 |") for line in out.splitlines()), out


def test_gpu_only_rung_is_skipped_with_its_reason(capsys, reference):
    page = smoke_page(reference)
    for name in ("R0", "R1", "R2", "R3", "R5"):
        page.run(name)
    out = capsys.readouterr().out
    assert page.live.rung("R5").kind == "skipped"
    assert "R5 (data parallel) did not run here: not applicable on CPU: needs at least 2 GPUs" in out


def test_full_page_shows_its_own_numbers_and_reads_the_plan(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PERFLADDER_RESULTS_DIR", str(tmp_path))
    page = LadderPage("torch", get_config("full"), module=FakeModule(device="NVIDIA H200"))
    assert "Full configuration on NVIDIA H200" in capsys.readouterr().out
    assert page.shown is page.live and page.reference is None
    page.run("R0")
    page.run("R1")
    out = capsys.readouterr().out
    assert "R1 compile: 20.2k tokens/s, 2.00x R0, faster" in out               # this build's own
    assert "1 of 1 passed: compiled vs eager logits (max_abs_diff 1e-05)" in out
    assert "read as host-bound" in out
    assert "smoke check" not in out
    partial = LadderResult.read(tmp_path / "torch.partial.json")     # kept after every rung
    assert [r.name for r in partial.rungs] == ["R0", "R1"]


def test_page_cells_after_the_rungs(capsys, reference, tmp_path):
    page = smoke_page(reference)
    for name in page.fw.RUNGS:
        page.run(name)
    page.table()
    page.waterfall()
    page.kernel_report()
    page.learning_check()
    glued = page.glue()
    out = capsys.readouterr().out
    assert glued["fastest"] == page.reference.fastest_rung().name            # the prose reads the reference
    assert "B6 (batch x4), the fastest configuration: 94.69 ms/step of kernels" in out   # the reference's
    calls = page.fw.labs[0].calls
    assert "kernel breakdown ran" in out and calls[-2:] == ["kernels:B1", "learning:B1"]   # live, fastest
    assert "3.281" in out and "Passed: it learns" in out                       # the reference's learning check
    path, png = page.save(tmp_path)
    data = json.loads(path.read_text())
    assert data["framework"] == "torch" and data["config"]["name"] == "smoke"
    assert [r["name"] for r in data["rungs"]] == list(page.fw.RUNGS)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert LadderResult.read(path).learning.passed


def test_smoke_page_without_a_reference_shows_its_own_run(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("perfladder.pages.ladder.reference_run",
                        lambda **kw: (_ for _ in ()).throw(FileNotFoundError("no reference.txt here")))
    page = smoke_page()
    assert "no reference.txt here" in capsys.readouterr().out
    page.run("R0")
    out = capsys.readouterr().out
    assert page.shown is page.live and "a smoke check, not a performance number" in out


def test_bad_framework():
    with pytest.raises(ValueError, match=r"framework='numpy' is not valid; valid choices: \('torch', 'jax'\)"):
        LadderPage("numpy")


# -- the notebooks call declared rungs, each once, in ladder order ---------------------------------
def _rung_cells(notebook: str) -> list[str]:
    import re
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    return [m for c in nb["cells"] if c["cell_type"] == "code"
            for m in re.findall(r'page\.run\("([^"]+)"', "".join(c["source"]))]


@pytest.mark.parametrize("framework,notebook", [("torch", "01_pytorch_ladder.ipynb"),
                                                ("jax", "02_jax_ladder.ipynb")])
def test_notebook_runs_every_declared_rung_once(framework, notebook):
    from perfladder.ladder.engine import Rung
    fw = pytest.importorskip(f"perfladder.{framework}", reason=f"perfladder.{framework} does not import here")
    if not all(isinstance(r, Rung) for r in getattr(fw, "RUNGS", {}).values()):
        pytest.skip(f"perfladder.{framework}.RUNGS is not yet a registry of perfladder.ladder.engine.Rung")
    assert _rung_cells(notebook) == [n for n, r in fw.RUNGS.items() if not r.optional]


def test_a_smoke_rung_shows_its_result_line_and_one_labelled_folded_smoke_line(reference, monkeypatch):
    """What a reader sees of a rung on a smoke build: the reference's result line, the summary of
    its evidence, and one line saying the live check is no performance number; every smoke
    number folded under that line."""
    import perfladder.pages.ladder as ladder_mod
    from perfladder.pages import cards
    from perfladder.pages.narrative import SMOKE_LABEL
    from perfladder.pages.visible import visible_text
    shown: list[str] = []
    monkeypatch.setattr(ladder_mod, "display_html", lambda html, text: shown.append(html))
    page = smoke_page(reference)
    shown.clear()
    page.run("R0")
    page.run("R1")
    smoke = [h for h in shown if "perfladder-smoke" in h]
    assert len(smoke) == 2
    for h in smoke:
        assert visible_text(f"<article>{h}</article>") == f"{SMOKE_LABEL} (cpu)"   # nothing else visible
        assert "timed windows" in h                                               # ... but kept
    cards_html = [h for h in shown if "perfladder-card" in h]
    assert visible_text(f"<article>{cards_html[1]}</article>").replace(" ", "").startswith(
        cards.result_line(reference, reference.rung("R1")).replace(" ", ""))   # a glossary link splits its text
    assert sum(len(visible_text(f"<article>{h}</article>")) for h in shown) < 400
    # a term's first visible use is linked even when a fold above already used the term
    assert "term-settled" in cards_html[0] or any("term-settled" in h for h in smoke)
    assert "glossary.html#term-settled" in cards_html[1].split("<details")[0]


def test_what_a_smoke_run_prints_goes_into_its_folded_smoke_line(reference, monkeypatch, capsys):
    """The engine's note on a rung this machine cannot run (stderr) is smoke output: it lands in
    the rung's folded smoke line, not beside the reference's numbers."""
    import perfladder.pages.ladder as ladder_mod
    shown: list[str] = []
    monkeypatch.setattr(ladder_mod, "display_html", lambda html, text: shown.append(html))
    page = smoke_page(reference)
    for name in ("R0", "R1", "R2", "R3c", "R3", "B1", "R5"):
        page.run(name)
    captured = capsys.readouterr()
    assert not page.live.rung("R5").measured
    assert "perfladder:" not in captured.err + captured.out
    r5_smoke = [h for h in shown if "perfladder-smoke" in h and "R5 (data parallel) did not run here" in h]
    assert len(r5_smoke) == 1 and "perfladder: " in r5_smoke[0]


def test_the_committed_multi_gpu_run_is_named_once_per_page(reference, monkeypatch):
    """R5's cell names the two-GPU run; later multi-GPU rungs fold their table under a line that
    says where it was measured, without the sentence again."""
    import perfladder.pages.ladder as ladder_mod
    from perfladder.pages.visible import visible_text
    shown: list[str] = []
    monkeypatch.setattr(ladder_mod, "display_html", lambda html, text: shown.append(html))
    page = smoke_page(reference)
    shown.clear()                                                # the header
    page._committed_multi_gpu("R5")
    page._committed_multi_gpu("R5")
    if not shown:
        pytest.skip("no committed multi-GPU run for torch R5 in this checkout")
    first, second = (visible_text(f"<article>{h}</article>") for h in shown)
    assert first.startswith("Measured on ") and "each prediction written before its launch" in first
    assert not second.startswith("Measured on ") and "(measured on " in second
    assert "<table" in shown[1]                                  # the numbers, one click away


def test_glue_also_gives_other_pages_plain_text_under_the_framework(reference, monkeypatch):
    """Each glued value is glued again as plain text, ``torch_<key>``: MyST-NB pastes only plain
    text across pages (the exercises' solutions quote the ladder pages this way)."""
    import perfladder.pages.ladder as ladder_mod
    md, text = {}, {}
    monkeypatch.setattr(ladder_mod, "_glue",
                        lambda k, v, as_text=False: (text if as_text else md).__setitem__(k, v))
    page = smoke_page(reference)
    glued = page.glue()
    assert glued and md == glued
    assert {k: v for k, v in text.items() if k.startswith("torch_")} == {f"torch_{k}": v for k, v in glued.items()}
