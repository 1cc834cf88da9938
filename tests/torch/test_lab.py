"""The whole smoke ladder (conftest.py: the one the book build ran, or one run in-process),
checked rung by rung: the seed rungs here, the beyond rungs in tests/torch/test_beyond.py."""
from __future__ import annotations

import json

import pytest
import torch

from perfladder.config import expected_num_params, get_config
from perfladder.hardware import peak_for
from perfladder.ladder.engine import check_rungs
from perfladder.measure.evidence import PEAK_RESERVED, Compile, ProfileSummary, Receipt
from perfladder.measure.gates import MIRROR_ATOL
from perfladder.measure.learning import LearningCheck
from perfladder.measure.verdict import REGIMES, VERDICTS
from perfladder.results.record import LadderResult, RungResult
from perfladder.results.schema import validate
from perfladder.torch import RUNGS, Ladder, TorchLab, run_ladder
from perfladder.torch.timer import loaded

CFG = get_config("smoke")
ON_GPU = torch.cuda.is_available()
SEED = ["R0", "R1", "R2", "R3c", "R3", "R4"]
BEYOND = ["B1", "B2", "B3", "B4", "B5", "B6", "B7"]
FUSED = ["B8", "B9", "B10"]               # Triton kernels: GPU rungs
KERNELS = ["B12", "B13"]                  # bigger Triton kernels: GPU rungs, after the optional B11
LATE = KERNELS + ["B14", "B15"]           # B14: the bf16 residual stream (any device); B15: cuBLASLt's
LATEST = ["B16", "B17", "B18"]            # CUDA graphs on the fused step; autotuned cuBLASLt GEMMs
MULTI = ["R5", "R5x", "R5f"]
COMPILED = ["R1", "R2", "R3", "R4"] + ["B1", "B2", "B3", "B4", "B5", "B6", "B7", "B14"]
BF16 = ["R2", "R3", "R4"] + BEYOND + FUSED + LATE + LATEST


@pytest.fixture(scope="module")
def ladder_run(torch_smoke_ladder):
    return torch_smoke_ladder          # conftest.py: one smoke ladder per session


@pytest.fixture(scope="module")
def small_run():
    """A real ladder of a few rungs -- named out of ladder order, one of each stage -- with its
    ``progress`` events, still in memory: ``(LadderResult, events)``. Its learning check is
    short (its verdict is test_learning_check's, on the whole ladder); here only its event
    and its record matter."""
    events = []
    res = run_ladder(CFG.replace(learn_steps=40), rungs=["R5", "B1", "R3c", "R0"],
                     progress=lambda *e: events.append(e), command="pytest")
    return res, events


def measured(res):
    return [r for r in res.rungs if r.measured]


# -- the declarations ------------------------------------------------------------------------------
def test_rung_declarations():
    assert list(RUNGS) == SEED + BEYOND + FUSED + ["B11"] + LATE + LATEST + MULTI
    assert [n for n, r in RUNGS.items() if r.optional] == ["B11"]
    for name, r in RUNGS.items():
        assert r.name == name and r.key and r.label and r.section and r.gate, name
    keys = [r.key for r in RUNGS.values()]
    assert len(set(keys)) == len(keys)
    assert {RUNGS[n].key for n in ("R0", "R1", "R2", "R3", "R4")} == {
        "eager", "compile", "bf16", "batch_up", "checkpoint"}
    assert RUNGS["R3c"].kind == "control" and RUNGS["R3c"].builds_on == "R1"   # R3 without bf16
    assert [RUNGS[n].builds_on for n in ("R1", "R2", "R3", "R4")] == ["R0", "R1", "R2", "R3"]
    assert all(RUNGS[n].stage == "beyond" for n in BEYOND + FUSED + ["B11"] + LATE + LATEST)
    assert {n for n, r in RUNGS.items() if r.alternative} == {"B2", "B7", "B15", "B17", "B18"}
    assert {n for n, r in RUNGS.items() if r.needs_gpu} == {"B3", *FUSED, "B11", *KERNELS, "B15", *LATEST}
    assert {RUNGS[n].key for n in FUSED} == {"fused_rope", "fused_gelu", "fused_addnorm"}
    assert [RUNGS[n].key for n in LATE] == ["fused_attention", "fused_mlp", "bf16_residual",
                                            "cublaslt_epilogues"]
    assert [RUNGS[n].key for n in LATEST] == ["fused_cuda_graphs", "tuned_gemms", "gemm_bias_grads"]


# -- the run ---------------------------------------------------------------------------------------------
def test_rungs_in_order_and_progress_events(ladder_run, small_run):
    default = check_rungs(RUNGS)
    assert default == SEED + BEYOND + FUSED + LATE + LATEST + MULTI  # B11 only when named
    assert [r.name for r in ladder_run.result.rungs] == default
    result, events = small_run
    names = ["R0", "R3c", "B1", "R5", "learning"]                    # ladder order, not the caller's
    assert [r.name for r in result.rungs] == names[:-1]
    assert [(e[0], e[1]) for e in events] == [(k, n) for n in names for k in ("start", "end")]
    assert all(e[2] is None for e in events if e[0] == "start")
    assert events[1][2] is result.rung("R0")
    assert [e[2] for e in events if e[0] == "end"][:-1] == result.rungs
    assert isinstance(events[-1][2], LearningCheck) and events[-1][2] is result.learning
    assert result.rung("B1").kernels is not None                    # the kernel report ran, unannounced


def test_result_header(ladder_run):
    result = ladder_run.result
    assert result.framework == "torch" and result.baseline == "R0"
    assert result.config["name"] == "smoke" and result.command == ladder_run.command
    assert result.versions["torch"] == torch.__version__
    assert (result.peak_tflops is None) == (peak_for(result.device) is None)
    assert result.device == (torch.cuda.get_device_name(0) if ON_GPU else "cpu")
    assert (result.roofs is None) == (not ON_GPU)


def test_every_rung_carries_its_declaration(ladder_run):
    for r in ladder_run.result.rungs:
        d = RUNGS[r.name]
        assert (r.key, r.stage, r.section) == (d.key, d.stage, d.section), r.name
        assert r.label, r.name


@pytest.mark.parametrize("name", SEED)
def test_measured_seed_rung_is_well_formed(ladder_run, name):
    res = ladder_run.result
    r = res.rung(name)
    t = r.timing
    assert r.tokens_per_s > 0 and t.settled == CFG.windows and len(t.windows) >= CFG.windows
    assert len(t.windows) <= CFG.max_windows
    assert sorted(t.settled_windows)[1] == pytest.approx(r.tokens_per_s)     # the median settled window
    assert r.windows == t.windows and r.spread == pytest.approx(
        (max(t.settled_windows) - min(t.settled_windows)) / r.tokens_per_s)
    assert isinstance(r.stable, bool) and t.target_spread == CFG.target_spread
    assert t.steps_per_window == CFG.timed and t.warmup == CFG.warmup and t.step_time_s > 0
    assert r.seq_len == CFG.num_steps and t.batch_shape == [r.batch_size, CFG.num_steps]
    assert r.batch_size == (CFG.batch_size if name in ("R0", "R1", "R2") else CFG.big_batch)
    assert r.batch_size == r.recipe["batch_size"]
    assert r.precision == ("bf16" if name in BF16 else ("tf32" if ON_GPU else "fp32"))
    g = CFG.gpt()
    six_n_12ltd = 6 * expected_num_params(g) + 12 * g.num_blks * CFG.num_steps * g.num_hiddens
    assert r.tflops * 1e12 / r.tokens_per_s == pytest.approx(six_n_12ltd)
    assert r.ratio_base == pytest.approx(r.tokens_per_s / res.rung("R0").tokens_per_s)
    if ON_GPU:
        assert r.memory.bytes > 0 and r.memory.kind == PEAK_RESERVED and r.memory.allocated > 0
    else:
        assert r.mfu is None and r.memory.bytes is None and r.memory.kind == "n/a"


def test_every_measured_rung_carries_its_evidence(ladder_run):
    """stable, a verdict against the rung it builds on (not the baseline), a regime, and a
    profile for every compiled rung."""
    res = ladder_run.result
    for r in measured(res):
        assert isinstance(r.stable, bool), r.name
        assert r.regime["regime"] in REGIMES and r.regime["why"], r.name
        if r.name == "R0":
            assert r.verdict is None and r.builds_on is None
        else:
            assert r.verdict["verdict"] in VERDICTS and r.verdict["against"] == r.builds_on, r.name
            assert r.verdict["ratio"] == pytest.approx(r.ratio_prev), r.name
        if r.name in COMPILED + ["R0"]:
            assert isinstance(r.profile, ProfileSummary), r.name
            assert r.profile.steps >= 1 and r.profile.device_ms > 0 and r.profile.rows, r.name
            assert sum(r.profile.shares.values()) == pytest.approx(1.0), r.name
            assert r.regime["regime"] != "not profiled", r.name
    assert res.rung("R3c").profile is None and res.rung("R3c").regime["regime"] == "not profiled"


def test_every_bf16_rung_has_a_receipt_from_the_timed_call(ladder_run):
    """The receipt reads the timed call's dtypes and the step's arithmetic: every matmul and
    attention kernel in the rung's precision (the one-hot lookup's 2 fp32 matmuls by design),
    the loss op in fp32."""
    res = ladder_run.result
    for r in measured(res):
        if r.kind == "multi-gpu":
            continue
        want = "bfloat16" if r.name in BF16 else "float32"
        assert isinstance(r.receipt, Receipt), r.name
        assert r.receipt.where.startswith("TrainStep.forward_backward"), r.name
        assert r.receipt.claimed == ("bf16" if r.name in BF16 else r.precision), r.name
        assert r.receipt.observed == {"logits": want, "matmul_operands": want,
                                      "attention_operands": want} and r.receipt.ok, r.name
        arith = r.details["arithmetic"]
        fp32_lookups = 2 if want == "bfloat16" and r.recipe["embed"] == "onehot" else 0
        assert arith["matmul_operands"].get("float32", 0) == fp32_lookups or want == "float32", r.name
        assert set(arith["attention_operands"]) == {want} and set(arith["loss_ops"]) == {"float32"}


def test_ratio_prev_follows_builds_on(ladder_run):
    res = ladder_run.result
    t = {r.name: r.tokens_per_s for r in measured(res)}
    assert res.rung("R0").ratio_prev is None
    for name, prev in (("R1", "R0"), ("R2", "R1"), ("R3c", "R1"), ("R3", "R2"), ("R4", "R3")):
        assert res.rung(name).builds_on == prev
        assert res.rung(name).ratio_prev == pytest.approx(t[name] / t[prev])
    assert res.rung("R3c").kind == "control"
    assert [r.name for r in res.waterfall()][:5] == ["R0", "R1", "R2", "R3", "R4"]
    assert "R3c" not in [r.name for r in res.waterfall()]


def test_seed_recipes(ladder_run):
    res = ladder_run.result
    rec = {n: res.rung(n).recipe for n in SEED}
    assert not rec["R0"]["compiled"] and not rec["R0"]["bf16"] and rec["R0"]["batch_size"] == CFG.batch_size
    assert rec["R1"] == {**rec["R0"], "compiled": True}
    assert rec["R2"] == {**rec["R1"], "bf16": True}
    assert rec["R3c"] == {**rec["R1"], "batch_size": CFG.big_batch}       # R3 without bf16
    assert rec["R3c"] == {**rec["R3"], "bf16": False}
    assert rec["R3"] == {**rec["R2"], "batch_size": CFG.big_batch}
    assert rec["R4"] == {**rec["R3"], "checkpoint": True}


def test_r0_is_profiled_before_it_is_timed(ladder_run):
    r0 = ladder_run.result.rung("R0")
    names = [row["name"] for row in r0.profile.rows]
    assert ("CUDA kernels" if ON_GPU else "CPU operators") in r0.profile.tool
    if not ON_GPU:
        assert any(n.startswith("aten::") for n in names)
    assert isinstance(r0.compile, Compile) and r0.compile.first_call_s > 0


def test_r1_compile_time_gate_and_its_own_profile(ladder_run):
    res = ladder_run.result
    r1 = res.rung("R1")
    # the compile is timed where it is paid (the step times its own first forward and backward,
    # whoever makes it): every compiled rung records it, and R0, eager, compiles nothing (how long
    # a compile takes depends on the compile cache, so no factor is asserted)
    assert res.rung("R0").compile.compilations == 0 and res.rung("R0").compile.first_call_s > 0
    for name in ("R1", "R2", "R3", "R4"):
        c = res.rung(name).compile
        assert c.first_call_s > 0 and isinstance(c.compilations, int), name
        # what the compiler's caches did for its graphs: each loaded (hit) or compiled (miss)
        caches = res.rung(name).details["compile_cache"]
        assert caches.get("fxgraph_cache_hit", 0) + caches.get("fxgraph_cache_miss", 0) >= 2, name
        assert caches.get("fxgraph_cache_hit", 0) + caches.get("autograd_cache_hit", 0) == c.cache_hits
    assert "compile_cache" not in res.rung("R0").details                  # eager: no compiler
    g = r1.gate("compiled vs eager logits")
    assert g.passed and 0 <= g.values["max_abs_diff"] < g.tolerances["atol"] == 1e-2
    names = [row["name"] for row in r1.profile.rows]
    if not ON_GPU:     # on CPU the compiled graphs show up among the top self-time rows
        assert any("Compiled" in n for n in names)
    assert names != [row["name"] for row in res.rung("R0").profile.rows]


def test_a_compiled_rung_records_the_compile_it_paid():
    """R1's first call compiles (dynamo and inductor count it, cache hits included) and is
    timed by the step itself -- in a ladder run after another in the same process too (a
    notebook cell run again, or any test before this one): dynamo's code of the first ladder
    must not serve the second, which would record no compile and no cache events."""
    for _ in range(2):
        res = run_ladder(CFG, rungs=["R1"], learn=False)
        c = res.rung("R1").compile
        assert c.compilations >= 1 and c.first_call_s > 0
        assert loaded(res.rung("R1").details["compile_cache"]) == c.cache_hits


def test_r4_mirror_gate_recorded(ladder_run):
    r4 = ladder_run.result.rung("R4")
    g = r4.gate("checkpointed mirror")
    assert g.passed and g.values["max_abs_diff"] <= MIRROR_ATOL == g.tolerances["atol"]
    assert r4.recipe["checkpoint"] and r4.verdict["against"] == "R3"
    saved = r4.gate("checkpoint gate")        # and it dropped activations: fewer bytes saved
    assert saved.passed and saved.values["saved_ratio"] <= saved.tolerances["saved_ratio"] < 1


def test_data_parallel_rungs(ladder_run):
    res = ladder_run.result
    r5, r5x, r5f = res.rung("R5"), res.rung("R5x"), res.rung("R5f")
    assert [r.name for r in res.rungs][-3:] == MULTI
    assert r5.builds_on == "R0" and r5.recipe == res.rung("R0").recipe
    fastest = res.learning.configuration
    assert r5x.builds_on == fastest and r5x.recipe == res.rung(fastest).recipe
    assert r5f.builds_on == fastest and r5f.recipe == r5x.recipe
    for r in (r5, r5x, r5f):
        assert r.prediction is not None and [p["k"] for p in r.prediction.points] == [2, 4, 8]
        assert r.prediction.assumptions["single_gpu_source"] in (r.builds_on, "measured for this rung (one rank)")
        if torch.cuda.device_count() >= 2:
            assert r.kind == "multi-gpu" and r.tokens_per_s > 0
            assert r.prediction.measured_tokens_per_s == r.tokens_per_s
        else:
            assert r.kind == "skipped" and r.tokens_per_s is None
            assert "needs at least 2" in r.error and "not measured" in r.error


def test_learning_check(ladder_run):
    res = ladder_run.result
    lc = res.learning
    assert lc is not None and lc.passed and lc.steps == CFG.learn_steps == len(lc.losses)
    assert lc.last < lc.first and lc.val_after < lc.threshold < lc.val_before
    assert "plain eager fp32" in lc.evaluated_with and "trained weights" in lc.evaluated_with
    kept = [r.name for r in res.rungs if r.stage == "beyond" and r.kept]
    assert lc.configuration == kept[-1]
    assert set(lc.phases) == {"data", "build", "val before", "train", "val after"}
    assert sum(lc.phases.values()) <= lc.seconds and lc.phases["train"] > 0
    n = CFG.learn_num_train                              # held out: the windows after training's
    assert lc.rows == {"train": [0, n], "val": [n, n + CFG.num_val]}


def test_json_round_trip(ladder_run, small_run, tmp_path):
    """The whole ladder, and a run straight from memory (kernel report included), come back from
    their JSON as they went in."""
    full, small = ladder_run.result, small_run[0]
    for res, name in ((full, "torch.json"), (small, "small.json")):
        path = res.write(tmp_path / name)
        data = json.loads(path.read_text())
        validate(data)
        back = LadderResult.read(path)
        assert back.to_dict() == res.to_dict()
        assert back.learning == res.learning and back.rung("R0").profile == res.rung("R0").profile
    assert back.rung("B1").kernels == small.rung("B1").kernels and back.rung("B1").receipt.ok
    back = LadderResult.read(tmp_path / "torch.json")
    assert back.learning.passed and back.rung("R2").receipt.ok


# -- small runs of their own ---------------------------------------------------------------------------------
def test_unknown_rung_lists_valid_names(monkeypatch):
    import perfladder.torch as pt
    monkeypatch.setattr(pt, "TorchLab", lambda *a, **kw: pytest.fail("built a lab for a typo"))
    with pytest.raises(ValueError) as e:
        run_ladder(CFG, rungs=["R0", "R9"], learn=False)
    assert "'R9'" in str(e.value) and str(e.value).endswith(", ".join(RUNGS))


def test_a_smoke_lab_on_cpu_drops_to_one_intra_op_thread_and_says_so(monkeypatch):
    """Tiny smoke ops on CPU: thread synchronisation would cost more than it saves. (The suite
    runs every process with one OpenMP thread, tests/conftest.py: the several are planted.)"""
    threads = [4]
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    note = "smoke config on CPU: torch.set_num_threads(1)"
    assert note in TorchLab(CFG, device="cpu").result.notes and threads == [1]
    assert note not in TorchLab(CFG, device="cpu").result.notes           # one already: nothing to say
    threads[0] = 4
    assert note not in TorchLab(get_config("full"), device="cpu").result.notes and threads == [4]


def test_ladder_rejects_bad_inputs():
    with pytest.raises(TypeError, match="LadderConfig"):
        Ladder("smoke")
    with pytest.raises(ValueError, match="device='mps' is not supported; valid choices: 'cuda', 'cpu'"):
        Ladder(CFG, device="mps")


def test_single_rung_runs_alone():
    res = run_ladder(CFG, rungs=["R3c"], learn=False)
    r = res.rung("R3c")
    assert [x.name for x in res.rungs] == ["R3c"] and r.ratio_base is None and r.ratio_prev is None
    assert r.builds_on == "R1" and r.recipe["batch_size"] == CFG.big_batch and r.verdict is None
    assert res.learning is None
    validate(res.to_dict())


def test_a_rung_that_raises_is_a_skipped_entry(monkeypatch):
    """A rung whose function raises (a gate, a kernel, memory) is a loud 'skipped' entry."""
    import perfladder.torch.lab as lab_module

    def broken(self, step, batch_size):
        raise RuntimeError("profiler exploded (planted)")
    monkeypatch.setattr(lab_module.TorchLab, "profile", broken)
    res = run_ladder(CFG, rungs=["R0", "R3c"], learn=False)
    r0 = res.rung("R0")
    assert r0.kind == "skipped" and r0.error == "RuntimeError: profiler exploded (planted)"
    assert "broken" in r0.details["traceback"] and r0.key == "eager"
    assert res.rung("R3c").measured                        # not profiled: it ran
    assert isinstance(res.rung("R3c"), RungResult) and res.rung("R3c").ratio_base is None


def test_each_gate_records_its_seconds_inside_the_gates_phase(ladder_run):
    """Where a rung's gate time goes: every gate has its own clock, inside the ``gates`` one."""
    from _ladders import gate_clocks
    assert {"gates/model", "gates/optimizer", "gates/loss steps"} <= gate_clocks(ladder_run.result)


def test_memory_is_the_peak_the_allocator_reserved_cuda_graph_pools_included(monkeypatch):
    """A CUDA-graph step (B3) replays into its graph's private pool without the allocator
    seeing a tensor: ``max_memory_allocated`` after a reset is blind to it. The rung records
    the peak *reserved* (every segment held, graph pools included) and names it so, with the
    tensors' own peak beside it."""
    import perfladder.torch.lab as lab_module
    lab = TorchLab(CFG, probe=False)
    lab.on_gpu = True                                          # the GPU branch, on a CPU
    cuda = {"empty_cache": lambda: None, "reset_peak_memory_stats": lambda: None,
            "max_memory_reserved": lambda: 7 << 30, "max_memory_allocated": lambda: 1 << 30}
    for name, fn in cuda.items():
        monkeypatch.setattr(torch.cuda, name, fn)
    monkeypatch.setattr(lab_module, "measure_settled", lambda once, budget_s: ("timed", False))
    mem = lab.measure(None, CFG.batch_size).memory
    assert mem.bytes == 7 << 30 and mem.kind == PEAK_RESERVED and mem.allocated == 1 << 30
    assert "CUDA graph" in mem.note


def test_the_model_gates_fp32_reference_runs_in_slices_of_the_seed_batch(ladder_run):
    """A batch rung's model gate runs its fp32 reference on seed-batch slices, so that the gate
    holds no more than the rung's own step does (a whole fp32 reference at batch 1024 is what
    ran a 24 GB card out of memory at B5)."""
    res = ladder_run.result
    seed = CFG.batch_size
    seen = set()
    for r in measured(res):
        gate = next((g for g in r.gates if g.name == "model gate"), None)
        if gate is None:
            continue
        want = r.batch_size // seed if r.batch_size > seed else 1
        assert gate.detail["reference_chunks"] == want, (r.name, r.batch_size)
        seen.add(want)
    assert 1 in seen and max(seen) > 1, seen
