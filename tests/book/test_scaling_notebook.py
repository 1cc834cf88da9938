"""notebooks/05_scaling.ipynb on its own (seconds, no GPU): it reads the committed two-GPU run
when there is one, says where its single-GPU rates come from when there is not, and prints
the prediction for k = 2, 4 and 8 on every build."""
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "05_scaling.ipynb"
R5 = ROOT / "benchmarks" / "results" / "h200x2-r5" / "r5.json"


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
                     for k, v in o.get("data", {}).items() if k in ("text/markdown", "text/html"))
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    return text, images


def predicted_cells(text: str) -> dict[tuple[str, int], list[str]]:
    """The k = 2/4/8 table: (row label, k) -> the cell's text."""
    table = text[re.search(r"<th[^>]*>k = 2</th>", text).start():]
    body = table[:table.index("</table>")].split("<tbody>", 1)[1]
    out = {}
    for row in re.findall(r"<tr>(.*?)</tr>", body):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        for k, cell in zip((2, 4, 8), cells[3:]):
            out[cells[0], k] = cell
    return out


@pytest.fixture(scope="module")
def committed():
    if not R5.is_file():
        pytest.skip("benchmarks/results/h200x2-r5/r5.json is not in this checkout")
    return execute(ROOT / "notebooks")


def test_reads_the_committed_run_and_states_its_numbers(committed):
    text, images = committed
    assert images == 1
    assert "measured in `benchmarks/results/h200x2-r5/r5.json`" in text
    assert "| 1024 | 128 |" in text                                  # k up to 1024, 8 per node
    for link in ("nvlink4-h200", "ib-ndr400", "pcie-host-staged"):
        assert f"`{link}`" in text                                   # every bandwidth stated
    assert "The measured points sit below the curves" in text and "at k = 4.9" in text
    assert "seed" not in text.lower()                               # the chapter, not the seed


def test_k4_and_k8_are_predicted_beside_the_committed_k2(committed):
    text, _ = committed
    cells = predicted_cells(text)
    r5 = json.loads(R5.read_text())
    measured_ks = {m["k"] for m in r5["measurements"] if m["status"] == "measured"}
    rows = {label for label, _ in cells}
    assert rows == {"PyTorch, the chapter's form", "PyTorch, the two-GPU run's fast recipe",
                    "JAX, the chapter's form", "JAX, the two-GPU run's fast recipe"}
    for (label, k), cell in cells.items():
        assert cell.startswith("predicted ")
        assert ("not measured" in cell) == (k not in measured_ks), (label, k, cell)
    assert "measured: ddp 5.24M" in cells["PyTorch, the two-GPU run's fast recipe", 2]
    missing = sorted({4, 8} - measured_ks)
    if missing:
        assert f"Nothing is measured yet at k = {', '.join(map(str, missing))}" in text


def test_without_the_run_it_says_which_rates_it_uses(tmp_path):
    (tmp_path / "_config.yml").write_text("title: t\n")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: index\n")
    (tmp_path / "notebooks").mkdir()
    text, images = execute(tmp_path / "notebooks")
    assert images == 1 and "is not in this checkout" in text
    assert "The measured points sit" not in text
    cells = predicted_cells(text)                                    # still predicted, every k
    assert {k for _, k in cells} == {2, 4, 8} and all("not measured" in c for c in cells.values())
    assert "No multi-GPU measurement is in this checkout" in text


def test_the_chapters_measured_k4_stands_beside_our_prediction_for_its_box(committed):
    """The chapter's printed R5 points (``comparison.CHAPTER``), as efficiencies against its own
    single-GPU rates, each beside the cost model's prediction over its PCIe fabric."""
    from perfladder.config import expected_num_params, get_config
    from perfladder.multigpu import costmodel
    from perfladder.pages.comparison import CHAPTER
    text, _ = committed
    full = get_config("full")
    n = expected_num_params(full.gpt())
    eff = CHAPTER["r5"]["torch"]["k4"] / (4 * CHAPTER["torch"]["R0"])
    pred = costmodel.predict(4, 64, full.num_steps, CHAPTER["torch"]["R0"], n, "pcie-host-staged")
    assert (f"| torch | eager, fp32, batch 64/GPU (its R0) | 4 | {100 * eff:.0f}% | "
            f"{100 * pred.efficiency:.0f}% ") in text
    assert f"| 4 | {100 * CHAPTER['r5']['jax']['fast_k4_efficiency']:.0f}% |" in text
