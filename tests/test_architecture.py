"""The floor plan, checked from the source: every ``import`` of every module (module level and
inside functions, parsed with ``ast``, nothing executed) forms a graph in which

* no perfladder modules import each other in a circle;
* nothing in ``measure/``, ``ladder/``, ``results/`` or ``multigpu/`` imports ``pages/`` or ``book/``, directly
  or through other modules (data flows one way: the record never reaches up into what shows it);
* the framework-free modules import neither framework (nor a framework side of perfladder), and
  each framework side imports only its own framework (a framework side: ``torch/``, ``jax/``,
  and in a package with one module per framework, such as ``ahead/``, its ``torch`` and ``jax``
  modules);
* the compile-ahead annex (``ahead/``) has one door: outside it, modules import the package
  (``perfladder.ahead``) and none of its modules, but for the re-exports left at the annex's
  old import paths;
* on each framework side the parallel machinery sits below the rungs that use it: nothing in
  ``parallel/`` imports ``rungs/``, directly or through other modules (the side's package
  included, whose ``__init__`` imports its rungs). An import by name at run time
  (``importlib.import_module("...")``) is an edge this graph cannot see, so a ``parallel/``
  module may name a ``rungs/`` module in a string only where it hands on what lives there
  (``PARALLEL_SHIMS``).

The checker is run on the package and on a small planted tree, where it must find each kind
of violation. Importing ``a.b.c`` also runs the package ``a.b``'s ``__init__``; that implicit
edge is left out, so a package whose ``__init__`` imports its own modules is not a circle.
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "perfladder"
LOWER = ("measure", "ladder", "results", "multigpu")   # may not import UPPER
UPPER = ("pages", "book")
FRAMEWORKS = {"torch": ("torch", "triton"), "jax": ("jax", "jaxlib", "flax", "optax")}
# modules that choose a framework on purpose: the package's own entry point (``ladder()``
# imports the side asked for) and the cross-framework parity check
BOTH_SIDES = ("", "parity")
ANNEX = "ahead"                                   # optional: reached through its package alone
# the annex's old import paths, which hand its names on (a user's import keeps working)
ANNEX_SHIMS = ("torch.ahead", "jax.ahead", "book.ahead", "ladder.expected")
# the parallel modules that hand on, imported by name at first use, the rungs' recipe resolution
# (a user's import from the old path, and the CLI's -m path, keep working): {module: the one named}
PARALLEL_SHIMS = {"torch.parallel.launch": "torch.rungs.recipes", "jax.parallel.measure": "jax.rungs.recipes"}


def modules(root: Path) -> dict[str, Path]:
    """``{dotted name: file}`` of the package at ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every module name ``name`` imports (perfladder modules resolved to the module, others
    to their top-level package)."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            head = ".".join([*base[:len(base) - node.level + 1], node.module or ""] if node.level
                            else [node.module]).strip(".")
            out.update(f"{head}.{a.name}" if f"{head}.{a.name}" in mods else head for a in node.names)
    resolved = set()
    for target in out:
        mod = target
        while mod and mod not in mods:
            mod = mod.rpartition(".")[0]
        resolved.add(mod or target.split(".")[0])
    return resolved - {name}


def named(path: Path, mods: dict[str, Path]) -> set[str]:
    """The modules of ``mods`` a module names in a string (an import by name at run time, which
    ``imported`` does not see)."""
    return {n.value for n in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in mods}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def reached(graph: dict[str, set[str]], start: str, stop=lambda m: False) -> dict[str, list[str]]:
    """Every module ``start`` imports, directly or through others (not through a module ``stop``
    says to stop at): ``{module: the modules in between}`` (the shortest chain)."""
    via, todo = {start: []}, [start]
    while todo:
        m = todo.pop(0)
        if m != start and stop(m):
            continue
        for t in sorted(graph[m]):
            if t not in via:
                via[t] = via[m] + ([m] if m != start else [])
                todo.append(t)
    del via[start]
    return via


def violations(root: Path) -> list[str]:
    """What in the package at ``root`` breaks the floor plan (see the module docstring)."""
    pkg, mods = root.name, modules(root)
    graph = {m: {t for t in imported(m, p, mods) if t in mods} for m, p in mods.items()}
    found = [f"import circle among {', '.join(c)}" for c in circles(graph)]

    def area(m: str) -> str:
        return m.split(".")[1] if "." in m else ""

    def side(m: str) -> str | None:
        """The framework a module belongs to: its folder's, or in a folder of one module per
        framework (``ahead/torch.py``), its own name's; None for framework-free code."""
        if area(m) in FRAMEWORKS:
            return area(m)
        last = m.split(".")[-1]
        return last if last in FRAMEWORKS and m.count(".") == 2 else None

    def layer(m: str) -> str | None:
        """The folder of a framework side a module is in (``parallel``, ``rungs``, ...)."""
        return m.split(".")[2] if area(m) in FRAMEWORKS and m.count(".") >= 2 else None
    for m, path in mods.items():
        targets = imported(m, path, mods)
        if area(m) in LOWER:
            for t, via in sorted(reached(graph, m, stop=lambda t: area(t) in UPPER).items()):
                if area(t) in UPPER:
                    chain = f" (through {' -> '.join(via)})" if via else ""
                    found.append(f"{m} imports {t}{chain}: {area(m)}/ may not import {area(t)}/")
        if area(m) != ANNEX and m.removeprefix(pkg).lstrip(".") not in ANNEX_SHIMS:
            for t in sorted(targets):
                if area(t) == ANNEX and t != f"{pkg}.{ANNEX}":
                    found.append(f"{m} imports {t}: only {pkg}.{ANNEX} opens onto {ANNEX}/")
        if layer(m) == "parallel":
            below = f"{area(m)}/parallel/ may not import {area(m)}/rungs/"
            for t, via in sorted(reached(graph, m, stop=lambda t: layer(t) == "rungs").items()):
                if area(t) == area(m) and layer(t) == "rungs":
                    chain = f" (through {' -> '.join(via)})" if via else ""
                    found.append(f"{m} imports {t}{chain}: {below}")
            shim = PARALLEL_SHIMS.get(m.removeprefix(pkg).lstrip("."))
            for t in sorted(named(path, mods)):
                if area(t) == area(m) and layer(t) == "rungs" and t != f"{pkg}.{shim}":
                    found.append(f"{m} names {t}: {below}, by name neither (PARALLEL_SHIMS)")
        if m.removeprefix(pkg).lstrip(".") in BOTH_SIDES:
            continue
        for t in sorted(targets):
            fw = next((f for f, tops in FRAMEWORKS.items() if t.split(".")[0] in tops
                       or t in mods and side(t) == f), None)
            if fw is not None and fw != side(m):
                found.append(f"{m} imports {t}: {side(m) or 'framework-free'} code may not import {fw}")
    return found


def test_the_package_follows_the_floor_plan():
    assert violations(SRC) == []


def plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checker_finds_each_planted_violation(tmp_path):
    pkg = plant(tmp_path / "pkg", {
        "__init__.py": "",
        "measure/__init__.py": "", "pages/__init__.py": "", "ladder/__init__.py": "",
        "torch/__init__.py": "", "jax/__init__.py": "from .rungs import seed\n",
        # an upward import that closes a circle through a page module
        "measure/timing.py": "from pkg.pages.words import rate\n",
        "pages/words.py": "from ..measure import timing\n",
        # a framework imported inside a function of framework-free code
        "ladder/engine.py": "def run():\n    import torch\n    return torch\n",
        # a framework side reaching into the other framework, and free code into a side
        "torch/lab.py": "import torch\nfrom flax import nnx\n",
        "jax/lab.py": "import jax\n",
        "ladder/rungs.py": "from pkg.jax import lab\n",
        # an upward import through a module outside the lower folders
        "results/__init__.py": "", "kernels/__init__.py": "", "multigpu/__init__.py": "",
        "results/record.py": "from pkg.kernels import cost\n",
        "kernels/cost.py": "from pkg.pages import words\n",
        # the multi-GPU records below the pages too
        "multigpu/measurement.py": "from pkg.pages.words import rate\n",
        # the annex: its framework modules are sides, its door is framework-free, and only the
        # door is imported from outside (a shim at an old path excepted)
        "ahead/__init__.py": "import importlib\n", "ahead/torch.py": "import torch\n",
        "ahead/jax.py": "from pkg.ahead import torch\n",
        "ladder/engine2.py": "from pkg.ahead import torch\n",
        "ladder/expected.py": "from pkg.ahead.torch import compile_ahead\n",
        "torch/rungs.py": "from pkg import ahead\n",
        # each side's parallel/ below its rungs/: directly, through the side's package, and by
        # name at run time (a listed hand-on excepted)
        "torch/parallel/__init__.py": "", "torch/parallel/measure.py": "from pkg.torch import rungs\n",
        "torch/parallel/worker.py": "import importlib\nimportlib.import_module('pkg.torch.rungs')\n",
        "jax/parallel/__init__.py": "", "jax/rungs/__init__.py": "", "jax/rungs/seed.py": "",
        "jax/rungs/recipes.py": "", "jax/parallel/measure.py": "RECIPES = 'pkg.jax.rungs.recipes'\n",
        "jax/parallel/launch.py": "import pkg.jax\n",
    })
    got = violations(pkg)
    assert "import circle among pkg.measure.timing, pkg.pages.words" in got
    assert "pkg.measure.timing imports pkg.pages.words: measure/ may not import pages/" in got
    assert "pkg.ladder.engine imports torch: framework-free code may not import torch" in got
    assert "pkg.torch.lab imports flax: torch code may not import jax" in got
    assert "pkg.ladder.rungs imports pkg.jax.lab: framework-free code may not import jax" in got
    assert ("pkg.results.record imports pkg.pages.words (through pkg.kernels.cost): results/ may not "
            "import pages/") in got
    assert "pkg.multigpu.measurement imports pkg.pages.words: multigpu/ may not import pages/" in got
    assert "pkg.ahead.jax imports pkg.ahead.torch: jax code may not import torch" in got
    assert "pkg.ladder.engine2 imports pkg.ahead.torch: only pkg.ahead opens onto ahead/" in got
    assert "pkg.ladder.engine2 imports pkg.ahead.torch: framework-free code may not import torch" in got
    assert "pkg.ladder.expected imports pkg.ahead.torch: framework-free code may not import torch" in got
    assert "pkg.torch.parallel.measure imports pkg.torch.rungs: torch/parallel/ may not import torch/rungs/" in got
    assert ("pkg.jax.parallel.launch imports pkg.jax.rungs.seed (through pkg.jax): jax/parallel/ may "
            "not import jax/rungs/") in got
    assert ("pkg.torch.parallel.worker names pkg.torch.rungs: torch/parallel/ may not import "
            "torch/rungs/, by name neither (PARALLEL_SHIMS)") in got
    assert len(got) == 14, got
    (pkg / "pages/words.py").write_text("RATE = 1\n")                 # the circle broken ...
    (pkg / "measure/timing.py").write_text("import json\n")           # ... and the upward import
    (pkg / "torch/parallel/measure.py").write_text("RECIPES = 'the rungs hand it the recipe'\n")
    assert len(violations(pkg)) == 11


def test_relative_imports_resolve_to_the_module_they_name(tmp_path):
    pkg = plant(tmp_path / "pkg", {"__init__.py": "", "results/__init__.py": "from . import record\n",
                                   "results/record.py": "from .schema import v1\n",
                                   "results/schema/__init__.py": "", "results/schema/v1.py": ""})
    mods = modules(pkg)
    assert imported("pkg.results", mods["pkg.results"], mods) == {"pkg.results.record"}
    assert imported("pkg.results.record", mods["pkg.results.record"], mods) == {"pkg.results.schema.v1"}
    assert violations(pkg) == []
