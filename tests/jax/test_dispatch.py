"""benchmarks/jax_dispatch.py: argument errors and one tiny CPU run (structure, not speed)."""
import json
import os
import subprocess
import sys

import pytest
from _scripts import BENCHMARKS, load_script

SCRIPT = BENCHMARKS / "jax_dispatch.py"


def _module():
    return load_script("jax_dispatch")


def test_cases_parse_and_bad_cases_are_clear_errors():
    mod = _module()
    assert mod.parse_cases("fp32:64, bf16:512") == [("fp32", 64), ("bf16", 512)]
    with pytest.raises(ValueError, match=r"'fp16'.*\('fp32', 'bf16'\)"):
        mod.parse_cases("fp16:64")
    with pytest.raises(ValueError, match="positive integer"):
        mod.parse_cases("fp32:0")
    with pytest.raises(ValueError, match="empty"):
        mod.parse_cases(" , ")


def test_smoke_run_measures_both_ways_of_calling_the_step(tmp_path):
    out = tmp_path / "d.json"
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1] / "src")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--config", "smoke", "--cases", "fp32:4",
                           "--n", "3", "--out", str(out)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["config"] == "smoke" and data["n_issued"] == 3 and "jax" in data["versions"]
    (case,) = data["cases"]
    assert (case["dtype"], case["batch"]) == ("fp32", 4)
    for way in ("nnx.jit", "split"):
        x = case[way]
        assert x["tokens_per_s"] > 0 and x["n"] == 3
        assert x["dispatch_ms_per_step"] > 0 and x["synced_median_ms"] > 0
        assert case["host_bound"][way] == (x["dispatch_ms_per_step"] >= 0.8 * x["step_ms"])
    assert "fp32 b4 nnx.jit" in proc.stdout and "fp32 b4 split" in proc.stdout
