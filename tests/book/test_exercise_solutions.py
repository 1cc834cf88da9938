"""Every exercise has a worked solution folded under it, and every number a solution quotes is
pasted from a page that glues it from the run it shows (never typed)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from perfladder.pages.chapter import checks_for, numbers_for
from perfladder.pages.story import glue_values
from perfladder.results.committed import read_run, reference_run

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "chapter13" / "exercises.md").read_text()
PASTE = re.compile(r"\{glue:text\}`\.\./notebooks/([\w]+)\.ipynb::(\w+):s`")
PAGE_FRAMEWORK = {"01_pytorch_ladder": "torch", "02_jax_ladder": "jax"}


def exercises() -> dict[str, str]:
    parts = re.split(r"^## (\d+\..*)$", TEXT, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def solutions() -> dict[str, str]:
    out = {}
    for title, body in exercises().items():
        m = re.search(r":::\{dropdown\} Worked solution\n(.*?)\n:::", body, flags=re.S)
        out[title] = m.group(1) if m else ""
    return out


def test_every_exercise_has_a_folded_worked_solution():
    sol = solutions()
    assert len(sol) >= 8
    assert all(len(s) > 200 for s in sol.values()), [t for t, s in sol.items() if len(s) <= 200]


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_every_pasted_ladder_value_is_one_the_ladder_page_glues(framework):
    values = glue_values(read_run(reference_run(framework=framework) / f"{framework}.json"),
                         checks_for(framework), numbers_for(framework))
    used = [key for page, key in PASTE.findall("\n".join(solutions().values()))
            if PAGE_FRAMEWORK.get(page) == framework]
    assert used
    for key in used:
        assert key.startswith(f"{framework}_") and key[len(framework) + 1:] in values, key


def test_pasted_reference_values_are_glued_by_that_page():
    source = (ROOT / "notebooks" / "04_h200_reference.ipynb").read_text()
    for page, key in PASTE.findall("\n".join(solutions().values())):
        if page == "04_h200_reference":
            assert f'glue(\\"{key}\\"' in source, key


def test_no_solution_types_a_measured_number():
    """Numbers in a solution are pasted; what is left is arithmetic notation (8D/5a, 16N, k = 4)."""
    for title, body in solutions().items():
        prose = PASTE.sub("", body)
        prose = re.sub(r"\$[^$]*\$", "", prose)                  # formulas
        found = re.findall(r"(?<![\w.])\d[\d.,]*\s*(?:%|ms|GiB|GB|x\b|tokens)", prose)
        assert not found, (title, found)
