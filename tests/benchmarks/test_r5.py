"""benchmarks/r5_multi_gpu.py end to end on CPU (smoke config, seed form, two stages): the
stages run in their own processes, predict before they launch, and r5.json holds it all."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "r5_multi_gpu.py"


def test_smoke_run_writes_predictions_and_measurements(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--config", "smoke", "--out", str(tmp_path),
           "--forms", "seed", "--stages", "torch,jax", "--budget", "400"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    doc = json.loads((tmp_path / "r5.json").read_text())
    assert doc["command"].endswith("--budget 400") and doc["created"] and doc["config"] == "smoke"
    assert doc["link"] == "gloo-loopback" and doc["ks"] == [2]
    assert set(doc["versions"]) == {"torch", "jax"} and "torch" in doc["versions"]["torch"]
    assert {s: v["exit"] for s, v in doc["stages"].items()} == {"torch": 0, "jax": 0}
    got = {(m["framework"], m["mechanism"], m["form"], m["k"], m["status"]) for m in doc["measurements"]}
    assert got == {("torch", "ddp", "seed", 2, "measured"), ("jax", "mesh", "seed", 2, "measured")}
    assert set(doc["baselines"]) == {"torch:seed", "jax:seed"}
    for m in doc["measurements"]:
        assert m["prediction"]["single_tokens_per_s"] == m["baseline"]["tokens_per_s"]
        if m["framework"] == "jax":                      # the mesh checked its all-reduce first
            assert any(n.startswith("all-reduce gate passed on 2 devices") for n in m["notes"])
        assert m["measured_tokens_per_s"] > 0 and m["bus_bw_measured"] > 0
    for stage in ("torch", "jax"):
        log = (tmp_path / f"r5_{stage}.log").read_text()
        assert log.index("predict k=2") < log.index("tokens/s (predicted floor")


def test_bad_forms_name_the_valid_ones(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--config", "smoke", "--out", str(tmp_path),
                           "--forms", "medium"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "valid choices: seed, fast" in proc.stderr
