"""Each framework subpackage imports only its own framework; the shared modules import neither;
importing a framework side loads no pyplot (``plt`` comes when used) and perfladder.torch sets
TEARDOWN_CUPTI before any profiler can start.

Every check runs in a fresh interpreter, since this test process has both frameworks loaded:
one per framework side serves all of that side's checks.
"""
from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys

import pytest

FRAMEWORKS = ("torch", "jax", "jaxlib", "flax", "optax")

PROBE = """
import importlib, json, os, sys
assert "TEARDOWN_CUPTI" not in os.environ
seen = []
for group in {groups!r}:
    for name in group:
        importlib.import_module(name)
    seen.append({{"frameworks": sorted(m for m in {frameworks!r} if m in sys.modules),
                 "pyplot": "matplotlib.pyplot" in sys.modules,
                 "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI")}})
print(json.dumps(seen))
"""


def probe(*groups: list[str]) -> list[dict]:
    """Import each group of modules in turn in one fresh interpreter (no TEARDOWN_CUPTI in its
    environment); after each group, which frameworks are loaded, whether matplotlib.pyplot is,
    and TEARDOWN_CUPTI. The first group's record is exactly what it imports alone; a later
    one's, what it imports with the groups before it."""
    code = PROBE.format(groups=[list(g) for g in groups], frameworks=list(FRAMEWORKS))
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def loaded_after(*modules: str) -> list[str]:
    return probe(modules)[0]["frameworks"]


def framework_free_modules() -> list[str]:
    """Every module of the package outside the two framework sides (``perfladder.torch``,
    ``perfladder.jax``, and the compile-ahead's ``perfladder.ahead.torch`` / ``.jax``), found by
    walking the package: a new module is covered without a list."""
    import perfladder
    return [m.name for m in pkgutil.walk_packages(perfladder.__path__, "perfladder.")
            if not m.name.startswith(("perfladder.torch", "perfladder.jax", "perfladder.ahead.torch",
                                      "perfladder.ahead.jax"))
            and m.name != "perfladder.__main__"]


def test_framework_free_modules_import_neither():
    mods = framework_free_modules()
    assert {"perfladder.pages.ladder", "perfladder.ladder.engine", "perfladder.results.record",
            "perfladder.kernels.roofline", "perfladder.multigpu.costmodel", "perfladder.measure.counts"} <= set(mods)
    assert loaded_after(*mods) == []


def test_perfladder_package_does_not_import_parity():
    code = "import perfladder, sys; print('perfladder.parity' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# each framework side in one interpreter: the subpackage itself first (its record is what it
# imports alone), then its fused kernels (which import the subpackage first in any case)
TORCH_FUSED = ("perfladder.torch.fused.rope perfladder.torch.fused.add_layer_norm "
               "perfladder.torch.fused.gelu perfladder.torch.fused.attention perfladder.torch.fused.mlp")
JAX_FUSED = "perfladder.jax.fused.add_layer_norm perfladder.jax.fused.attention"
SIDES = {"torch": ("perfladder.torch", TORCH_FUSED), "jax": ("perfladder.jax", JAX_FUSED)}


@pytest.fixture(scope="module")
def sides():
    """``{package or module list: its probe record}`` for both framework sides (``probe``)."""
    got = {}
    for pkgs in SIDES.values():
        got.update(zip(pkgs, probe(*(p.split() for p in pkgs))))
    return got


@pytest.mark.parametrize("pkg, allowed", [
    ("perfladder.torch", ["torch"]),
    ("perfladder.jax", ["flax", "jax", "jaxlib", "optax"]),
    (TORCH_FUSED, ["torch"]),
    (JAX_FUSED, ["flax", "jax", "jaxlib", "optax"]),
])
def test_framework_subpackage_imports_only_its_own(sides, pkg, allowed):
    loaded = sides[pkg]["frameworks"]
    assert pkg.split(".")[1] in loaded                  # the probe does see a framework
    assert set(loaded) <= set(allowed), f"{pkg} also imported {sorted(set(loaded) - set(allowed))}"


def test_import_perfladder_jax_does_not_import_torch(sides):
    assert "torch" not in sides["perfladder.jax"]["frameworks"]


@pytest.mark.parametrize("pkg", ["perfladder.torch", "perfladder.jax"])
def test_plt_is_imported_only_when_used(sides, pkg):
    """``from perfladder import torch as d2l`` (or jax) provides ``plt`` without importing pyplot."""
    assert sides[pkg]["pyplot"] is False


def test_import_sets_teardown_before_any_profiler_and_no_jax(sides):
    """perfladder.torch sets TEARDOWN_CUPTI=1 when imported (before any profiler can start)."""
    got = sides["perfladder.torch"]
    assert got["TEARDOWN_CUPTI"] == "1"
    assert not set(got["frameworks"]) & {"jax", "jaxlib", "flax", "optax"}
