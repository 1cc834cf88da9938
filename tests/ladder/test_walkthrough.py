"""CONTRIBUTING.md's "Adding a rung" walkthrough, done to a copy of the tree: its code blocks go
into the files it names and a cell into each ladder page, and nothing else is touched; then the
toy rung is declared in both frameworks with its technique's description, each page runs it in
ladder order, and the checks that hold the pages to the library still pass."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMED = ["src/perfladder/ladder/techniques.py", "src/perfladder/torch/rungs/changes.py",
         "src/perfladder/torch/rungs/beyond.py", "src/perfladder/jax/rungs/changes.py",
         "src/perfladder/jax/rungs/beyond.py", "notebooks/01_pytorch_ladder.ipynb",
         "notebooks/02_jax_ladder.ipynb"]


def walkthrough_blocks() -> list[tuple[str, str]]:
    """``[(file, code)]``: each numbered step's file and its python block, from CONTRIBUTING.md."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Adding a rung"):text.index("### Parameter names")]
    steps = re.findall(r"\n\d\. .*?`(src/[^`]+\.py)`.*?```python\n(.*?)```", section, flags=re.S)
    return [(f, re.sub(r"(?m)^ {3}", "", code)) for f, code in steps]


def add_cell(notebook: Path, source: str, before: str) -> None:
    nb = json.loads(notebook.read_text())
    at = next(i for i, c in enumerate(nb["cells"]) if before in "".join(c["source"]))
    nb["cells"].insert(at, {"cell_type": "code", "metadata": {}, "execution_count": None,
                            "outputs": [], "source": [source]})
    notebook.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def test_the_walkthrough_adds_a_rung_to_both_frameworks_touching_only_what_it_names(tmp_path):
    blocks = walkthrough_blocks()
    assert [f for f, _ in blocks] == NAMED[:5]
    tree = tmp_path / "tree"
    for part in ("src", "tests", "notebooks", "benchmarks/results", "pyproject.toml", "_config.yml", "_toc.yml"):
        src, dst = ROOT / part, tree / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    for rel, code in blocks:
        with open(tree / rel, "a") as f:
            f.write("\n\n" + code)
    change = blocks[1][1].split("CHANGES[")[0].rstrip()           # the function of step 2
    add_cell(tree / NAMED[5], change + '\n\n\npage.run("B19", change=batch_x8)', before='page.run("R5"')
    add_cell(tree / NAMED[6], change + '\n\n\npage.run("B13", change=batch_x8)', before='page.run("R5"')
    touched = {str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file() and p.read_bytes() != before.get(p)}
    assert touched == set(NAMED)

    (tree / "tests" / "ladder" / "test_toy_rung.py").write_text(TOY_CHECK)
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/ladder/test_toy_rung.py",
                          "tests/book/test_technique_cells.py::test_every_declared_rung_is_run_by_a_cell_in_ladder_order_with_its_code",
                          "tests/pages/test_checked_prose.py::test_every_inserted_number_and_claim_exists"],
                         env=env, capture_output=True, text=True, cwd=tree, timeout=300)
    assert run.returncode == 0 and "5 passed" in run.stdout, run.stdout[-3000:]   # 2 pages x 2 + the toy


TOY_CHECK = """
import perfladder.jax as pj
import perfladder.torch as pt
from perfladder.ladder.techniques import S_ROOF


def test_the_toy_rung_is_declared_in_both_frameworks():
    t, j = pt.RUNGS["B19"], pj.RUNGS["B13"]
    assert t.key == j.key == "batch_x8" and t.section == j.section == S_ROOF, (t, j)
    assert t.stage == j.stage == "beyond" and list(pt.RUNGS).index("B19") < list(pt.RUNGS).index("R5")
"""
