"""notebooks/05_scaling.ipynb on its own (seconds, no GPU): it reads the committed two-GPU run
when there is one and says where its single-GPU rates come from when there is not."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "05_scaling.ipynb"


def execute(cwd: Path):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    old = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"   # as the book build
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        if old is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = old
    text = "\n".join(str(v) for c in nb.cells for o in c.get("outputs", [])
                     for k, v in o.get("data", {}).items() if k == "text/markdown")
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    return text, images


def test_reads_the_committed_run_and_states_its_numbers():
    if not (ROOT / "benchmarks" / "results" / "h200x2-r5" / "r5.json").is_file():
        pytest.skip("benchmarks/results/h200x2-r5/r5.json is not in this checkout")
    text, images = execute(ROOT / "notebooks")
    assert images == 1
    assert "measured in `benchmarks/results/h200x2-r5/r5.json`" in text
    assert "| 1024 | 128 |" in text                                  # k up to 1024, 8 per node
    for link in ("nvlink4-h200", "ib-ndr400", "pcie-host-staged"):
        assert f"`{link}`" in text                                   # every bandwidth stated
    assert "The measured points sit" in text and "at k = 4.9" in text


def test_without_the_run_it_says_which_rates_it_uses(tmp_path):
    (tmp_path / "_config.yml").write_text("title: t\n")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: index\n")
    (tmp_path / "notebooks").mkdir()
    text, images = execute(tmp_path / "notebooks")
    assert images == 1 and "is not in this checkout" in text
    assert "The measured points sit" not in text
