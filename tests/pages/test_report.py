"""perfladder.pages.report / cards: the tables, the rung views, and the crediting rules they read.

Read against the committed H200 runs (version-1 files, read as version 2) and synthetic
version-2 ladders (tests/_ladders.py), so each sentence is checked against the numbers it
is computed from.
"""
from __future__ import annotations

import html
import re

import pytest
from _ladders import H200, ROOT, result, rung, seed_ladder

from perfladder.config import get_config
from perfladder.measure.evidence import Prediction
from perfladder.pages import cards, kernel_report, report, words
from perfladder.pages.claims import call, short_reason
from perfladder.results.committed import read_run
from perfladder.results.record import LadderResult


def heads(html: str) -> list[str]:
    """The header cells of an HTML table."""
    return re.findall(r"<th(?:\s[^>]*)?>(.*?)</th>", html)


@pytest.fixture(scope="module")
def h200():
    return {fw: read_run(H200 / f"{fw}.json") for fw in ("torch", "jax")}


# -- what may be said: the crediting rules (claims.call) the cards, tables and checks all read --------
def test_unsettled_rung_is_never_credited():
    r = seed_ladder()
    b1 = r.rung("B1")
    c = call(r, b1)
    assert c.word == "unsettled" and c.ratio is None and c.label == "" and not c.credited
    line = cards.result_line(r, b1)
    assert "no verdict on time against R3 (B1's windows did not settle" in line
    assert f"{b1.tokens_per_s / r.rung('R3').tokens_per_s:.2f}" not in line
    row = next(x for x in report.ladder_rows(r) if ">B1<" in x[0])
    assert row[2].startswith("–") and "unsettled" in row[2] and "did not settle" in row[1]


def test_a_memory_technique_says_what_it_bought_against_its_base():
    """R4's line: its memory against R3's, measured alike, even where time has no verdict."""
    for fw in ("torch", "jax"):
        from perfladder.results.committed import read_run, reference_run
        res = read_run(reference_run(framework=fw) / f"{fw}.json")
        r4, r3 = res.rung("R4"), res.rung("R3")
        line = cards.result_line(res, r4)
        assert f"memory {words.gib(r4.memory.bytes)} against R3's {words.gib(r3.memory.bytes)}" in line
        assert f"{r4.memory.bytes / r3.memory.bytes:.2f}x" in line
        assert "memory" not in cards.result_line(res, r3).split("tokens/s", 1)[1]   # only the memory rungs


def test_loss_against_an_unsettled_base_is_still_a_loss():
    r = result([rung("R0", "eager", [50e3, 51e3, 52e3]),
                rung("R1", "compile", [100e3, 150e3, 200e3], "R0", stable=False),
                rung("R2", "bf16", [60e3, 61e3, 62e3], "R1")])
    c = call(r, r.rung("R2"))
    assert r.rung("R2").verdict["verdict"] == "unsettled"
    assert c.word == "slower" and c.ratio == pytest.approx(61e3 / 150e3) and c.shaky
    assert "R1's windows did not settle" in c.shaky
    assert "slower" in cards.result_line(r, r.rung("R2"))


def test_a_rung_above_every_window_of_an_unsettled_base_is_credited_nothing():
    """The one credit rule (``verdict.credit``): an unsettled comparison gets no credited ratio,
    not even the bound every window allows."""
    r = result([rung("R0", "eager", [50e3, 51e3, 52e3]),
                rung("R1", "compile", [100e3, 150e3, 200e3], "R0", stable=False),
                rung("R2", "bf16", [300e3, 301e3, 302e3], "R1")])
    c = call(r, r.rung("R2"))
    assert c.word == "unsettled" and not c.credited and c.ratio is None and c.bound is None
    line = cards.result_line(r, r.rung("R2"))
    assert "no verdict on time" in line and "at least" not in line and "1.50x" not in line


def test_prediction_beside_measurement():
    r = result([rung("R0", "eager", [1e5, 1e5, 1e5]),
                rung("R5", "data_parallel", [1.6e5, 1.6e5, 1.6e5], "R0", kind="multi-gpu", stage="multi-gpu",
                     prediction=Prediction("two-term cost model", 2e5, {"k": 2}, measured_tokens_per_s=1.6e5))])
    rows = dict(cards.card_rows(r, r.rung("R5")))
    assert "predicted 200k tokens/s, measured 160k" in rows["prediction"] and "k 2" in rows["prediction"]
    assert sum(k == "prediction" for k, _ in cards.card_rows(r, r.rung("R5"))) == 1   # one prediction


def test_smoke_ladder_is_a_code_check():
    r = seed_ladder("smoke")
    assert "a smoke check, not a performance number" in cards.result_line(r, r.rung("R2"))
    assert "Smoke run" in report.ladder_table_html(r)
    assert call(r, r.rung("R1")).word == "smoke" and call(r, r.rung("R1")).ratio is None
    assert "2.00x" not in report.ladder_table_html(r) and "faster" not in report.text_table(r)


def test_short_reason_cuts_at_a_clause():
    assert short_reason("one device visible: needs two (nothing measured; see the notebook)") == \
        "one device visible: needs two"
    assert short_reason(None) == "no reason recorded"


# -- tables ---------------------------------------------------------------------------------------
def test_ladder_table_is_html_with_few_columns(h200):
    html = report.ladder_table_html(h200["torch"])
    assert html.count("<table") == 1 and "<th" in html
    head = heads(html)
    assert head == ["rung", "tokens/s", "x base", "regime", "TFLOP/s", "memory"]
    for r in h200["torch"].rungs:
        assert f"<strong>{r.name}</strong>" in html
    assert "0.79x R1" in html and "slower" in html and "skipped" in html


def test_rung_view_is_a_line_a_compact_table_and_the_record_behind_a_toggle(h200):
    view = cards.rung_html(h200["torch"], "R1")
    fold = view.index('<details class="perfladder-fold">')
    assert view.index("perfladder-result") < fold < view.index("perfladder-compact") < view.index("<details>")
    visible = re.sub(r"<details.*</details>", "", view, flags=re.S)
    assert html.unescape(re.sub(r"<[^>]+>", "", visible)) == cards.result_line(h200["torch"], h200["torch"].rung("R1"))
    compact = dict(cards.compact_rows(h200["torch"], h200["torch"].rung("R1")))
    for slot in ("windows", "gates", "first call", "memory", "profile", "rate"):
        assert slot in compact, slot
    toggle = view[view.index("<details>"):]
    profile = re.findall(r"<table.*?</table>", toggle)[-1]
    assert heads(profile)[0] == "ms/step"
    rows = cards.profile_rows(h200["torch"].rung("R1"))
    assert rows and rows[0]["name"] == "aten::mm"           # the largest self-device time of the table
    assert [x["device_ms"] for x in rows] == sorted((x["device_ms"] for x in rows), reverse=True)
    for slot in ("timing", "verdict", "regime", "gate", "memory", "compile", "rate", "profile"):
        assert f">{slot}<" in toggle, slot                  # the full record, slot by slot


def test_rung_view_of_a_skipped_rung_and_receipt(h200):
    text = cards.rung_text(h200["torch"], "R5")
    assert text.startswith("R5 DDP: not measured (") and "2 GPUs" in text
    receipt = dict(cards.compact_rows(h200["torch"], h200["torch"].rung("R2")))["receipt"]
    assert "logits" in receipt and "as claimed (bf16)" in receipt     # torch.bfloat16 is bf16
    full = dict(cards.card_rows(h200["torch"], h200["torch"].rung("R2")))["receipt"]
    assert "claimed bf16" in full and "(matches)" in full


def test_kernel_breakdown_table(h200):
    r = kernel_report.kernel_rung(h200["torch"])
    assert r is not None and r.name == "B6"
    html = kernel_report.kernel_html(r.kernels, "B6")
    tables = re.findall(r"<table.*?</table>", html)
    assert len(tables) == 2
    assert heads(tables[1])[:2] == ["ms/step", "share"]
    assert "nvjet_sm90" in html and "matmul" in html


def test_comparison_lines_up_by_technique_key(h200):
    both = [h200["torch"], h200["jax"]]
    html = report.comparison_html(both)
    rows = re.findall(r"<tr>(.*?)</tr>", html)
    bf16 = next(x for x in rows if "<code>bf16</code>" in x)
    assert bf16.count("<strong>R2</strong>") == 2
    fused = next(x for x in rows if "<code>fused_adamw</code>" in x)
    embed = next(x for x in rows if "<code>embed_fp32_lookup</code>" in x)
    assert "<strong>B1</strong>" in fused and "<strong>B1</strong>" in embed and fused != embed
    assert "torch tokens/s" in html and "jax tokens/s" in html
    md = report.comparison_markdown(both).splitlines()
    assert md[0] == "| technique | torch tokens/s | jax tokens/s |"
    assert any(line.startswith("| onehot_embedding | B4 ") and " B2 " in line for line in md)


def test_text_table_keeps_its_columns(h200):
    lines = report.text_table(h200["torch"]).splitlines()
    assert "x prev" in lines[1] and "verdict" in lines[1]
    r2 = next(line for line in lines if line.startswith("R2 "))
    assert "0.79" in r2 and "slower" in r2
    r1 = next(line for line in lines if line.startswith("R1 "))
    assert "unsettled" in r1 and "≥" not in r1 and "1.28" not in r1   # no credited ratio, no bound


def test_sections_table_from_declarations():
    decl = [type("D", (), dict(name="R1", key="compile", label="compile", section="13.3", optional=False)),
            type("D", (), dict(name="B8", key="max_autotune", label="max-autotune", section="", optional=True))]
    html = report.sections_html(decl)
    assert heads(html) == ["rung", "technique", "chapter section"]
    assert "13.3" in html and "optional" in html


# -- kept from the banner / config helpers ----------------------------------------------------------
def test_banner_html_is_a_theme_admonition_not_myst_markup():
    html = report.banner_html(get_config("smoke"), "cpu <test>")
    assert 'class="admonition warning perfladder-banner"' in html
    assert "Smoke run" in html and "NOT performance results" in html
    assert "<strong>SMOKE RUN on cpu &lt;test&gt;.</strong>" in html      # escaped, bold converted
    assert "<code>smoke</code>" in html
    assert ":::" not in html and "**" not in html and "`" not in html
    full = report.banner_html(get_config("full"), "NVIDIA H200")
    assert 'class="admonition note perfladder-banner"' in full and "Smoke" not in full
    assert "width 512" in full


def test_banner_outside_a_notebook_prints_plain_text(capsys):
    report.banner(get_config("smoke"), "cpu")
    out = capsys.readouterr().out
    assert out.startswith("=" * 78) and "SMOKE RUN on cpu." in out and "**" not in out
    report.banner(get_config("full"), "NVIDIA H200")
    out = capsys.readouterr().out
    assert "Full configuration on NVIDIA H200" in out and "=" * 78 not in out


def test_config_of_rebuilds_the_ladder_config():
    cfg = get_config("smoke")
    res = LadderResult(framework="jax", device="cpu", config={**cfg.to_dict(), "unknown_key": 1},
                       baseline="R1")
    assert report.config_of(res) == cfg


def test_box_kinds():
    with pytest.raises(ValueError, match="kind='loud'.*valid choices"):
        report.box_html("t", "", "loud")


def test_kernel_report_shows_the_roofline_when_the_run_probed_its_ceilings():
    res = LadderResult.read(ROOT / "benchmarks" / "results" / "h200x2-run3" / "jax.json")
    kb = next(r for r in res.rungs if r.kernels).kernels
    html, text = kernel_report.kernel_html(kb), kernel_report.kernel_text(kb)
    assert "Roofline per kernel group" in html and "floor ms" in html
    assert f"floor {kb['roofline']['floor_ms']:.2f} ms" in text
    bare = {k: v for k, v in kb.items() if k != "roofline"}
    assert "Roofline" not in kernel_report.kernel_html(bare) and "roofline" not in kernel_report.kernel_text(bare)


def test_a_model_gate_card_summarises_its_gradients():
    """One value per parameter gradient would be a wall of text in the card: how many, how
    many over, and the one closest to its limit, with every other value listed as it is."""
    from perfladder.measure.evidence import Gate
    tol = {"logits": 0.0078, **{f"grad/b{i}.w": 0.0156 for i in range(10)}}
    vals = {"logits": 0.001, **{f"grad/b{i}.w": 0.0001 * i for i in range(10)}}
    text = cards._gate_values(Gate(name="model gate", passed=True, values=vals, tolerances=tol))
    assert text.startswith("logits 0.001 (tolerance 0.0078)")
    assert "10 parameter gradients, 0 over tolerance" in text
    assert "closest to its limit grad/b9.w 0.0009 (tolerance 0.0156)" in text
    assert "grad/b3.w" not in text
    vals["grad/b3.w"] = 0.5
    text = cards._gate_values(Gate(name="model gate", passed=False, values=vals, tolerances=tol))
    assert "1 over tolerance (grad/b3.w)" in text and "closest to its limit grad/b3.w 0.5" in text
    few = Gate(name="mirror", passed=True, values={"a": 1.0, "grad/x": 2.0}, tolerances={"a": 3.0})
    assert cards._gate_values(few) == "a 1 (tolerance 3), grad/x 2"


def test_an_optimizer_gate_card_summarises_its_updates_like_the_gradients():
    """The optimizer gate measures every parameter's AdamW update: summarised per kind the same
    way, never one value per parameter in the card."""
    from perfladder.measure.evidence import Gate
    tol = {f"update/b{i}.w": 1e-4 for i in range(12)}
    vals = {f"update/b{i}.w": 1e-7 * (i + 1) for i in range(12)}
    text = cards._gate_values(Gate(name="optimizer gate", passed=True, values=vals, tolerances=tol))
    assert text == "12 parameter updates, 0 over tolerance; closest to its limit update/b11.w 1.2e-06 (tolerance 0.0001)"
    both = Gate(name="g", passed=True, values={**vals, "grad/x": 0.5}, tolerances={**tol, "grad/x": 1.0})
    text = cards._gate_values(both)
    assert "12 parameter updates" in text and "1 parameter gradients" in text and "update/b3.w" not in text


def test_the_roofline_table_says_what_was_tried_against_each_group():
    """Each roofline row lists the rungs whose declaration targets its group, read from their
    own verdicts: a credited ratio, a loss, a skip with its reason."""
    from perfladder.ladder.rung import Rung
    decls = {"B8": Rung("B8", "fused_rope", "+fused RoPE", None, stage="beyond"),   # targets: by key
             "B9": Rung("B9", "fused_gelu", "+fused GELU", None, stage="beyond"),
             "B10": Rung("B10", "fused_addnorm", "+addnorm", None, stage="beyond"),
             "B5": Rung("B5", "batch_x2", "batch x2", None, stage="beyond")}
    r = result([rung("R0", "eager", [100e3, 101e3, 102e3]),
                rung("B5", "batch_x2", [200e3, 201e3, 202e3], "R0", stage="beyond"),
                rung("B8", "fused_rope", [300e3, 302e3, 304e3], "B5", stage="beyond", label="+fused RoPE"),
                rung("B9", "fused_gelu", [250e3, 251e3, 252e3], "B8", stage="beyond", label="+fused GELU"),
                rung("B10", "fused_addnorm", stage="beyond", label="+addnorm",
                     error="RuntimeError: Triton is not installed; the kernel cannot run")])
    tried = kernel_report.tried_against(r, decls)
    assert tried["elementwise: RoPE"] == [f"B8 +fused RoPE: {302e3 / 201e3:.2f}x B5, faster"]
    assert tried["elementwise: GELU"] == [f"B9 +fused GELU: {251e3 / 302e3:.2f}x B8, slower"]
    assert tried["layernorm/reductions"] == ["B10 +addnorm: skipped (RuntimeError: Triton is not installed)"]
    assert "matmul" not in tried                                  # B5 targets no group
    rl = {"time_ms": 10.0, "floor_ms": 6.0,
          "rows": [{"group": g, "time_ms": 2.0, "floor_ms": 1.0, "above_ms": 1.0, "bound": "memory",
                    "bw_frac": 0.5, "mm_frac": None} for g in ("matmul", "elementwise: RoPE")]}
    html = kernel_report.roofline_html(rl, tried)
    assert "tried against it" in html and "B8 +fused RoPE" in html
    assert "tried against it" not in kernel_report.roofline_html(rl)
    text = kernel_report.kernel_text({"steps": 1, "total_us": 1.0, "category_us": {}, "roofline": rl}, "t", tried)
    assert "matmul  tried: -" in text and "elementwise: RoPE  tried: B8 +fused RoPE" in text


def test_a_technique_targets_only_roofline_groups(monkeypatch):
    import dataclasses

    from perfladder.ladder import techniques
    from perfladder.ladder.rung import Rung
    bad = dataclasses.replace(techniques.TECHNIQUES["fused_rope"], targets=("rope",))
    monkeypatch.setitem(techniques.TECHNIQUES, "fused_rope", bad)
    with pytest.raises(ValueError, match=r"targets \['rope'\] are not roofline groups; "
                                         r"valid choices: matmul, attention"):
        Rung("B8", "fused_rope", "x", None)
    with pytest.raises(ValueError, match="is not described in perfladder.ladder.techniques"):
        Rung("B8", "my_trick", "x", None)


def test_a_group_under_its_floor_is_read_as_at_its_roof_not_past_the_hardware():
    rows = [{"group": "matmul", "time_ms": 20.0, "floor_ms": 21.4, "above_ms": -1.4, "bw_frac": None,
             "mm_frac": 1.07, "bound": "compute"},
            {"group": "attention", "time_ms": 4.0, "floor_ms": 2.3, "above_ms": 1.7, "bw_frac": 0.58,
             "mm_frac": 0.12, "bound": "memory"}]
    rl = {"time_ms": 24.0, "floor_ms": 23.7, "rows": rows}
    note = kernel_report.under_floor_note(rl)
    assert note.startswith("Under its floor: matmul (-1.40 ms, 107% of its roof).") and "attention" not in note
    assert kernel_report.esc(note) in kernel_report.roofline_html(rl) and note in kernel_report.kernel_text({"roofline": rl, "steps": 1})
    assert kernel_report.under_floor_note({**rl, "rows": rows[1:]}) == ""


def test_the_comparison_cell_credits_what_the_card_credits():
    """A committed JAX run whose R0 windows did not settle, every R1 window far above them: by
    the one credit rule R1's card credits no ratio, and the comparison table prints none either."""
    j = read_run(ROOT / "benchmarks/results/h200-serial-book/jax.json")
    assert j.rung("R0").stable is False
    c = call(j, j.rung("R1"))
    assert c.word == "unsettled" and c.ratio is None and c.bound is None and c.label == ""
    assert "no verdict on time" in cards.result_line(j, j.rung("R1"))
    row = next(line for line in report.comparison_markdown([j]).splitlines() if line.startswith("| compile"))
    assert "unsettled" in row and "≥" not in row and "faster" not in row


def test_its_time_names_the_phases_that_took_time_or_only_the_total():
    r = seed_ladder()
    b1 = r.rung("B1")
    b1.details["seconds"] = {"gates": 12.4, "time": 9.6, "receipt": 0.01, "total": 22.3}
    assert dict(cards.compact_rows(r, b1))["its time"] == "22 s: gates 12 s, time 10 s"
    b1.details["seconds"] = {"gates": 0.2, "time": 0.3, "total": 0.6}
    assert dict(cards.compact_rows(r, b1))["its time"] == "0.6 s"


def test_time_spent_sums_rungs_kernel_report_and_learning_check():
    r = seed_ladder()
    timed = [x for x in r.rungs if x.kind == "rung"][:3]
    for i, x in enumerate(timed):
        x.details["seconds"] = {"gates": 10.0 * (i + 1), "total": 10.0 * (i + 1) + 1}
    for x in r.rungs:
        if x not in timed:
            x.details.pop("seconds", None)
    line = cards.time_spent(r)
    untimed = len(r.rungs) - 3
    assert line.startswith("this ladder's own time: 63 s: 3 rungs 63 s (costliest: "
                           f"{timed[2].name} 31 s, {timed[1].name} 21 s, {timed[0].name} 11 s)")
    assert line.endswith(f"{untimed} rung(s) without recorded phases") == (untimed > 0)
    timed[0].kernels = {"seconds": 7.0}
    r.learning = type("Check", (), {"seconds": 30.0})()
    line = cards.time_spent(r)
    assert line.startswith("this ladder's own time: 100 s: ") and "; kernel report 7 s; learning check 30 s" in line
    r.ahead = {"seconds": 65.0, "steps": 15}         # the compile ahead of the first rung counts too
    line = cards.time_spent(r)
    assert line.startswith("this ladder's own time: 165 s: compiled ahead 65 s; 3 rungs 63 s")
    r.learning = None
    again = type(r).from_dict(r.to_dict())                  # kept in the results file
    assert again.ahead == r.ahead and cards.time_spent(again) == cards.time_spent(r)
    r.ahead = {"seconds": 65.0, "steps": 15, "by": "by the book build"}   # not this notebook's time
    line = cards.time_spent(r)
    assert line.startswith("this ladder's own time: 70 s: compiled ahead 65 s by the book build, "
                           "before the notebooks and beside the other framework (not counted here); 3 rungs 63 s")


def test_time_spent_names_the_learning_checks_costly_parts():
    r = seed_ladder()
    r.learning = type("Check", (), {"seconds": 50.0, "phases": {"train": 26.0, "val before": 9.0,
                                                                "data": 0.2}})()
    line = cards.time_spent(r)
    assert "learning check 50 s (train 26 s, val before 9 s)" in line and "data" not in line


def test_a_rungs_seconds_without_a_total_count_gate_parts_once():
    r = seed_ladder().rungs[1]
    r.details["seconds"] = {"gates": 10.0, "gates/model": 6.0, "gates/optimizer": 3.0, "time": 5.0}
    assert cards.rung_seconds(r) == 15.0
