"""The ladder pages show the code they measure: each technique cell holds exactly the library's
function (one source: the CLI and the tests run what the page shows), every declared rung is run
by a cell, and a cell the reader edits measures the edit."""
from __future__ import annotations

import ast
import inspect
import json
import textwrap
from pathlib import Path

import pytest

from perfladder.config import get_config

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"torch": "01_pytorch_ladder.ipynb", "jax": "02_jax_ladder.ipynb"}


def code_cells(framework: str) -> list[str]:
    nb = json.loads((ROOT / "notebooks" / PAGES[framework]).read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def library_code(framework: str) -> dict:
    """The technique functions a page hands the ladder by name (the lab's ``code``)."""
    if framework == "torch":
        from perfladder.torch.lab import LIBRARY_CODE
        return LIBRARY_CODE
    from perfladder.jax.lab import LIBRARY_CODE
    return LIBRARY_CODE


def library_changes(framework: str) -> dict:
    """The recipe changes a page hands the ladder as ``change=`` (``rungs/changes.py``)."""
    import importlib
    return importlib.import_module(f"perfladder.{framework}.rungs.changes").CHANGES


def defined(cell: str) -> dict[str, str]:
    """``{function name: its source}`` for the top-level functions a cell defines."""
    tree = ast.parse(cell.replace("%matplotlib inline", ""))
    lines = cell.splitlines()
    return {n.name: "\n".join(lines[n.lineno - 1 - len(n.decorator_list): n.end_lineno])
            for n in tree.body if isinstance(n, ast.FunctionDef)}


def runs(cell: str) -> list[tuple[str, list[str]]]:
    """``[(rung, [technique keywords])]`` of the ``page.run(...)`` calls in a cell (the recipe
    change, ``change=``, is not a technique keyword: ``changes(cell)``)."""
    out = []
    for node in ast.walk(ast.parse(cell.replace("%matplotlib inline", ""))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "run" and getattr(node.func.value, "id", "") == "page"):
            out.append((node.args[0].value, [k.arg for k in node.keywords if k.arg != "change"]))
    return out


def changes(cell: str) -> dict[str, str]:
    """``{rung: the name of the function passed as change=}`` of a cell's ``page.run`` calls."""
    out = {}
    for node in ast.walk(ast.parse(cell.replace("%matplotlib inline", ""))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "run" and getattr(node.func.value, "id", "") == "page"):
            for k in node.keywords:
                if k.arg == "change":
                    out[node.args[0].value] = k.value.id
    return out


@pytest.mark.parametrize("framework", PAGES)
def test_every_technique_cell_is_the_library_function(framework):
    lib = {**library_code(framework), **library_changes(framework)}
    shown = {}
    for cell in code_cells(framework):
        for name, source in defined(cell).items():
            if name in lib:
                shown[name] = source
    assert set(shown) == set(lib), f"technique cells missing for {sorted(set(lib) - set(shown))}"
    for name, source in shown.items():
        want = textwrap.dedent(inspect.getsource(lib[name])).rstrip()
        assert source.rstrip() == want, (f"{PAGES[framework]}: the cell's {name} differs from the "
                                         f"library's ({inspect.getsourcefile(lib[name])}): edit both")


@pytest.mark.parametrize("framework", PAGES)
def test_every_declared_rung_is_run_by_a_cell_in_ladder_order_with_its_code(framework):
    import importlib
    rungs = importlib.import_module(f"perfladder.{framework}").RUNGS
    calls = [c for cell in code_cells(framework) for c in runs(cell)]
    names = [n for n, _ in calls]
    assert names == [n for n, r in rungs.items() if not r.optional]
    lib = library_code(framework)
    passed = {k for _, kws in calls for k in kws}
    assert passed == set(lib)                 # every technique function handed to the ladder
    # every recipe change a cell shows is the one its rung declares, and every declared change
    # of the library's is shown
    shown = {rung: fn for cell in code_cells(framework) for rung, fn in changes(cell).items()}
    chg = library_changes(framework)
    assert all(rungs[rung].change is chg[fn] for rung, fn in shown.items()), shown
    assert set(shown.values()) == set(chg)


def _exec_cells(framework: str, page, rungs: tuple[str, ...], edit=None) -> dict:
    """Run the notebook's cells that run ``rungs`` as the notebook has them (after ``edit(source)
    -> source``), with ``page`` in place of the notebook's own; of the cells before them only
    the functions they define (the earlier rungs need not run: a rung builds on its declared
    base's recipe)."""
    setup, *cells = code_cells(framework)
    imports = [ln for ln in setup.splitlines() if ln.startswith(("import ", "from "))]
    env = {}
    exec("\n".join(imports), env)                    # the first cell's imports, not its page
    env["page"] = page
    for cell in cells:
        src = edit(cell) if edit else cell
        mine = [n for n, _ in runs(src) if n in rungs]
        if mine:
            exec(compile(src, PAGES[framework], "exec"), env)
        else:
            tree = ast.parse(src)
            tree.body = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
            exec(compile(tree, PAGES[framework], "exec"), env)
        if rungs[-1] in mine:
            break
    return env


def test_editing_a_torch_cell_measures_the_edit():
    """R1's cell with ``torch.compile`` edited out runs uncompiled; R2's with float16 in place of
    bf16 is refused by its receipt -- both measured from the edited cell, not the library."""
    import torch

    from perfladder.pages.ladder import LadderPage
    page = LadderPage("torch", get_config("smoke"), show_header=False)
    page.show = lambda *a, **k: None

    def edit(src):
        src = src.replace("return torch.compile(model, dynamic=False, mode=mode)", "return model")
        return src.replace("dtype=torch.bfloat16", "dtype=torch.float16")

    env = _exec_cells("torch", page, ("R1", "R2"), edit)
    r1, r2 = page.live.rung("R1"), page.live.rung("R2")
    assert r1.measured and r1.compile.compilations == 0        # nothing compiled: the edit ran
    assert page.ladder.lab.code["compile_model"] is env["compile_model"]
    assert not r2.measured and "claims bf16" in r2.error and "float16" in r2.error
    assert torch.get_float32_matmul_precision() == "high"


def test_editing_a_jax_cell_measures_the_edit():
    """R1's cell with ``nnx.jit`` edited out gives an un-jitted step, which the measurement of a
    jitted rung refuses (it has no compiled program to plan) -- the edit, not the library, ran."""
    import perfladder.jax as pj
    from perfladder.pages.ladder import LadderPage
    pj.fast_cpu_compiles()
    page = LadderPage("jax", get_config("smoke"), show_header=False)
    page.show = lambda *a, **k: None
    env = _exec_cells("jax", page, ("R1",), lambda s: s.replace("return nnx.jit(step_fn)", "return step_fn"))
    r1 = page.live.rung("R1")
    assert page.ladder.lab.code["jit_step"] is env["jit_step"]
    assert not r1.measured and "compiled program" in r1.error
