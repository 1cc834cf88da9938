"""Every rung shows its technique in plain framework code: a rung whose cell passes a switch
(``change=``, a ``recipe.replace(...)`` of anything but the batch) has the library code that
switch selects included in the markdown around its cell, visible (not folded), or, for a
kernel of our own (``fused/``: Triton, Pallas) longer than a screen, folded right beside the
cell under a title that names the rung and the kernel; and every included object exists in
the file it names."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"torch": "01_pytorch_ladder.ipynb", "jax": "02_jax_ladder.ipynb"}
INCLUDE = re.compile(r"```\{literalinclude\} (\S+)\n((?::[\w-]+:.*\n)*)```")


def cells(framework):
    return json.loads((ROOT / "notebooks" / PAGES[framework]).read_text())["cells"]


def visible_includes(markdown: str) -> list[tuple[str, dict]]:
    """``[(path, options)]`` of the literalincludes outside any ``{dropdown}`` block."""
    shown = re.sub(r":::\{dropdown\}.*?\n:::", "", markdown, flags=re.S)
    out = []
    for m in INCLUDE.finditer(shown):
        opts = dict(re.match(r":([\w-]+):\s*(.*)", ln).groups() for ln in m.group(2).splitlines())
        out.append((m.group(1), opts))
    return out


def switches(framework) -> dict[str, int]:
    """``{rung: index of its cell}`` for the rungs run with a ``change=`` that switches
    something other than the batch size and no technique function of the cell's own (a cell
    that hands the ladder its own function, B1's ``make_optimizer``, shows its code)."""
    out = {}
    for i, c in enumerate(cells(framework)):
        if c["cell_type"] != "code":
            continue
        tree = ast.parse(c["source"].replace("%matplotlib inline", ""))
        fns = {n.name: ast.get_source_segment(c["source"], n) for n in tree.body if isinstance(n, ast.FunctionDef)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "run"
                    and getattr(node.func.value, "id", "") == "page"):
                if any(k.arg != "change" for k in node.keywords):
                    continue
                for k in node.keywords:
                    src = fns.get(getattr(k.value, "id", ""), "")
                    if "recipe.replace(" in src and not re.search(r"replace\(batch_size=", src):
                        out[node.args[0].value] = i
    return out


def around(framework, i) -> str:
    """The markdown cells between the code cell before ``i`` and the code cell after it."""
    cs = cells(framework)
    lo = max([j for j in range(i) if cs[j]["cell_type"] == "code"], default=-1) + 1
    hi = min([j for j in range(i + 1, len(cs)) if cs[j]["cell_type"] == "code"], default=len(cs))
    return "\n".join(cs[j]["source"] for j in range(lo, hi) if cs[j]["cell_type"] == "markdown")


def folded_kernels(markdown: str, rung: str) -> list[str]:
    """The kernels of ``fused/`` folded in a dropdown whose title begins with ``rung``'s name."""
    out = []
    for title, body in re.findall(r":::\{dropdown\} ([^\n]*)\n(.*?)\n:::", markdown, flags=re.S):
        for m in INCLUDE.finditer(body + "\n"):
            obj = re.search(r":pyobject: (\S+)", m.group(2))
            if (title.startswith(f"{rung}'s ") and "/fused/" in m.group(1) and obj
                    and f"`{obj.group(1)}`" in title):
                out.append(obj.group(1))
    return out


@pytest.mark.parametrize("framework", PAGES)
def test_every_switch_shows_the_code_it_selects(framework):
    found = switches(framework)
    assert len(found) >= 5, found                       # the switches are found at all
    missing = [name for name, i in found.items() if not visible_includes(around(framework, i))
               and not folded_kernels(around(framework, i), name)]
    assert not missing, f"{PAGES[framework]}: no visible library code beside {missing}"


def _defines(path: Path, dotted: str) -> bool:
    body = ast.parse(path.read_text()).body
    for part in dotted.split("."):
        hit = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if hit is None:
            return False
        body = hit.body
    return True


@pytest.mark.parametrize("framework", PAGES)
def test_every_included_object_exists(framework):
    md = "\n".join(c["source"] for c in cells(framework) if c["cell_type"] == "markdown")
    for m in INCLUDE.finditer(md):
        path = (ROOT / "notebooks" / m.group(1)).resolve()
        assert path.is_file(), m.group(1)
        for ln in m.group(2).splitlines():
            key, _, value = ln[1:].partition(":")
            value = value.strip()
            if key == "pyobject":
                assert _defines(path, value), f"{m.group(1)} defines no {value}"
            if key in ("start-at", "end-at"):
                assert value in path.read_text(), f"{m.group(1)} has no line with {value!r}"
