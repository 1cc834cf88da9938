"""The comparison and reference pages: the H200 reference comes first and this build's run after
it, labelled (the comparison page executed here on planted runs; the reference page as the
session's smoke book build executed it, conftest.smoke_book); every statement of the H200 story
shown beside the committed runs holds or, where the host decides it, is marked; every number the
text pages paste from the reference page is glued there; no reader-facing output says "seed"."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from _ladders import seed_ladder

from perfladder.results.committed import reference_run

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
GLUE_REF = re.compile(r"\{glue:text\}`\.\./notebooks/04_h200_reference\.ipynb::([a-z0-9_]+):s`")
# the configuration's numbers the text pages paste from the PyTorch page (pages.chapter.texts_for)
GLUE_TORCH = re.compile(r"\{glue:text\}`\.\./notebooks/01_pytorch_ladder\.ipynb::([a-z0-9_]+):s`")
LADDER_REF = re.compile(r"\{glue:text\}`\.\./notebooks/0[12]_\w+_ladder\.ipynb::(\w+):s`")


def execute(notebook: str, env: dict):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient
    nb = nbformat.read(str(NOTEBOOKS / notebook), as_version=4)
    env = {"MPLBACKEND": "Agg", "PERFLADDER_CONFIG": "smoke", **env}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return nb


def shown(nb) -> str:
    """What a reader sees: markdown cells and every text output, in page order."""
    parts = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts += [str(v) for k, v in out.get("data", {}).items() if k in ("text/markdown", "text/html")]
    return "\n".join(parts)


def prose(text: str) -> str:
    """``text`` without code: fenced blocks, inline code, <code> elements, run labels' commands."""
    text = re.sub(r"```.*?```|`[^`\n]*`|<code>.*?</code>", "", text, flags=re.S)
    return re.sub(r"command: [^;<\n]*", "", text)


def glued(book, name: str) -> dict[str, str]:
    """The values notebooks/<name>.ipynb glued in the book build (myst-nb moves them out of the
    executed notebook into ``<name>.glue.json`` beside it, each as the output that made it)."""
    path = book.executed(name).with_suffix(".glue.json")
    return {key: next(iter(out["data"].values())) for key, out in json.loads(path.read_text()).items()}


@pytest.fixture(scope="module")
def reference(smoke_book):
    """The reference page as the book build executed it (it reads only committed runs, so a
    second execution here would show the same page)."""
    return smoke_book.notebook("04_h200_reference")


@pytest.mark.slow
def test_reference_page_starts_with_the_runs_reference_txt_names(reference):
    text = shown(reference)
    body = text[text.index("## The reference runs"):]
    files = [f"file: {(reference_run(framework=fw) / f'{fw}.json').relative_to(ROOT).as_posix()}"
             for fw in ("torch", "jax")]
    order = [body.index(s) for s in (*files, "### Data parallelism",
                                     "## Lab notes", "## Earlier runs")]
    assert order == sorted(order)
    assert "This build ran the `smoke` configuration" in text
    for folder in ("h200-book", "h200-run1", "h200-run2", "h200-dispatch"):   # summarised, then detailed
        assert f"benchmarks/results/{folder}/" in text[text.index("## Earlier runs"):]


@pytest.mark.slow
def test_every_claim_beside_the_committed_runs_holds(reference):
    text = shown(reference)
    holds = re.findall(r'data-claim="([a-z0-9_]+)" data-holds="(\w+)"', text)
    assert {k for k, _ in holds} == {"torch_batch_biggest", "torch_bf16_small_batch", "jax_jit_cliff",
                                     "jax_bf16_scatter", "fastest_pair", "data_parallel"}
    # PyTorch's batch-64 statements are told in the version the run supports; where its R2 did
    # not settle neither is decided (tests/pages/test_comparison.py), never contradicted
    host_decides = {"torch_batch_biggest", "torch_bf16_small_batch"}
    assert all(h == "True" for k, h in holds if k not in host_decides)
    assert all(h in ("True", "None") for k, h in holds if k in host_decides)
    assert text.count("Not so in this run") == sum(h == "False" for _, h in holds)
    table = text[re.search(r"<th[^>]*>k = 2</th>", text).start():]
    assert table[:table.index("</table>")].count("not measured") >= 8          # k = 4 and 8, every row


@pytest.mark.slow
def test_every_number_the_text_pages_paste_is_glued(smoke_book):
    pages = [md.read_text() for md in (ROOT / "chapter13").glob("*.md")]
    # myst-nb reads "doc::key" only with a format after it: a bare "doc::key" is a missing key
    # (the exercises' solutions paste the ladder pages' values too: tests/book/test_exercise_solutions.py)
    assert sum(p.count("{glue:text}") for p in pages) == sum(len(GLUE_REF.findall(p)) + len(LADDER_REF.findall(p))
                                                             for p in pages)
    from perfladder.pages.chapter import texts_for
    from perfladder.results.committed import read_run
    # the configuration's numbers (``t_``); the ladder's own values (``torch_<key>``) are the
    # exercises' (tests/book/test_exercise_solutions.py)
    torch_keys = {k for p in pages for k in GLUE_TORCH.findall(p) if not k.startswith("torch_")}
    texts = texts_for("torch", read_run(reference_run(framework="torch") / "torch.json"))
    assert torch_keys <= set(texts) and "–" not in {texts[k] for k in torch_keys}, sorted(torch_keys - set(texts))
    keys = {k for p in pages for k in GLUE_REF.findall(p)}
    values = glued(smoke_book, "04_h200_reference")
    assert keys and keys <= set(values), sorted(keys - set(values))
    # the one ceiling of the PyTorch reference run (its own probe), as its waterfall draws it
    from perfladder.kernels.ceiling import ceiling
    from perfladder.results.committed import read_run
    from perfladder.words import rate
    ceil = ceiling(read_run(reference_run(framework="torch") / "torch.json"))
    assert values["h200_bf16_tflops"].strip("'") == f"{ceil['tflops']:.0f}"
    assert values["h200_ceiling"].strip("'") == rate(ceil["tokens_per_s"])
    spread = values["h200_probe_spread"]
    assert "TFLOP/s" in spread and "its own probe" in spread
    # only the reference card's runs: the text quotes it beside that card's ceiling
    device = read_run(reference_run(framework="torch") / "torch.json").device
    named = re.findall(r" on the (.+?) measured", spread)
    assert named and set(named) == {device}
    # the table of ceilings says how the reference run's probe timed its matmul
    from perfladder.kernels.ceiling import PROBED_WORDS, timed_as
    reference_roofs = read_run(reference_run(framework="torch") / "torch.json").roofs
    assert values["h200_probe_timed"].strip("'") == PROBED_WORDS[timed_as(reference_roofs)]
    assert "not available" not in " ".join(values[k] for k in keys)


@pytest.mark.slow
def test_no_reader_facing_seed(reference, smoke_book):
    pasted = " ".join(glued(smoke_book, "04_h200_reference").values())      # what the text pages show
    assert "seed" not in prose(shown(reference) + pasted).lower()


@pytest.mark.parametrize("config", ["smoke", "full"])
def test_comparison_page_shows_the_reference_first_then_this_build(tmp_path, config):
    for fw in ("torch", "jax"):
        seed_ladder(config, framework=fw).write(tmp_path / f"{fw}.json")
    nb = execute("03_comparison.ipynb", {"PERFLADDER_RESULTS_DIR": str(tmp_path)})
    text = shown(nb)
    order = [text.index(s) for s in ("## The H200 reference, technique", "## What the H200 shows",
                                     "## Reading the two waterfalls", "## This build's own run",
                                     "This build, torch")]
    assert order == sorted(order)
    assert (tmp_path / "comparison.png").is_file()
    story = text[text.index("## What the H200 shows"):text.index("## Reading the two waterfalls")]
    assert story.count('data-holds="') >= 6                       # the reference's six statements, decided
    if config == "smoke":
        assert "Smoke run" in text and "tiny smoke configuration" in text
        assert "smoke check, not a performance number" in text        # this build's run, folded
        assert "this build on" not in text                       # a smoke run is read for nothing
    else:                                                          # a full build is read as well
        assert "this build on NVIDIA H200" in story
    assert "seed" not in prose(text).lower()
