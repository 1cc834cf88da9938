"""Each framework subpackage imports only its own framework; the shared modules import neither.

Every check runs in a fresh interpreter, since this test process has both frameworks loaded.
"""
from __future__ import annotations

import ast
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


def test_framework_free_modules_import_neither():
    mods = ["perfladder", "perfladder.data", "perfladder.config", "perfladder.hardware",
            "perfladder.results.record", "perfladder.measure.timing", "perfladder.pages.plot", "perfladder.cli",
            "perfladder.measure.gates", "perfladder.measure.counts",
            "perfladder.book.paths", "perfladder.pages.report", "perfladder.ladder.engine", "perfladder.measure.evidence",
            "perfladder.measure.verdict", "perfladder.results.schema", "perfladder.results.schema.v1", "perfladder.measure.learning",
            "perfladder.kernels", "perfladder.outputs", "perfladder.checks", "perfladder.idiom",
            "perfladder.pages.ladder", "perfladder.pages.narrative", "perfladder.pages.reading", "perfladder.pages.cards",
            "perfladder.pages.claims", "perfladder.ladder.techniques", "perfladder.kernels.roofline"]
    assert loaded_after(*mods) == []


def test_perfladder_package_does_not_import_parity():
    code = "import perfladder, sys; print('perfladder.parity' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("pkg, allowed", [
    ("perfladder.torch", ["torch"]),
    ("perfladder.jax", ["flax", "jax", "jaxlib", "optax"]),
    ("perfladder.torch.fused.rope perfladder.torch.fused.add_layer_norm perfladder.torch.fused.gelu",
     ["torch"]),
    ("perfladder.jax.fused.add_layer_norm", ["flax", "jax", "jaxlib", "optax"]),
])
def test_framework_subpackage_imports_only_its_own(pkg, allowed):
    loaded = loaded_after(*pkg.split())
    assert pkg.split(".")[1] in loaded                  # the probe does see a framework
    assert set(loaded) <= set(allowed), f"{pkg} also imported {sorted(set(loaded) - set(allowed))}"
