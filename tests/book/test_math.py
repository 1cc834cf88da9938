"""The chapter's formulas are math, rendered offline: the book's configuration loads a MathJax
that ships with a Sphinx extension (no CDN), MyST parses $...$ and $$...$$, and the markdown
pages write the formulas as labelled math rather than as code blocks."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
try:
    import tomllib
except ImportError:          # python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = "sphinx-mathjax-offline"
PAGES = sorted((ROOT / "chapter13").glob("*.md"))


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def test_config_loads_the_offline_mathjax_and_myst_math():
    cfg = _config()
    assert EXTENSION in cfg["sphinx"]["extra_extensions"]
    assert {"dollarmath", "amsmath"} <= set(cfg["parse"]["myst_enable_extensions"])
    sphinx_config = cfg["sphinx"].get("config", {})
    assert "mathjax_path" not in sphinx_config, "the extension sets mathjax_path to its bundled copy"


def test_the_extension_is_installed_wherever_the_book_is():
    book = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["book"]
    assert any(req.startswith(EXTENSION) for req in book)
    assert f'"{EXTENSION}' in (ROOT / "scripts" / "carry_wheels.sh").read_text()


def _display_math(text: str) -> dict[str, str]:
    """label -> body of every ``$$ ... $$ (label)`` block."""
    return {label: body for body, label in re.findall(r"^\$\$\n(.*?)\n\$\$ \(([\w-]+)\)$", text, re.S | re.M)}


@pytest.mark.parametrize("page, label, must_contain", [
    ("case_study", "flops-per-token", r"6N + 12\,L\,T\,D"),
    ("index", "arithmetic-intensity", r"\frac{\text{FLOPs performed}}"),
    ("index", "roofline", r"\min\left(P_\text{peak},\; B \cdot I\right)"),
    ("exercises", "data-parallel-cost", r"t_\text{step} = t_\text{compute} + t_\text{comm}"),
])
def test_formulas_are_labelled_math(page, label, must_contain):
    blocks = _display_math((ROOT / "chapter13" / f"{page}.md").read_text())
    assert label in blocks, f"{page}.md has no $$ ... $$ ({label}) block; it has {sorted(blocks)}"
    assert must_contain in blocks[label]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_no_formula_left_in_a_code_block(page):
    text = page.read_text()
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang != "python" and lang != "bash":
            pytest.fail(f"{page.name}: a ```{lang or '(plain)'} block (formulas belong in $$ ... $$): "
                        f"{body[:80]!r}")
    for phrase in ("6 N + 12 L T D", "t_step = t_compute", "FLOPs performed / bytes"):
        assert phrase not in text, f"{page.name}: {phrase!r} is written as text, not math"
