"""XLA's settings for the ladder's compiles: made only while they can still take effect, a
user's own value kept, recorded in every results file; the CLI makes the full config's."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

PROBE = """
import json, os
from perfladder.jax import compiler as c
out = {"before": c.backend_started(), "took": c.cublas_gemms(), "again": c.cublas_gemms(),
       "flags": os.environ.get("XLA_FLAGS", "")}
import jax
jax.devices()
out["after"] = c.backend_started()
out["late"] = c.add_xla_flag("--xla_dump_to=/nowhere")
out["flags_after"] = os.environ.get("XLA_FLAGS", "")
from perfladder.jax.device import versions
out["recorded"] = versions()["XLA_FLAGS"]
print(json.dumps(out))
"""


def probe(xla_flags: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = SRC
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_flag_is_set_before_the_backend_starts_once_and_recorded():
    out = probe(None)
    assert out["before"] is False and out["took"] is True and out["again"] is True
    assert out["flags"] == "--xla_gpu_enable_triton_gemm=false"            # once, not twice
    assert out["after"] is True
    # too late: not added (this process's XLA would not read it; its children must compile alike)
    assert out["late"] is False and out["flags_after"] == out["flags"]
    assert out["recorded"] == out["flags"]


def test_a_users_own_setting_wins_and_other_flags_are_kept():
    out = probe("--xla_gpu_enable_triton_gemm=true --xla_gpu_autotune_level=2")
    assert out["flags"] == "--xla_gpu_enable_triton_gemm=true --xla_gpu_autotune_level=2"
    out = probe("--xla_gpu_autotune_level=2")
    assert out["flags"] == "--xla_gpu_autotune_level=2 --xla_gpu_enable_triton_gemm=false"


class FakeJax:
    def __init__(self):
        self.calls = 0

    def cublas_gemms(self):
        self.calls += 1
        return True


@pytest.mark.parametrize("framework, config, env, gpu, made", [
    ("jax", None, None, True, True),          # full picked on a GPU
    ("jax", "full", None, True, True),
    ("jax", None, "full", True, True),
    ("jax", "smoke", None, True, False),      # smoke never
    ("jax", None, "smoke", True, False),
    ("jax", "full", None, False, False),      # no GPU: the flag would only be noise in the record
    ("torch", "full", None, True, False),
])
def test_the_cli_makes_the_full_configs_setting_before_the_backend(monkeypatch, framework, config, env,
                                                                    gpu, made):
    import perfladder.cli as cli
    monkeypatch.setattr(cli, "gpu_present", lambda: gpu)
    if env is None:
        monkeypatch.delenv("PERFLADDER_CONFIG", raising=False)
    else:
        monkeypatch.setenv("PERFLADDER_CONFIG", env)
    fw = FakeJax()
    assert cli.before_backend(fw, framework, config) is made
    assert fw.calls == int(made)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="the CPU suite's setting")
def test_the_suites_own_compiles_on_a_cpu_skip_llvms_optimisations():
    """Every JAX program the CPU suite compiles does so as a smoke lab's would (the flag is in
    ``XLA_FLAGS`` before any test module can start the backend: tests/conftest.py), whichever
    module the worker collected first."""
    from perfladder.jax.compiler import FAST_COMPILE_FLAG, xla_flags
    assert FAST_COMPILE_FLAG in xla_flags().split()
