"""The glossary page defines every word the pages use in a sense of their own, the pages link
to it (MyST ``{term}`` roles in the prose, ``perfladder.pages.glossary.link_terms`` in the
generated output), and every link names a term the page defines."""
from __future__ import annotations

import json
import re

import yaml
from _ladders import ROOT

from perfladder.pages.glossary import TERMS, anchor, href, link_terms

GLOSSARY = ROOT / "chapter13" / "glossary.md"
# the words issue 41 found undefined, as the glossary names them
ASKED = ("settled", "spread", "receipt", "MFU", "fraction of roof", "planned temporaries", "kernel names",
         "gloo-loopback", "NVLS", "busbw", "GSPMD", "donated", "memory-bound")


def defined() -> list[str]:
    text = GLOSSARY.read_text()
    block = text[text.index("```{glossary}"):]
    return [ln.strip() for ln in block.splitlines()[1:] if ln and not ln.startswith((" ", "```"))]


def pages() -> dict[str, str]:
    out = {p.name: p.read_text() for p in (ROOT / "chapter13").glob("*.md")}
    for p in (ROOT / "notebooks").glob("*.ipynb"):
        out[p.name] = "\n".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"]
                                if c["cell_type"] == "markdown")
    return out


def test_the_glossary_is_in_the_book_and_defines_what_was_asked():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    assert "chapter13/glossary" in files
    terms = defined()
    assert len(terms) == len(set(terms))
    assert set(ASKED) <= set(terms), set(ASKED) - set(terms)
    assert set(TERMS.values()) <= set(terms), set(TERMS.values()) - set(terms)


def test_every_term_role_names_a_defined_term():
    terms = {t.lower() for t in defined()}
    for name, text in pages().items():
        for role in re.findall(r"\{term\}`([^`]+)`", text):
            target = re.search(r"<([^>]+)>$", role)
            assert (target.group(1) if target else role).lower() in terms, (name, role)


def test_each_ladder_page_links_the_words_its_prose_uses():
    text = pages()
    for page in ("01_pytorch_ladder.ipynb", "02_jax_ladder.ipynb"):
        linked = {(re.search(r"<([^>]+)>$", r).group(1) if "<" in r else r).lower()
                  for r in re.findall(r"\{term\}`([^`]+)`", text[page])}
        assert {"receipt", "roofline", "gate", "window", "activation checkpointing"} <= linked, (page, linked)


def test_anchors_are_the_ids_sphinx_gives_glossary_terms():
    from sphinx.util.nodes import _make_id
    for term in defined():
        assert anchor(term) == _make_id(f"term-{term}"), term
    assert href("planned temporaries") == "../chapter13/glossary.html#term-planned-temporaries"


def test_output_links_each_term_once_per_page_and_never_inside_code_or_a_summary():
    seen: set[str] = set()
    first = link_terms('<p>R0 is host-bound: <code>nvjet_sm90</code> busy 66%</p>'
                       '<details><summary>host-bound spread</summary><p>spread 2%, gloo</p></details>', seen)
    assert first.count('href="../chapter13/glossary.html#term-host-bound"') == 1
    assert "<code>nvjet_sm90</code>" in first                     # code is never rewritten
    assert "<summary>host-bound spread</summary>" in first        # nor a fold's summary
    assert 'href="../chapter13/glossary.html#term-spread">spread</a> 2%' in first
    assert seen == {"host-bound", "busy", "spread", "gloo-loopback"}
    again = link_terms("<p>host-bound, busy, spread</p>", seen)
    assert "<a" not in again                                       # once per page
    assert link_terms("<p>mfu</p>", set()) == "<p>mfu</p>"          # MFU is matched as written


def test_the_thresholds_the_glossary_quotes_are_the_packages():
    """The regime words' thresholds and the full configuration's spread target, as the glossary
    states them, are the constants the pages classify with."""
    from perfladder.config import get_config
    from perfladder.measure import verdict
    text = " ".join(GLOSSARY.read_text().split())
    pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
    assert f"take at least {pct(verdict.COMPUTE_SHARE)} of the kernel time" in text
    assert f"{{term}}`busy` under {pct(verdict.HOST_BOUND)} of the step" in text
    assert f"take at least {pct(verdict.MEMORY_SHARE)} of the kernel time" in text
    assert verdict.COMPUTE_ROOF == 0.5 and "reach at least half the measured matmul roof" in text
    assert f"asks {pct(get_config('full').target_spread)} of it" in text


def test_with_a_set_for_folds_a_term_is_linked_once_visible_and_once_folded():
    seen, folded = set(), set()
    first = link_terms("<details><summary>R0</summary><p>its windows settled</p></details>", seen, folded)
    assert first.count("term-settled") == 1 and folded == {"settled"} and seen == set()
    line = link_terms("<p><strong>R1: did not settle</strong></p>", seen, folded)
    assert line.count("term-settled") == 1 and seen == {"settled"}      # the first visible use
    again = link_terms("<p>settled</p><details><p>settled</p></details>", seen, folded)
    assert "<a" not in again                                            # once each, per page
