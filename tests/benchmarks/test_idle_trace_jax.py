"""benchmarks/idle_trace_jax.py: the gaps between kernels from their intervals (planted
timelines), the configurations it traces (a rung's chain, a results file's), its refusals, and
one smoke run on the CPU writing its JSON."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("idle_trace_jax", ROOT / "benchmarks" / "idle_trace_jax.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gaps_are_between_merged_busy_stretches_with_their_neighbours():
    idle_gaps = _module().idle_gaps
    # two streams: b overlaps a, c starts 3 us after both end, d touches c, e 150 us later
    spans = [(0, 10), (5, 12), (15, 20), (20, 30), (180, 200), None]
    names = ["a", "b", "c", "d", "e", "unknown"]
    got = idle_gaps(spans, names, steps=2, top=1)
    assert got["gaps_per_step"] == 1.0 and got["kernels_per_step"] == 2.5
    assert got["idle_ms_per_step"] == pytest.approx((3 + 150) / 2 / 1e3)
    assert got["span_ms_per_step"] == pytest.approx(200 / 2 / 1e3)
    assert got["busy_ms_per_step"] == pytest.approx((200 - 153) / 2 / 1e3)
    assert got["largest"] == [{"gap_us": 150, "at_us": 30, "before": "d", "after": "e"}]
    assert got["histogram_per_step"]["2-5 us"] == 0.5 and got["histogram_per_step"]["100-1000 us"] == 0.5
    assert sum(got["histogram_per_step"].values()) == got["gaps_per_step"]
    # a kernel inside a longer one's interval does not end the stretch
    inner = idle_gaps([(0, 100), (10, 20), (101, 102)], ["long", "short", "next"], steps=1)
    assert inner["largest"] == [{"gap_us": 1, "at_us": 100, "before": "long", "after": "next"}]
    with pytest.raises(ValueError, match="no kernel in the trace says when it ran"):
        idle_gaps([None], ["x"], steps=1)
    with pytest.raises(ValueError, match="steps >= 1"):
        idle_gaps([(0, 1)], ["x"], steps=0)


def test_configurations_from_the_chain_and_from_a_results_file(tmp_path):
    from perfladder.config import get_config
    from perfladder.jax import JaxLab
    module = _module()
    lab = JaxLab(get_config("smoke"), probe=False)
    b3 = module.chain_recipe(lab, "B3")            # B1 kept, B2 an alternative
    assert b3.jit == "split" and b3.embed_fp32 and b3.embed == "gather"
    assert module.chain_recipe(lab, "R3") == lab.seed_recipe().replace(batch_size=lab.config.big_batch,
                                                                       dtype="bfloat16", jit="nnx")
    if not lab.on_gpu:                              # B4 and the Pallas rungs are skipped on CPU
        b9 = module.chain_recipe(lab, "B9")
        assert b9.attn_impl is None and b9.fused == () and b9.batch_size == 4 * lab.config.big_batch
        assert dict(b9.xla_options) == {"xla_gpu_enable_cublaslt": True}
    with pytest.raises(ValueError, match="no rung 'B99'; valid choices: .*B11"):
        module.chain_recipe(lab, "B99")
    results = tmp_path / "jax.json"
    results.write_text(json.dumps({"fastest": "B3", "rungs": [{"name": "B3", "recipe": b3.to_dict()},
                                                              {"name": "R5", "recipe": None}]}))
    assert module.file_recipe(lab, results, "fastest") == ("B3", b3)
    with pytest.raises(ValueError, match="rung 'B8' ran no recipe in .*; valid choices: fastest, B3"):
        module.file_recipe(lab, results, "B8")


@pytest.mark.parametrize("argv,says", [
    (["--rungs", "fastest"], "--rungs fastest needs --from"),
    (["--from", "no/such.json", "--rungs", "B3"], "--from no/such.json: no such file"),
    (["--rungs", "B3", "--steps", "0"], "--steps=0 must be"),
    (["--rungs", "B3", "--config", "huge"], "--config 'huge' is not valid; valid choices: full, smoke"),
    (["--rungs", "B99", "--config", "smoke"], "no rung 'B99'"),
])
def test_bad_arguments_are_one_line_and_write_nothing(argv, says, tmp_path, capsys):
    out = tmp_path / "idle.json"
    with pytest.raises(SystemExit) as e:
        _module().main([*argv, "--out", str(out)])
    assert e.value.code == 2 and says in capsys.readouterr().err and not out.exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="the CPU smoke run")
def test_smoke_run_writes_each_configurations_gaps(tmp_path):
    from perfladder.jax.compiler import fast_cpu_compiles
    fast_cpu_compiles()
    out = tmp_path / "idle.json"
    out.write_text("old")
    assert _module().main(["--config", "smoke", "--rungs", "B3", "--steps", "2", "--timed", "3",
                           "--top", "3", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    entry = data["configurations"]["B3"]
    assert entry["recipe"]["jit"] == "split" and data["steps"] == 2
    assert entry["recipe"]["xla_options"] == {"xla_enable_command_buffers_during_profiling": True}
    idle = entry["idle"]
    assert idle["kernels_per_step"] > 0 and 0 < len(idle["largest"]) <= 3
    assert idle["idle_ms_per_step"] + idle["busy_ms_per_step"] == pytest.approx(idle["span_ms_per_step"])
    assert entry["per_step"]["n"] == 3 and entry["host_overhead"]["dispatch_ms_per_step"] > 0


def test_a_configuration_that_fails_is_recorded_and_the_others_traced(tmp_path, monkeypatch, capsys):
    module = _module()

    def trace(lab, recipe, *args):
        if recipe.jit == "split":
            raise RuntimeError("INVALID_ARGUMENT: planted compile failure\nsecond line")
        return {"recipe": recipe.to_dict(), "idle": {"kernels_per_step": 1, "gaps_per_step": 0,
                                                     "idle_ms_per_step": 0.0, "span_ms_per_step": 1.0}}
    monkeypatch.setattr(module, "trace", trace)
    out = tmp_path / "idle.json"
    assert module.main(["--config", "smoke", "--rungs", "B3,R3", "--out", str(out)]) == 1
    got = json.loads(out.read_text())["configurations"]
    assert got["B3"]["error"] == "RuntimeError: INVALID_ARGUMENT: planted compile failure"
    assert got["R3"]["idle"]["kernels_per_step"] == 1
    assert "failed: B3" in capsys.readouterr().err
