"""benchmarks/attention_kernel.py --smoke: both parts run on CPU (interpreters), check, time and
write their JSON; the table names what ran."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "attention_kernel.py"


def _run(tmp_path, *args, timeout=900):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "attention.json"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_smoke_both_frameworks(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("jax")
    proc = _run(tmp_path, "--smoke", "--no-sweep", "--torch-configs", "attention+mlp+bf16res",
                "--jax-configs", "attention")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = json.loads((tmp_path / "attention.json").read_text())
    assert set(out["parts"]) == {"torch", "jax"}
    for fw, part in out["parts"].items():
        assert part["smoke"] and part["errors"] == [] and part["status"] == "exit 0", fw
        assert part["checks"]["attention"]["passed"], (fw, part["checks"])
        assert "fused" in part["kernels"] and len(part["kernels"]) >= 2, fw     # the fused kernel and a reference
        assert all(r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 for r in part["kernels"].values())
        (step,) = part["steps"].values()
        assert step["gate"]["passed"] and step["tokens_per_s"] > 0, fw
    torch_part = out["parts"]["torch"]
    assert torch_part["steps"]["attention+mlp+bf16res"]["residual"] == "bf16"
    assert {"ffn_inductor+cublas", "ffn_fused"} <= set(torch_part["kernels"])
    assert torch_part["mlp_configs"]["default"]["matches_reference"]
    table = proc.stdout[proc.stdout.rindex("part "):]
    assert "step attention+mlp+bf16res" in table and "check attention" in table and "FAILED" not in table


def test_bad_configs_are_refused(tmp_path):
    proc = _run(tmp_path, "--smoke", "--jax-configs", "flash", timeout=120)
    assert proc.returncode == 2 and "valid choices" in proc.stderr
