"""benchmarks/gemm_algorithms_torch.py --smoke: every shape and option runs on CPU (the nvmath
options on the stand-in backend) and the JSON holds what the tool promises; its refusals."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gemm_algorithms_torch.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def tool():
    spec = importlib.util.spec_from_file_location("gemm_algorithms_torch", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemms") / "torch_gemms.json"
    proc = run("--smoke", "--out", str(out), "--reps", "2", "--warmup", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_every_shape_gemm_and_option_is_recorded(smoke):
    res, _ = smoke
    t = tool()
    assert res["smoke"] and res["complete"] and res["backend"].startswith("stand-in")
    assert list(res["layers"]) == ["qkv", "attn_out", "fc1", "fc2", "lm_head"]
    assert res["not_measured"] == {"cublaslt": res["not_measured"]["cublaslt"]}   # CPU: only PyTorch's BLAS choice
    for name, layer in res["layers"].items():
        assert list(layer["gemms"]) == list(t.GEMMS)
        for g, row in layer["gemms"].items():
            assert row["flop"] == 2 * row["M"] * row["N"] * row["K"]
            assert set(row["options"]) == set(t.OPTIONS)
            for option, cell in row["options"].items():
                if option == "cublaslt":
                    assert cell == {"not_measured": res["not_measured"]["cublaslt"]}
                    continue
                assert cell["ms"] > 0 and cell["tflops"] == pytest.approx(row["flop"] / cell["ms"] / 1e9)
                assert cell["rel_err"] <= 1e-2, (name, g, option)      # the same product as torch's
        assert (layer["bias_grad"] is None) == (name == "lm_head")
    fc1 = res["layers"]["fc1"]
    assert fc1["gemms"]["fwd"]["M"] == res["tokens"] == res["batch"] * res["seq_len"]
    assert (fc1["K"], fc1["O"], fc1["per_step"]) == (32, 128, 2)          # the smoke model: D 32, 2 blocks


def test_per_step_totals_count_each_block_and_the_head_once(smoke):
    res, stdout = smoke
    want = sum(r["options"]["torch"]["ms"] * layer["per_step"]
               for layer in res["layers"].values() for r in layer["gemms"].values())
    assert res["per_step_ms"]["torch"] == pytest.approx(want)
    assert res["per_step_ms"]["cublaslt"] is None                           # a shape not measured: no total
    assert "per step ms" in stdout and "fc2 dW+db" in stdout


def test_the_bias_gradient_options(smoke):
    res, _ = smoke
    for name in ("qkv", "attn_out", "fc1", "fc2"):
        row = res["layers"][name]["bias_grad"]
        assert set(row["options"]) == {"torch", "nvmath_tuned", "nvmath_bgradb"}
        assert all(c["ms"] > 0 and c["rel_err"] <= 1e-2 for c in row["options"].values())


def test_without_nvmath_its_options_are_not_measured_saying_why():
    t = tool()
    skip = t.not_measured(True, "why: no nvmath")
    assert skip == {o: "why: no nvmath" for o in ("nvmath", "nvmath_tuned", "nvmath_bgradb")}


def test_without_cuda_it_refuses_in_one_line_and_writes_nothing(tmp_path):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "g.json"
    proc = run("--out", str(out))
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.count("\n") == 1 and "no CUDA GPU" in proc.stderr and "--smoke" in proc.stderr


@pytest.mark.parametrize("args, says", [(["--out", "g.txt"], "must end in .json"),
                                        (["--out", "g.json", "--reps", "0"], "--reps 0 is not valid")])
def test_bad_arguments_are_refused_in_one_line(tmp_path, args, says):
    args = [str(tmp_path / a) if a.startswith("g.") else a for a in args]
    proc = run("--smoke", *args)
    assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_a_shape_the_library_refuses_is_recorded_in_one_line():
    t = tool()

    def refuses():
        raise ValueError("no algorithm for this layout\n(details)")
    assert t.timed(refuses, None, 1, None) == {"not_measured": "ValueError: no algorithm for this layout"}


def test_the_algorithm_a_plan_runs_is_read_from_its_first_algorithm():
    from types import SimpleNamespace
    t = tool()
    plan = SimpleNamespace(algorithms=[SimpleNamespace(algorithm_id=31), SimpleNamespace(algorithm_id=6)])
    assert t.algorithm_of(SimpleNamespace(plans={"k": plan})) == {"algorithm": 31}
    assert t.algorithm_of(None) == {} and t.algorithm_of(SimpleNamespace(plans={})) == {}
    assert t.algorithm_of(SimpleNamespace(plans={"k": SimpleNamespace()})) == {}    # the stand-in
