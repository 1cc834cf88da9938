"""benchmarks/fused_kernels.py --smoke: every part runs on CPU (interpreters) and writes its JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "fused_kernels.py"


def run(tmp_path, *args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    framework = args[args.index("--framework") + 1]
    return json.loads((tmp_path / f"{framework}_fused.json").read_text())


def test_torch_smoke(tmp_path):
    pytest.importorskip("triton")
    out = run(tmp_path, "--framework", "torch", "--configs", "none,all")
    assert out["smoke"] and out["errors"] == []
    assert set(out["kernels"]) == {"rope", "addnorm", "gelu", "attention", "ffn_epilogue"}   # GPU-only rows absent
    assert out["kernels"]["ffn_epilogue"]["backend"].startswith("stand-in")    # no cuBLASLt on CPU
    for row in out["kernels"].values():
        assert row["fused_fwd_bwd_ms"] > 0 and row["ref_fwd_bwd_ms"] > 0 and row["fused_bytes"] > 0
    assert set(out["steps"]) == {"none", "all"}
    fused = out["steps"]["all"]
    assert fused["fused"] == ["rope", "addnorm", "gelu"]
    assert fused["gate"]["passed"] and fused["gate"]["max_abs_diff_vs_unfused"] <= fused["gate"]["atol"]
    assert fused["tokens_per_s"] > 0


def test_jax_smoke_and_an_unknown_xla_flag(tmp_path):
    out = run(tmp_path, "--framework", "jax", "--xla-flags=--xla_perfladder_no_such_flag=1",
              "--attention-configs=fwd:32/16/4/1,bwd:16/32/4/1")
    assert out["errors"] == []
    assert out["kernels"]["addnorm"]["fused_fwd_bwd_ms"] > 0
    for row in ("attention", "attention_bias"):     # B8's kernels, then B12's bias on load
        attention = out["kernels"][row]
        assert attention["fused_fwd_bwd_ms"] > 0 and attention["ref_fwd_bwd_ms"] > 0, row
    swept = out["attention_configs"]     # B8's kernels, then B12's with the bias on load
    assert list(swept) == ["fwd:32/16/4/1", "bwd:16/32/4/1", "fwd:32/16/4/1+bias", "bwd:16/32/4/1+bias"]
    assert swept["fwd:32/16/4/1"]["block_n"] == 16 and swept["bwd:16/32/4/1+bias"]["inner"] == 32
    assert [r["bias"] for r in swept.values()] == [False, False, True, True]
    assert all(r["matches_default"] and r["ms"] > 0 for r in swept.values())
    assert {p: b["config"] for p, b in out["attention_best"]["by_part"].items()} == {
        "fwd": "fwd:32/16/4/1", "bwd": "bwd:16/32/4/1",
        "fwd+bias": "fwd:32/16/4/1+bias", "bwd+bias": "bwd:16/32/4/1+bias"}
    assert out["steps"]["addnorm"]["gate"]["passed"] and out["steps"]["none"]["tokens_per_s"] > 0
    flag = out["steps"]["none --xla_perfladder_no_such_flag=1"]
    assert flag["exists"] is False and "Unknown flag" in flag["error"][0]


def refused(tmp_path, framework: str, *args) -> subprocess.CompletedProcess:
    """The script run with arguments it must refuse before it measures anything."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(SCRIPT), "--framework", framework, "--smoke", "--out",
                           str(tmp_path), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_attention_sweep_is_refused_for_torch(tmp_path):
    proc = refused(tmp_path, "torch", "--attention-configs", "fwd:64/32")
    assert proc.returncode == 2 and "use it with --framework jax" in proc.stderr
    assert not (tmp_path / "torch_fused.json").exists()


def test_bad_configs_are_refused(tmp_path):
    proc = refused(tmp_path, "jax", "--configs", "rope")
    assert proc.returncode == 2 and "valid choices" in proc.stderr
    proc = refused(tmp_path, "jax", "--attention-configs", "fwd:64/64/4/2,fwd:7/7/4/2")
    assert proc.returncode == 2 and "entry 'fwd:7/7/4/2' is not valid; valid: fwd:BLOCK_M" in proc.stderr
