"""perfladder.report: the smoke banner (HTML admonition in a notebook, text elsewhere) and tables."""
from __future__ import annotations

from perfladder import report
from perfladder.config import get_config
from perfladder.results import LadderResult, RungResult


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


def test_markdown_table_rows_and_small_tflops():
    res = LadderResult(framework="torch", device="cpu", config=get_config("smoke").to_dict(), baseline="R0")
    res.add(RungResult("R0", "eager", 1000.0, windows=[990.0, 1000.0, 1010.0], spread=0.02, tflops=0.0012))
    res.add(RungResult("R5", "ddp", None, kind="skipped", notes=["one device"]))
    table = report.markdown_table(res).splitlines()
    assert len(table) == 4 and table[0].startswith("| rung |") and "x R0" in table[0]
    assert "| R0 | eager | 1,000 | 2.0% |" in table[2] and "| 0.0012 |" in table[2]
    assert "skipped" in table[3] and "(skipped)" in table[3]
    assert report.tflops_text(331.24) == "331.2" and report.tflops_text(None) == ""
