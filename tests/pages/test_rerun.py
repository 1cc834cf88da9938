"""perfladder.pages.rerun and the page's cells run again: the new rate beside the one it
replaced (and the reference run's on a smoke build), the marks of rungs built on an earlier
version in the card, the table, the waterfall, the glue cell and the saved file; every cell
after the rungs can run twice. The live ladder runs through the real engine on a fake lab."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402
from _ladders import H200, FakeModule  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.pages import cards, plot, report  # noqa: E402
from perfladder.pages.ladder import LadderPage  # noqa: E402
from perfladder.results.committed import read_run  # noqa: E402
from perfladder.results.record import LadderResult  # noqa: E402


@pytest.fixture
def reference():
    return read_run(H200 / "torch.json")


def test_smoke_page_a_cell_run_again_shows_old_new_and_reference(capsys, reference, tmp_path):
    page = LadderPage("torch", get_config("smoke"), module=FakeModule(), reference=reference)
    for name in ("R0", "R1", "R2", "R3"):
        page.run(name)
    first = page.live.rung("R1").tokens_per_s
    capsys.readouterr()
    page.run("R1", compile_model=lambda model, mode=None: model)
    out = capsys.readouterr().out
    ref = reference.by_key("compile")
    assert (f"Run again: {cards.rate(first)} tokens/s here; the version it replaced: {cards.rate(first)} "
            f"tokens/s (this one 1.00x that); the reference run (NVIDIA H200, 2026-11-29): "
            f"{cards.rate(ref.tokens_per_s)} tokens/s.") in out
    assert [r.name for r in page.live.rungs] == ["R0", "R1", "R2", "R3"]
    marked = {r.name: r.built_on_earlier for r in page.live.rungs if r.built_on_earlier}
    assert marked == {"R2": ["R1"], "R3": ["R1"]}
    for cell in (page.table, page.waterfall, page.glue):
        cell()
        out = capsys.readouterr().out
        assert "Run again in this session: R1." in out, cell
        assert "R2 (of R1); R3 (of R1)" in out, cell
    page.run("R3")                           # on R2, which is still on the earlier R1
    assert "It is built on an earlier version of R1." in capsys.readouterr().out
    path, _ = page.save(tmp_path)
    assert "R2 (of R1); R3 (of R1)" in capsys.readouterr().out
    saved = {r["name"]: r for r in json.loads(path.read_text())["rungs"]}
    assert saved["R2"]["built_on_earlier"] == ["R1"] and saved["R1"]["replaces"]["tokens_per_s"] == first
    assert saved["R3"]["replaces"] is not None and saved["R0"]["built_on_earlier"] == []


def test_full_page_marks_in_card_table_and_waterfall(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PERFLADDER_RESULTS_DIR", str(tmp_path))
    page = LadderPage("torch", get_config("full"), module=FakeModule(device="NVIDIA H200"))
    for name in ("R0", "R1", "R2"):
        page.run(name)
    capsys.readouterr()
    page.run("R1")
    out = capsys.readouterr().out
    assert "R1 compile: 20.2k tokens/s, 2.00x R0, faster [the version it replaced: 20.2k tokens/s" in out
    r2 = page.live.rung("R2")
    assert "built on an earlier version of R1" in cards.result_line(page.live, r2)
    assert ("built on", cards.compact_rows(page.live, r2)[0][1]) == cards.compact_rows(page.live, r2)[0]
    assert "on an earlier R1" in report.ladder_table_html(page.live)
    assert "built on an earlier version of R1" in report.text_table(page.live)
    assert plot.bar_label(page.live, r2) == "on earlier\nR1"
    assert r2.ratio_prev is None                                       # nothing read across versions
    assert page.glue()["R2_ratio"].endswith("no ratio credited (R2 ran on an earlier R1)")   # the prose's number
    partial = LadderResult.read(tmp_path / "torch.partial.json")
    assert partial.rung("R2").built_on_earlier == ["R1"]
    page.run("R2")
    assert page.live.rung("R2").built_on_earlier == [] and page.live.rung("R2").ratio_prev is not None
    assert page.rerun_note() == "Run again in this session: R1 and R2."


def test_every_cell_after_the_rungs_runs_twice(capsys, reference, tmp_path):
    page = LadderPage("torch", get_config("smoke"), module=FakeModule(), reference=reference)
    for name in page.fw.RUNGS:
        page.run(name)
    capsys.readouterr()
    outs = []
    for _ in range(2):
        for cell in (page.waterfall, page.table, page.kernel_report, page.learning_check, page.glue):
            cell()
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "Run again" not in outs[1]
    assert page.fw.labs[0].calls[-4:] == ["kernels:B1", "learning:B1", "kernels:B1", "learning:B1"]
    page.save(tmp_path)
    page.save(tmp_path)
    assert LadderResult.read(tmp_path / "torch.json").learning.passed


def test_beyond_and_multi_gpu_cells_run_again(capsys, reference):
    page = LadderPage("torch", get_config("smoke"), module=FakeModule(), reference=reference)
    for name in page.fw.RUNGS:
        page.run(name)
    capsys.readouterr()
    page.run("B1")                                                     # a beyond rung
    out = capsys.readouterr().out
    ref = reference.by_key("fused_adamw")
    assert f"the reference run (NVIDIA H200, 2026-11-29): {cards.rate(ref.tokens_per_s)} tokens/s" in out
    assert page.live.rung("B1").kept and page.ladder.fastest()[0] == "B1"
    page.run("R3")                                                     # the seed top: B1 stands on it
    assert page.live.rung("B1").built_on_earlier == ["R3"]
    capsys.readouterr()
    page.run("R5")                                                     # not applicable here: said again
    out = capsys.readouterr().out
    assert "R5 (data parallel) did not run here: not applicable on CPU" in out and "Run again:" not in out
    assert page.live.rung("R5").built_on_earlier == [] and [r.name for r in page.live.rungs] == list(page.fw.RUNGS)
