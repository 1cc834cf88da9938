"""The book's table of contents resolves, and its notebooks are committed clean.

Fast checks (no execution): every `_toc.yml` entry names a file that exists, no notebook
under notebooks/ is left out of the toc (Jupyter Book would skip it silently with
`only_build_toc_files`), and every notebook is stored without outputs or execution counts.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = (".md", ".ipynb")


def toc_entries(node) -> list[str]:
    """Every `file:` / `root:` value of a sphinx-external-toc tree, in order."""
    out = []
    if isinstance(node, dict):
        for key in ("root", "file"):
            if key in node:
                out.append(node[key])
        for key, value in node.items():
            if key not in ("root", "file"):
                out += toc_entries(value)
    elif isinstance(node, list):
        for item in node:
            out += toc_entries(item)
    return out


def resolve(entry: str) -> Path | None:
    path = ROOT / entry
    if path.suffix in SUFFIXES and path.is_file():
        return path
    found = [path.with_name(path.name + s) for s in SUFFIXES if path.with_name(path.name + s).is_file()]
    if len(found) > 1:
        raise AssertionError(f"toc entry {entry!r} is ambiguous: {[str(f) for f in found]}")
    return found[0] if found else None


TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
ENTRIES = toc_entries(TOC)
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_toc_has_the_book_pages():
    assert TOC.get("format") == "jb-book", "the toc must be a Jupyter Book 'jb-book' toc"
    assert len(ENTRIES) == len(set(ENTRIES)), f"toc entries repeat: {ENTRIES}"
    for needed in ("chapter13/index", "chapter13/case_study", "chapter13/exercises",
                   "notebooks/01_pytorch_ladder", "notebooks/02_jax_ladder",
                   "notebooks/03_comparison", "notebooks/04_h200_reference", "notebooks/00_status"):
        assert needed in ENTRIES, f"{needed} is missing from _toc.yml; entries: {ENTRIES}"


@pytest.mark.parametrize("entry", ENTRIES)
def test_toc_entry_resolves_to_a_file(entry):
    assert resolve(entry) is not None, f"_toc.yml entry {entry!r} matches no {SUFFIXES} file under {ROOT}"


def test_comparison_sorts_after_the_ladders():
    """Sphinx executes notebooks in sorted docname order; the comparison reads their JSON."""
    pick = lambda word: [e for e in ENTRIES if word in e]  # noqa: E731
    ladders, comparison = pick("_ladder"), pick("comparison")
    assert len(ladders) == 2 and len(comparison) == 1, (ladders, comparison)
    assert max(ladders) < comparison[0], \
        f"{comparison[0]} must sort after the ladder notebooks {ladders} (it reads their results)"


def test_every_notebook_is_in_the_toc():
    listed = {resolve(e) for e in ENTRIES}
    orphans = [p.name for p in NOTEBOOKS if p not in listed]
    assert not orphans, f"notebooks not in _toc.yml (the book would skip them): {orphans}"


@pytest.mark.parametrize("entry", [e for e in ENTRIES if (resolve(e) or Path()).suffix == ".ipynb"])
def test_notebook_committed_without_outputs(entry):
    path = resolve(entry)
    nb = json.loads(path.read_text())
    assert nb.get("nbformat") == 4, f"{path.name}: nbformat {nb.get('nbformat')!r}, expected 4"
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", \
        f"{path.name}: kernelspec must be python3 (the kernel the book build starts)"
    dirty = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        if cell.get("outputs"):
            dirty.append(f"cell {i}: {len(cell['outputs'])} output(s)")
        if cell.get("execution_count") is not None:
            dirty.append(f"cell {i}: execution_count {cell['execution_count']}")
    assert not dirty, f"{path.name} is committed with outputs (clear them): {dirty}"
