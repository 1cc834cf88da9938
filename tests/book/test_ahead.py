"""perfladder.book.ahead: the book build's stage that compiles both ladders' programs before
the notebooks (its success path runs in tests/book/test_build_script.py, through the script)."""
from __future__ import annotations

from perfladder.book import ahead


def test_a_framework_whose_stage_fails_leaves_no_report_and_the_stage_says_so(tmp_path, capsys):
    assert ahead.run(tmp_path, rungs="R99") == 1
    out = capsys.readouterr().out
    for fw in ("torch", "jax"):
        assert f"[ahead] {fw}: the stage failed (exit 1); its ladder compiles as it goes" in out
        assert not (tmp_path / f"{fw}.json").exists()
    assert "[ahead] both ladders compiled ahead in" in out
