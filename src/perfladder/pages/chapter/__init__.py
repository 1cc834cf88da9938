"""What each page's prose checks and inserts: its ``Check``s and its own numbers, by page.

The prose lives in the notebooks (``notebooks/01_pytorch_ladder.ipynb``, ...); every glue key it
uses is computed here or by ``perfladder.pages.story`` from the run the page shows, and
``tests/pages/test_checked_prose.py`` holds the two together (every key used exists; every
check holds on every complete committed run; no typed number, no unchecked claim).
"""
from __future__ import annotations

from perfladder.pages.chapter import jax_ladder, torch_ladder

PAGES = {"torch": torch_ladder, "jax": jax_ladder}


def _page(name: str):
    if name not in PAGES:
        raise ValueError(f"page={name!r} is not valid; valid choices: {tuple(PAGES)}")
    return PAGES[name]


def checks_for(page: str) -> list:
    return list(_page(page).CHECKS)


def numbers_for(page: str) -> dict:
    return dict(_page(page).NUMBERS)


def texts_for(page: str, result) -> dict[str, str]:
    """What a page glues as plain text for the text pages to paste: the PyTorch page's
    ``perfladder.pages.chapter.text_numbers.text_values`` (nothing from the others)."""
    _page(page)
    from perfladder.pages.chapter.text_numbers import text_values
    return text_values(result) if page == "torch" else {}
