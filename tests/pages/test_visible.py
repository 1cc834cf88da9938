"""What counts as visible text on a built page (``perfladder.pages.visible``), and the budget
it sets the ladder pages: a rung's card shows one line, its evidence folded."""
from __future__ import annotations

import subprocess
import sys

from _ladders import H200, ROOT

from perfladder.pages import cards
from perfladder.pages.visible import visible_chars, visible_text
from perfladder.results.committed import read_run


def test_folds_show_only_their_summary_and_sidebars_do_not_count():
    page = ("<html><body><nav>sidebar words</nav><article><h1>Title</h1><p>one <b>two</b></p>"
            "<details><summary>open me</summary><p>hidden words</p><details><summary>inner</summary>"
            "x</details></details><script>var x = 1;</script><p>three &amp; four</p></article>"
            "<footer>foot</footer></body></html>")
    assert visible_text(page) == "Title one two open me three & four"
    assert visible_chars(page) == len("Title one two open me three & four")
    assert visible_text("<p>no article <br> at all</p>") == "no article at all"


def test_a_rung_card_shows_its_result_line_and_folds_the_evidence():
    res = read_run(H200 / "torch.json")
    for r in res.rungs:
        html = cards.rung_html(res, r.name, "Reference run: somewhere")
        shown = visible_text(f"<article>{html}</article>")
        assert shown == cards.result_line(res, r) + " its evidence"
    # every fact still one click away: the folded record holds each of the card's rows
    html = cards.rung_html(res, "R1")
    for slot, _ in cards.card_rows(res, res.rung("R1")):
        assert f">{slot}<" in html


def test_the_script_reports_a_missing_page_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "visible_text.py"), str(tmp_path / "x.html")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no such page" in out.stderr
    page = tmp_path / "p.html"
    page.write_text("<article>abc<details><summary>s</summary>hidden</details></article>")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "visible_text.py"), str(page)],
                         capture_output=True, text=True)
    assert out.returncode == 0 and ": 5 visible characters (12 with every fold open)" in out.stdout
