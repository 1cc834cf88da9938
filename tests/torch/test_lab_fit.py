"""TorchLab's check before each rung (``admit``) on emulated cards: the memory of the committed
H200 run's measured peaks against a smaller card's (a cap), bf16 and Triton kernels against
an older card's compute capability, and the cap recorded in the results file."""
from __future__ import annotations

import json

import pytest
import torch
from _fit_replay import replay as fit_replay
from _ladders import ROOT

from perfladder.config import get_config
from perfladder.ladder.fit import MEMORY_CAP_VARIABLE
from perfladder.ladder.rung import DoesNotFit, Given, NotApplicable, NotSupported
from perfladder.results.record import LadderResult
from perfladder.results.schema import validate
from perfladder.torch import RUNGS
from perfladder.torch.device import memory_room
from perfladder.torch.lab import TorchLab
from perfladder.torch.recipe import Recipe

H200_RUN = ROOT / "benchmarks" / "results" / "h200-book-stage-2026-12-04" / "torch.json"


@pytest.fixture(scope="module")
def lab():
    return TorchLab(get_config("full"), device="cpu", probe=False)


@pytest.fixture(scope="module")
def h200():
    return LadderResult.read(H200_RUN)


def replay(lab, run, cap_gib) -> dict:
    return fit_replay(lab, run, cap_gib, RUNGS, Recipe)


def test_on_a_24_gib_card_the_measured_peaks_stop_the_ladder_at_b6(lab, h200):
    got = replay(lab, h200, 24)
    assert all(got[n] is None for n in ("R0", "R1", "R2", "R3c", "R3", "R4", "B1", "B4", "B5"))
    e = got["B6"]
    assert isinstance(e, DoesNotFit) and e.outcome == "does_not_fit"
    # predicted from B5 (batch 1024) within 2% of what B6 measured on the H200
    assert e.details["fit"]["needed"]["basis"] == "B5"
    assert e.details["memory_needed_bytes"] == pytest.approx(h200.rung("B6").memory.bytes, rel=0.02)
    assert e.details["memory_available_bytes"] == 24 * 2 ** 30
    # with checkpointing, as R4, the same batch would fit: the chapter's reason for R4
    assert e.details["fit"]["checkpointed"]["basis"] == "R4" and e.details["fit"]["checkpointing_fits"]
    assert e.reason.startswith("does not fit: needs about 31.9 GiB at batch 2048, there is 24.0 GiB")
    assert "so later rungs build on B5" in e.reason
    # B5 fit: what was predicted for it, kept for its memory record (``measure``), within 2%
    lab.memory_cap_gib = 24
    i = [r.name for r in h200.rungs].index("B5")
    lab.result.rungs = h200.rungs[:i]
    lab.admit(RUNGS["B5"], Given(rung=RUNGS["B5"], recipe=Recipe.from_dict(h200.rungs[i].recipe),
                                 base_name="B4"))
    lab.memory_cap_gib = None
    assert lab.memory_prediction.basis.name == "B4"
    assert lab.memory_prediction.bytes == pytest.approx(h200.rung("B5").memory.bytes, rel=0.02)
    assert lab.memory_prediction.note().startswith("predicted before it ran: about 16.")


def test_on_a_16_gib_card_b5_does_not_fit(lab, h200):
    got = replay(lab, h200, 16)
    assert got["R3c"] is None and got["B4"] is None
    assert isinstance(got["B5"], DoesNotFit)


def test_fixed_bytes_are_the_state_that_does_not_grow_with_the_batch(lab):
    assert lab.fixed_bytes == 16 * lab.num_params        # fp32 weights, grads, two AdamW moments


def test_a_card_without_bf16_does_not_run_bf16_rungs(lab):
    lab.capability = (7, 5)                              # an emulated T4
    try:
        seed = lab.seed_recipe()
        lab.admit(RUNGS["R1"], Given(rung=RUNGS["R1"], recipe=seed.replace(compiled=True)))
        with pytest.raises(NotSupported, match=r"compute capability 7\.5\): bf16 needs bf16 tensor cores"):
            lab.admit(RUNGS["R2"], Given(rung=RUNGS["R2"], recipe=seed.replace(compiled=True, bf16=True)))
    finally:
        lab.capability = None


def test_triton_kernels_need_triton_and_the_capability_they_compile_for(lab):
    fused = lab.seed_recipe().replace(compiled=True, bf16=True, fused=("rope",))
    triton = lab.triton
    lab.capability, lab.triton = (9, 0), False           # an H100 without Triton installed
    try:
        with pytest.raises(NotApplicable, match=r"torch.compile's GPU kernels need triton, which is "
                                                r"not installed"):
            lab.admit(RUNGS["B8"], Given(rung=RUNGS["B8"], recipe=fused))
        lab.capability, lab.triton = (7, 5), True        # a T4: our kernels are written for 8.0
        with pytest.raises(NotApplicable, match=r"our Triton kernels \(rope\) compile for compute "
                                                r"capability 8\.0"):
            lab.admit(RUNGS["B8"], Given(rung=RUNGS["B8"], recipe=fused.replace(bf16=False)))
        lab.capability = (6, 1)                          # a Pascal card: no torch.compile at all
        with pytest.raises(NotApplicable, match=r"torch.compile's GPU kernels compile for compute "
                                                r"capability 7\.0"):
            lab.admit(RUNGS["R1"], Given(rung=RUNGS["R1"], recipe=lab.seed_recipe().replace(compiled=True)))
        lab.capability = (9, 0)
        lab.admit(RUNGS["B8"], Given(rung=RUNGS["B8"], recipe=fused))
    finally:
        lab.capability, lab.triton = None, triton


def test_the_cap_is_recorded_in_the_results_file(monkeypatch):
    monkeypatch.setenv(MEMORY_CAP_VARIABLE, "12")
    capped = TorchLab(get_config("smoke"), device="cpu", probe=False)
    assert capped.memory_cap_gib == 12.0
    data = json.loads(json.dumps(capped.result.to_dict()))
    validate(data)
    assert data["memory_cap_gib"] == 12.0
    assert LadderResult.from_dict(data).memory_cap_gib == 12.0
    monkeypatch.setenv(MEMORY_CAP_VARIABLE, "twelve")
    with pytest.raises(ValueError, match=r"PERFLADDER_MEMORY_CAP_GIB='twelve' is not valid"):
        TorchLab(get_config("smoke"), device="cpu", probe=False)


def test_a_cuda_graphed_peak_is_never_a_basis(lab, h200):
    """B3's measured peak leaves out the CUDA graphs' pool: a rung on B3's configuration is
    predicted from a configuration without graphs, not from B3's 0.35 GiB."""
    i = [r.name for r in h200.rungs].index("B3")
    b3 = h200.rungs[i]
    assert b3.memory.bytes < 0.1 * h200.rung("B1").memory.bytes       # what the H200 recorded
    bigger = Recipe.from_dict(b3.recipe).replace(batch_size=2048)
    lab.result.rungs, lab.memory_cap_gib = h200.rungs[:i + 1], 24
    try:
        with pytest.raises(DoesNotFit) as e:
            lab.admit(RUNGS["B6"], Given(rung=RUNGS["B6"], recipe=bigger, base_name="B3"))
    finally:
        lab.memory_cap_gib = None
    assert e.value.details["fit"]["needed"]["basis"] != "B3"


def test_multi_gpu_rungs_are_not_held_to_this_process_memory(lab, h200):
    """R5's ranks each hold their share on their own GPU, in their own processes."""
    fastest = Recipe.from_dict(h200.rung("B14").recipe)
    lab.result.rungs, lab.memory_cap_gib = list(h200.rungs), 1
    try:
        lab.admit(RUNGS["R5x"], Given(rung=RUNGS["R5x"], recipe=fastest, base_name="B14"))
        with pytest.raises(DoesNotFit):
            lab.admit(RUNGS["B14"], Given(rung=RUNGS["B14"], recipe=fastest, base_name="B12"))
    finally:
        lab.memory_cap_gib = None


def before(run: LadderResult, name: str) -> LadderResult:
    """``run`` as it stood when rung ``name`` was about to start (a file to --resume)."""
    d = run.to_dict()
    names = [r["name"] for r in d["rungs"]]
    d["rungs"] = d["rungs"][:names.index(name)]
    return LadderResult.from_dict(d)


def test_through_the_engine_b6_is_recorded_and_b5_stays_the_base(lab, h200):
    """The real engine on the real lab, continuing the committed run at B6 on a 24 GiB card:
    B6 is refused before it builds anything, its record says why in one line, and the chain
    still builds on B5."""
    from perfladder.ladder.engine import LadderRun
    from perfladder.pages.cards import result_line
    lab.memory_cap_gib = 24
    try:
        run = LadderRun(lab, RUNGS, resume=before(h200, "B6"))
        b6 = run.run("B6")
    finally:
        lab.memory_cap_gib = None
    assert (b6.outcome, b6.kind, b6.measured, b6.kept) == ("does_not_fit", "skipped", False, False)
    assert b6.builds_on == "B5" and run.chain.fastest[0] == "B5"
    assert b6.details["memory_available_bytes"] == 24 * 2 ** 30 and "traceback" not in b6.details
    assert "does not fit: needs about 31.9 GiB at batch 2048" in result_line(lab.result, b6)


# -- on a GPU ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA allocator needs a CUDA GPU")
def test_the_cap_holds_the_cuda_allocator(monkeypatch):
    monkeypatch.setenv(MEMORY_CAP_VARIABLE, "2")
    lab = TorchLab(get_config("smoke"), probe=False)
    try:
        assert any("capped to 2 GiB" in n for n in lab.result.notes)
        assert memory_room(2 * 2 ** 30) <= 2 * 2 ** 30
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(3 * 2 ** 30, dtype=torch.uint8, device="cuda")
        torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")           # under the cap: fine
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
