"""The book builds, and what it shows is what a reader should see.

* ``test_book_*`` (slow: they run by default, ``-m "not slow"`` skips them) read the HTML of
  the session's one smoke build of the whole book (``conftest.smoke_book``: CPU, smoke config
  forced, the same script `make book` uses, into ``_build/test/``, every notebook executed
  fresh; a GPU build in ``_build/`` is never touched).
* ``test_snippet_*`` (fast) compile every python block of the markdown pages and check that
  each ``perfladder`` name they import or use exists.
"""
from __future__ import annotations

import ast
import importlib
import json
import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "_build" / "test"
HTML = OUT / "_build" / "html"
RESULTS = OUT / "_build" / "results"
PAGES = ["chapter13/index", "chapter13/case_study", "chapter13/exercises", "notebooks/00_status",
         "notebooks/01_pytorch_ladder", "notebooks/02_jax_ladder", "notebooks/03_comparison",
         "notebooks/04_h200_reference"]


class _Tags(HTMLParser):
    """img sources, table texts and banner divs of one page."""

    def __init__(self):
        super().__init__()
        self.imgs, self.tables, self.banners = [], [], []
        self._table_depth, self._banner_depth = 0, 0
        self._table_text, self._banner_text = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        if tag == "table":
            self._table_depth += 1
            if self._table_depth == 1:
                self._table_text = []
        if tag == "div" and "perfladder-banner" in (a.get("class") or ""):
            self._banner_depth = 1
            self._banner_text = []
        elif tag == "div" and self._banner_depth:
            self._banner_depth += 1

    def handle_endtag(self, tag):
        if tag == "table" and self._table_depth:
            self._table_depth -= 1
            if not self._table_depth:
                self.tables.append(" ".join(self._table_text))
        if tag == "div" and self._banner_depth:
            self._banner_depth -= 1
            if not self._banner_depth:
                self.banners.append(" ".join(self._banner_text))

    def handle_data(self, data):
        if self._table_depth:
            self._table_text.append(data.strip())
        if self._banner_depth:
            self._banner_text.append(data.strip())


def parse(page: str) -> tuple[str, _Tags]:
    text = (HTML / f"{page}.html").read_text()
    tags = _Tags()
    tags.feed(text)
    return text, tags


@pytest.fixture(scope="module")
def book(smoke_book):
    """The build log of the session's smoke build of the book (conftest.smoke_book)."""
    assert smoke_book.out == OUT and smoke_book.html == HTML and smoke_book.results == RESULTS
    return smoke_book.log


@pytest.mark.slow
def test_book_builds_every_page_smoke(book):
    assert "[book] config:  smoke" in book, "the build script must say which config it ran"
    assert re.search(r"\[book\] built in \d+s", book), "the build script must report its time"
    for page in PAGES:
        assert (HTML / f"{page}.html").is_file(), f"no HTML for {page}"


@pytest.mark.slow
@pytest.mark.parametrize("page,framework", [("notebooks/01_pytorch_ladder", "torch"),
                                            ("notebooks/02_jax_ladder", "jax")])
def test_book_ladder_pages_show_waterfall_and_smoke_banner(book, page, framework):
    text, tags = parse(page)
    pngs = [src for src in tags.imgs if src.endswith(".png")]
    assert pngs, f"{page}: no image in the page (the waterfall)"
    for src in pngs:
        assert (HTML / page).parent.joinpath(src).resolve().is_file(), f"{page}: <img src={src!r}> has no file"
    assert any("Smoke run" in b for b in tags.banners), f"{page}: no smoke banner admonition"
    data = json.loads((RESULTS / f"{framework}.json").read_text())
    assert data["framework"] == framework and data["config"]["name"] == "smoke"
    assert (RESULTS / f"{framework}_waterfall.png").is_file()


@pytest.mark.slow
def test_book_comparison_page_has_both_waterfalls_and_the_table(book):
    text, tags = parse("notebooks/03_comparison")
    imgs = [src for src in tags.imgs if src.endswith(".png")]
    assert imgs and all((HTML / "notebooks" / src).resolve().is_file() for src in imgs), imgs
    tables = [t for t in tags.tables if "torch tokens/s" in t and "jax tokens/s" in t]
    # the H200 reference first, this build's ladders last (the reference may predate a rung)
    assert len(tables) >= 2, f"want the reference's and this build's tables; tables: {[t[:80] for t in tags.tables]}"
    table = tables[-1]
    torch_rungs = [r["name"] for r in json.loads((RESULTS / "torch.json").read_text())["rungs"]]
    jax_rungs = [r["name"] for r in json.loads((RESULTS / "jax.json").read_text())["rungs"]]
    for name in set(torch_rungs) | set(jax_rungs):
        assert re.search(rf"(^|\s){re.escape(name)}(\s|$)", table), f"rung {name} missing from the table"
    assert any("Smoke run" in b for b in tags.banners), "comparison page must say it is a smoke build"
    assert "each ratio is to the rung that rung builds on" in text.lower()


@pytest.mark.slow
def test_book_status_page(book):
    text, tags = parse("notebooks/00_status")
    assert any("Smoke run" in b for b in tags.banners), "status page must say smoke vs full"
    assert "config: smoke" in text
    exec_table = next((t for t in tags.tables if "Run Time" in t), None)
    assert exec_table is not None, "no execution-time table (nb-exec-table)"
    for nb in ("01_pytorch_ladder", "02_jax_ladder", "03_comparison"):
        assert nb in exec_table, f"{nb} missing from the execution-time table"
    versions = next((t for t in tags.tables if "jupyter-book" in t), "")
    assert "torch" in versions and "jax" in versions and "myst-nb" in versions


@pytest.mark.slow
def test_book_reference_page_renders_committed_results(book):
    text, tags = parse("notebooks/04_h200_reference")
    plain = " ".join(re.sub(r"<[^>]+>", " ", text).split())
    assert "This build ran the smoke configuration" in plain, "the page must say what this build ran"
    committed = [p for p in (ROOT / "benchmarks" / "results").rglob("*.json")
                 if {"framework", "rungs"} <= set(json.loads(p.read_text()))]
    if committed:
        assert len([t for t in tags.tables if "tokens/s" in t]) >= len(committed)
        assert len(tags.imgs) >= len(committed)
    else:
        assert "No reference results are committed yet" in text


@pytest.mark.slow
def test_book_pages_have_no_raw_markup_and_no_network(book):
    for page in PAGES:
        text, _ = parse(page)
        body = text.split('<article class="bd-article">', 1)[-1]
        for raw in (":::{", "```{", "{tab-item}", "{nb-exec-table}"):
            assert raw not in body, f"{page}: raw MyST markup {raw!r} in the HTML"
        external = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?:[^"]+)"', text)
        assert not external, f"{page}: loads {external} from the network"


# -- the python snippets of the markdown pages ---------------------------------------------
def _snippets():
    out = []
    for md in sorted((ROOT / "chapter13").glob("*.md")):
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", md.read_text(), re.S)):
            out.append(pytest.param(block, id=f"{md.stem}-{i}"))
    return out


SNIPPETS = _snippets()


def test_snippets_exist():
    assert len(SNIPPETS) >= 8, "the pages should carry runnable perfladder snippets"


@pytest.mark.parametrize("src", SNIPPETS)
def test_snippet_compiles_and_names_exist(src):
    tree = ast.parse(compile(src, "<snippet>", "exec", flags=ast.PyCF_ONLY_AST))
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("perfladder"):
            mod = importlib.import_module(node.module)
            for a in node.names:
                if not hasattr(mod, a.name):
                    importlib.import_module(f"{node.module}.{a.name}")   # a submodule, or an error
                obj = getattr(mod, a.name, None) or importlib.import_module(f"{node.module}.{a.name}")
                aliases[a.asname or a.name] = obj
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("perfladder"):
                    importlib.import_module(a.name)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and isinstance(aliases[node.value.id], type(sys))):
            assert hasattr(aliases[node.value.id], node.attr), \
                f"{aliases[node.value.id].__name__} has no {node.attr!r} (used as {node.value.id}.{node.attr})"


# -- the build-time pages on their own (fast: no ladder runs) -------------------------------
def _execute(notebook: Path, cwd: Path, env: dict):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient
    nb = nbformat.read(str(notebook), as_version=4)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb


def _outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts += [str(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
    return "\n".join(parts)


def test_comparison_page_fails_clearly_without_the_ladders_json(tmp_path):
    from nbclient.exceptions import CellExecutionError
    with pytest.raises(CellExecutionError) as err:
        _execute(ROOT / "notebooks" / "03_comparison.ipynb", ROOT / "notebooks",
                 {"PERFLADDER_RESULTS_DIR": str(tmp_path), "MPLBACKEND": "Agg"})
    msg = str(err.value)
    assert "FileNotFoundError" in msg and "torch.json, jax.json not found" in msg
    assert "01_pytorch_ladder" in msg and "make book" in msg


def test_reference_page_says_so_when_nothing_is_committed(tmp_path):
    (tmp_path / "_config.yml").write_text("title: t\n")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: index\n")
    (tmp_path / "notebooks").mkdir()
    nb = _execute(ROOT / "notebooks" / "04_h200_reference.ipynb", tmp_path / "notebooks",
                  {"PERFLADDER_CONFIG": "smoke", "MPLBACKEND": "Agg"})
    text = _outputs_text(nb)
    assert "No reference results are committed yet" in text
    assert "This build ran the `smoke` configuration" in text


class _Prose(HTMLParser):
    """A page's words outside code, scripts and styles (the details behind toggles included)."""
    SKIP = {"pre", "code", "script", "style"}

    def __init__(self):
        super().__init__()
        self.words, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in self.SKIP

    def handle_endtag(self, tag):
        self._skip -= tag in self.SKIP and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.words.append(data)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES + ["notebooks/05_scaling"])
def test_no_page_calls_the_chapter_the_seed(book, page):
    """Readers meet "the chapter" and "the chapter's RTX 4090 box", never the word "seed"
    (a form's value written as code, ``--form seed``, is code)."""
    p = _Prose()
    p.feed((HTML / f"{page}.html").read_text())
    text = " ".join(" ".join(p.words).split())
    hits = [text[max(0, m.start() - 60): m.end() + 40] for m in re.finditer(r"\bseed\b", text, re.I)]
    assert not hits, hits[:5]
