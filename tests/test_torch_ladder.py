"""The whole smoke ladder, run once for the module, then checked rung by rung."""
from __future__ import annotations

import json

import pytest
import torch

from perfladder.config import expected_num_params, get_config
from perfladder.hardware import peak_for
from perfladder.results import LadderResult, validate
from perfladder.torch import DEFAULT_RUNGS, RUNGS, Ladder, run_ladder
from perfladder.torch.ladder import NOT_ON_CPU_MEM

CFG = get_config("smoke")
ON_GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def ladder_run(torch_smoke_ladder):
    return torch_smoke_ladder          # conftest.py: one smoke ladder (seed + beyond) per session


SEED = ["R0", "R1", "R2", "R3c", "R3", "R4", "R5"]


def test_rungs_in_order_and_progress_events(ladder_run):
    result, events = ladder_run
    assert list(RUNGS)[:len(SEED)] == SEED and all(n.startswith("B") for n in list(RUNGS)[len(SEED):])
    assert [r.name for r in result.rungs] == DEFAULT_RUNGS    # the beyond rungs: test_torch_beyond.py
    names = DEFAULT_RUNGS + ["learning"]
    assert [(e[0], e[1]) for e in events] == [(k, n) for n in names for k in ("start", "end")]
    assert all(e[2] is None for e in events if e[0] == "start")
    assert events[1][2] is result.rung("R0")


def test_result_header(ladder_run):
    result, _ = ladder_run
    assert result.framework == "torch" and result.baseline == "R0"
    assert result.config["name"] == "smoke" and result.command == "pytest"
    assert result.versions["torch"] == torch.__version__
    assert (result.peak_tflops is None) == (peak_for(result.device) is None)
    assert result.device == (torch.cuda.get_device_name(0) if ON_GPU else "cpu")


@pytest.mark.parametrize("name", ["R0", "R1", "R2", "R3c", "R3", "R4"])
def test_measured_rung_is_well_formed(ladder_run, name):
    r = ladder_run[0].rung(name)
    assert r.tokens_per_s > 0 and len(r.windows) == CFG.windows
    assert sorted(r.windows)[1] == pytest.approx(r.tokens_per_s)          # the median window
    assert r.spread == pytest.approx((max(r.windows) - min(r.windows)) / r.tokens_per_s)
    assert r.seq_len == CFG.num_steps
    assert r.batch_size == (CFG.batch_size if name in ("R0", "R1", "R2") else CFG.big_batch)
    bf16 = name in ("R2", "R3", "R4")
    assert r.precision == ("bf16" if bf16 else ("tf32" if ON_GPU else "fp32"))
    g = CFG.gpt()
    six_n_12ltd = 6 * expected_num_params(g) + 12 * g.num_blks * CFG.num_steps * g.num_hiddens
    assert r.tflops * 1e12 / r.tokens_per_s == pytest.approx(six_n_12ltd)
    assert r.ratio_base == pytest.approx(r.tokens_per_s / ladder_run[0].rung("R0").tokens_per_s)
    assert r.extra["step_time_s"] > 0
    if ON_GPU:
        assert r.peak_mem_bytes > 0
    else:
        assert r.mfu is None and r.peak_mem_bytes is None and NOT_ON_CPU_MEM in r.notes


def test_ratio_prev_follows_the_waterfall(ladder_run):
    res = ladder_run[0]
    t = {r.name: r.tokens_per_s for r in res.rungs if r.tokens_per_s}
    assert res.rung("R0").ratio_prev is None
    for name, prev in (("R1", "R0"), ("R2", "R1"), ("R3", "R2"), ("R4", "R3")):   # R3c skipped
        assert res.rung(name).ratio_prev == pytest.approx(t[name] / t[prev])
    assert res.rung("R3c").kind == "control" and res.rung("R3c").ratio_prev is None
    assert [r.name for r in res.waterfall()][:5] == ["R0", "R1", "R2", "R3", "R4"]


def test_r0_profile_table(ladder_run):
    r0 = ladder_run[0].rung("R0")
    table = r0.extra["profile"]
    assert "Self CPU" in table and "aten::" in table
    assert ("Self CUDA" in table) == ON_GPU
    assert any("TEARDOWN_CUPTI" in n for n in r0.notes)


def test_r1_compile_time_gate_and_reprofile(ladder_run):
    r1 = ladder_run[0].rung("R1")
    assert r1.extra["compile_s"] > 0
    assert 0 <= r1.extra["gate_max_abs_diff"] < 1e-2
    if not ON_GPU:     # on CPU the compiled regions are the top self-time rows
        assert "Compiled" in r1.extra["profile"]
    assert r1.extra["profile"] != ladder_run[0].rung("R0").extra["profile"]


def test_r2_r3_r4_bf16_receipts(ladder_run):
    res = ladder_run[0]
    assert res.rung("R2").extra["logits_dtype"] == "torch.bfloat16"
    assert res.rung("R3").extra["logits_dtype"] == "torch.bfloat16"
    assert "profile" in res.rung("R3").extra
    if not ON_GPU:
        assert any("autocast('cpu')" in n for n in res.rung("R2").notes)


def test_r4_mirror_gate_recorded(ladder_run):
    r4 = ladder_run[0].rung("R4")
    assert r4.extra["mirror_max_abs_diff"] <= 1e-6
    assert any("negative rung" in n for n in r4.notes)


def test_r5_skipped_without_two_gpus(ladder_run):
    r5 = ladder_run[0].rung("R5")
    if torch.cuda.device_count() >= 2:
        assert r5.kind == "multi-gpu" and r5.tokens_per_s > 0
        assert r5.extra["runs"][0]["floor_tokens_per_s"] > 0
    else:
        assert r5.kind == "skipped" and r5.tokens_per_s is None
        assert "at least 2 GPUs" in r5.notes[0] and "not faked" in r5.notes[0]


def test_learning_check(ladder_run):
    lc = ladder_run[0].learning
    assert lc is not None and lc.passed and lc.steps == CFG.learn_steps
    assert lc.last < lc.first and len(lc.losses) == CFG.learn_steps


def test_json_round_trip(ladder_run, tmp_path):
    res = ladder_run[0]
    path = res.write(tmp_path / "torch.json")
    data = json.loads(path.read_text())
    validate(data)
    back = LadderResult.read(path)
    assert [r.name for r in back.rungs] == [r.name for r in res.rungs]
    assert back.learning.passed


def test_unknown_rung_lists_valid_names():
    with pytest.raises(ValueError) as e:
        run_ladder(CFG, rungs=["R0", "R9"], learn=False)
    assert "'R9'" in str(e.value) and all(n in str(e.value) for n in RUNGS)


def test_ladder_rejects_bad_inputs():
    with pytest.raises(TypeError, match="LadderConfig"):
        Ladder("smoke")
    with pytest.raises(ValueError, match="'mps'"):
        Ladder(CFG, device="mps")


def test_single_rung_runs_alone():
    res = run_ladder(CFG, rungs=["R3c"], learn=False)
    assert [r.name for r in res.rungs] == ["R3c"] and res.rung("R3c").ratio_base is None
    validate(res.to_dict())
