"""Each framework subpackage imports only its own framework; the shared modules import neither.

Every check runs in a fresh interpreter, since this test process has both frameworks loaded.
"""
from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys

import pytest

FRAMEWORKS = ("torch", "jax", "jaxlib", "flax", "optax")

PROBE = """
import importlib, sys
for name in {modules!r}:
    importlib.import_module(name)
print(sorted(m for m in {frameworks!r} if m in sys.modules))
"""


def loaded_after(*modules: str) -> list[str]:
    code = PROBE.format(modules=list(modules), frameworks=list(FRAMEWORKS))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def framework_free_modules() -> list[str]:
    """Every module of the package outside the two framework sides (``perfladder.torch``,
    ``perfladder.jax``), found by walking the package: a new module is covered without a list."""
    import perfladder
    return [m.name for m in pkgutil.walk_packages(perfladder.__path__, "perfladder.")
            if not m.name.startswith(("perfladder.torch", "perfladder.jax"))
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


@pytest.mark.parametrize("pkg, allowed", [
    ("perfladder.torch", ["torch"]),
    ("perfladder.jax", ["flax", "jax", "jaxlib", "optax"]),
    ("perfladder.torch.fused.rope perfladder.torch.fused.add_layer_norm perfladder.torch.fused.gelu "
     "perfladder.torch.fused.attention perfladder.torch.fused.mlp",
     ["torch"]),
    ("perfladder.jax.fused.add_layer_norm perfladder.jax.fused.attention", ["flax", "jax", "jaxlib", "optax"]),
])
def test_framework_subpackage_imports_only_its_own(pkg, allowed):
    loaded = loaded_after(*pkg.split())
    assert pkg.split(".")[1] in loaded                  # the probe does see a framework
    assert set(loaded) <= set(allowed), f"{pkg} also imported {sorted(set(loaded) - set(allowed))}"
