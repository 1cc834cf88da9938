"""The ladder notebooks as a reader runs them, cell by cell in a real Jupyter kernel (nbclient),
on the smoke config: a rung's cell run again is measured again and shown beside the version it
replaced (and the reference run), an edited technique is what runs, the rungs built on the
earlier version are marked, an interrupted cell leaves the ladder as it was and runs again,
cells run out of order, the cells after the rungs run twice, and a fresh kernel (a restart)
reproduces the page. Each step checks what the page shows and what ``page.save()`` writes.

Only cheap cells run (imports, R0 and B3, which is not applicable on a CPU, for PyTorch, whose
other rungs each compile for tens of seconds on a CPU; R1 and R2a for JAX); the engine's rule
for every kind of rung, and the kernel report and learning check cells run twice, are tested on
a fake lab (tests/ladder/test_rerun.py, tests/pages/test_rerun.py)."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"torch": "01_pytorch_ladder.ipynb", "jax": "02_jax_ladder.ipynb"}

# the kernel's view of its ladder, one line of JSON
LEDGER = """
import json as _json
print("LEDGER", _json.dumps({
    "rungs": [[r.name, r.result_kind, r.tokens_per_s, r.built_on_earlier,
               (r.replaces or {}).get("tokens_per_s")] for r in page.live.rungs],
    "code": {k: getattr(f, "__doc__", "") for k, f in page.ladder.lab.code.items()},
    "chain": sorted(page.ladder.chain.recipes)}))
"""
# a measurement that holds until it is interrupted (a long compile, a slow GPU), once: the lab's
# own measure is put back before the test is told to interrupt, so an interrupt that lands at
# once cannot leave the slow one in place for the run after it
SLOW_MEASURE = """
import time as _time
_measure = page.ladder.lab.measure
def _slow(*a, **k):
    page.ladder.lab.measure = _measure
    open({ready!r}, "w").close()
    while True:
        _time.sleep(0.05)
page.ladder.lab.measure = _slow
"""


class Reader:
    """A notebook in a kernel, run cell by cell as a reader does: a cell is run in its place
    (an edit replaces its source there), a line of the reader's own in a new cell at the end."""

    def __init__(self, framework: str, tmp_path: Path):
        self.framework, self.tmp = framework, tmp_path
        self.nb = nbformat.read(ROOT / "notebooks" / PAGES[framework], as_version=4)
        self.source = [c.source for c in self.nb.cells]          # as the notebook has them
        self.client = nbclient.NotebookClient(self.nb, kernel_name="python3", timeout=300,
                                              resources={"metadata": {"path": str(ROOT / "notebooks")}})

    def cell(self, needle: str) -> int:
        """The index of the code cell whose source holds ``needle``."""
        return next(i for i, c in enumerate(self.nb.cells) if c.cell_type == "code" and needle in c.source)

    def run(self, cell: int | str, *, edit: tuple[str, str] | None = None) -> str:
        """Execute notebook cell ``cell`` (``edit``: with one string of its source replaced, as a
        reader edits it) or a line of the reader's own; its text output."""
        if isinstance(cell, str):
            self.nb.cells.append(nbformat.v4.new_code_cell(cell))
            index = len(self.nb.cells) - 1
        else:
            source, index = self.source[cell], cell
            if edit is not None:
                assert edit[0] in source, edit
                source = source.replace(*edit)
            self.nb.cells[index] = nbformat.v4.new_code_cell(source)
        self.client.execute_cell(self.nb.cells[index], index)
        return self.text(index)

    def text(self, index: int) -> str:
        """What cell ``index`` shows now (a later cell may have updated its displays)."""
        return "\n".join(o.get("text") or o.get("data", {}).get("text/plain", "")
                         for o in self.nb.cells[index].outputs)

    def ledger(self) -> dict:
        out = self.run(LEDGER)
        return json.loads(out.split("LEDGER ", 1)[1])

    def interrupted(self, cell, *, edit=None) -> str:
        """Run ``cell`` and interrupt the kernel (as its Interrupt button does) once the rung is
        measuring; the error the cell ends with."""
        ready = self.tmp / "measuring"
        self.run(SLOW_MEASURE.format(ready=str(ready)))

        def interrupt():
            deadline = time.monotonic() + 120
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            asyncio.run(self.client.km.interrupt_kernel())          # the kernel's Interrupt
        t = threading.Thread(target=interrupt)
        t.start()
        try:
            with pytest.raises(nbclient.exceptions.CellExecutionError) as e:
                self.run(cell, edit=edit)
        finally:
            t.join()
        ready.unlink()
        return e.value.ename

    def saved(self) -> dict:
        self.run(f"page.save({str(self.tmp / 'out')!r})")
        return json.loads((self.tmp / "out" / f"{self.framework}.json").read_text())


@pytest.fixture
def reader_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFLADDER_CONFIG", "smoke")
    monkeypatch.setenv("PERFLADDER_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return tmp_path


def rungs(ledger: dict) -> dict:
    return {r[0]: dict(zip(("outcome", "rate", "marks", "replaced"), r[1:])) for r in ledger["rungs"]}


def test_torch_page_as_a_reader_runs_it(reader_env):
    pytest.importorskip("torch")
    reader = Reader("torch", reader_env)
    imports, r0, b3 = reader.cell("LadderPage("), reader.cell('page.run("R0"'), reader.cell('page.run("B3"')
    with reader.client.setup_kernel():
        reader.run(imports)
        out = reader.run(b3)                               # out of order: a beyond rung first
        assert "B3 (+CUDA graphs) did not run here: not applicable on CPU" in out
        out = reader.run(r0)
        assert "R0 (eager) ran" in out and "Run again" not in out
        first = rungs(reader.ledger())["R0"]
        out = reader.run(r0)                               # the same cell, twice
        again = rungs(reader.ledger())["R0"]
        assert again["replaced"] == first["rate"] and again["outcome"] == "measured"
        assert "Run again: " in out and "the version it replaced: " in out
        assert "the reference run (NVIDIA" in out
        # the reader edits the technique: the edit is what runs
        edit = ('"""R0\'s step up to the optimizer:', '"""EDITED: R0\'s step up to the optimizer:')
        out = reader.run(r0, edit=edit)
        ledger = reader.ledger()
        assert ledger["code"]["loss_and_grads"].startswith("EDITED") and "Run again" in out
        assert rungs(ledger)["R0"]["replaced"] == again["rate"]
        # interrupted while measuring another edit: nothing changes, the cell runs again
        before = reader.ledger()
        edit2 = ('"""R0\'s step up to the optimizer:', '"""SECOND EDIT: R0\'s step up to the optimizer:')
        assert reader.interrupted(r0, edit=edit2) == "KeyboardInterrupt"
        assert reader.ledger() == before                   # no entry, code or chain half-changed
        out = reader.run(r0, edit=edit2)
        ledger = reader.ledger()
        assert ledger["code"]["loss_and_grads"].startswith("SECOND EDIT")
        assert [r[0] for r in ledger["rungs"]] == ["B3", "R0"]
        # the cells after the rungs, each twice
        table, water = reader.cell("page.table()"), reader.cell("page.waterfall()")
        outs = [(reader.run(table), reader.run(water)) for _ in range(2)]
        assert outs[0] == outs[1] and "Run again in this session: R0." in outs[0][0]
        assert reader.run(b3) == reader.run(b3)            # not applicable, twice: said the same
        saved = reader.saved()
        assert [(r["name"], r["outcome"], r["built_on_earlier"]) for r in saved["rungs"]] == [
            ("B3", "not_applicable", []), ("R0", "measured", [])]
        assert saved["rungs"][1]["replaces"]["tokens_per_s"] == rungs(before)["R0"]["rate"]
    with reader.client.setup_kernel():                     # restart: the same prefix, the page again
        reader.run(imports)
        out = reader.run(r0)
        assert "R0 (eager) ran" in out and "Run again" not in out
        assert [r[0] for r in reader.ledger()["rungs"]] == ["R0"]


def test_jax_page_as_a_reader_runs_it(reader_env):
    pytest.importorskip("jax")
    reader = Reader("jax", reader_env)
    imports, r1, r2a = reader.cell("LadderPage("), reader.cell('page.run("R1"'), reader.cell('page.run("R2a"')
    with reader.client.setup_kernel():
        reader.run(imports)
        out = reader.run(r1)                               # out of order: R0 never ran
        assert "R1 (jit (whole step)) ran" in out
        reader.run(r2a)
        first = rungs(reader.ledger())
        assert first["R2a"]["marks"] == [] and list(first) == ["R1", "R2a"]
        # R1 edited and run again: R2a, built on it, is marked until its cell runs again
        edit = ('"""R1: the whole step', '"""EDITED R1: the whole step')
        out = reader.run(r1, edit=edit)
        now = rungs(ledger := reader.ledger())
        assert ledger["code"]["jit_step"].startswith("EDITED")
        assert now["R1"]["replaced"] == first["R1"]["rate"] and now["R2a"]["marks"] == ["R1"]
        assert "Run again: " in out and "the reference run (NVIDIA" in out
        assert "R2a (of R1)" in reader.text(imports)        # the header, at the top, says so
        table, glue = reader.cell("page.table()"), reader.cell("page.glue()")
        assert "R2a (of R1)" in reader.run(table)
        assert "R2a (of R1)" in reader.run(glue)           # the page's numbers, then what they stand on
        saved = {r["name"]: r for r in json.loads((reader_env / "results" / "jax.json").read_text())["rungs"]}
        assert saved["R2a"]["built_on_earlier"] == ["R1"] and saved["R1"]["replaces"] is not None
        # interrupted while R2a measures: still marked, nothing half-recorded; then run again
        assert reader.interrupted(r2a) == "KeyboardInterrupt"
        assert rungs(reader.ledger()) == now
        out = reader.run(r2a)
        assert "R2a (naive bf16 cast) ran" in out
        now = rungs(reader.ledger())
        assert now["R2a"]["marks"] == [] and now["R2a"]["replaced"] == first["R2a"]["rate"]
        out = reader.run(glue)
        assert "Run again in this session: R1 and R2a." in out and "R2a (of R1)" not in out
        saved = {r["name"]: r for r in json.loads((reader_env / "results" / "jax.json").read_text())["rungs"]}
        assert saved["R2a"]["built_on_earlier"] == [] and list(saved) == ["R1", "R2a"]
    with reader.client.setup_kernel():                     # restart: the same prefix, the page again
        reader.run(imports)
        out = reader.run(r1)
        assert "R1 (jit (whole step)) ran" in out and "Run again" not in out
        assert list(rungs(reader.ledger())) == ["R1"] and "Rungs run again" not in reader.text(imports)
