"""JaxLab's check before each rung (``admit``) on emulated cards: the smoke ladder's planned
memory against a cap set so that it stops at B6, the committed H200 run's against a 24 GiB
card, bf16 and Pallas kernels against an older card's compute capability, the cap recorded in
the results file, and JAX's preallocation off."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from _fit_replay import replay as fit_replay
from _ladders import ROOT

from perfladder.config import get_config
from perfladder.jax import RUNGS
from perfladder.jax.lab import JaxLab
from perfladder.jax.recipe import Recipe
from perfladder.ladder.fit import GIB, MEMORY_CAP_VARIABLE, predict
from perfladder.ladder.rung import DoesNotFit, Given, NotApplicable, NotSupported
from perfladder.results.record import LadderResult
from perfladder.results.schema import validate

H200_RUN = ROOT / "benchmarks" / "results" / "h200-book-stage-2026-12-04" / "jax.json"


def replay(lab, run, cap_gib) -> dict:
    return fit_replay(lab, run, cap_gib, RUNGS, Recipe)


def needed(lab, run, name) -> int:
    """What ``name`` is predicted to need from the rungs before it (0: nothing to predict from)."""
    i = [r.name for r in run.rungs].index(name)
    r = run.rungs[i]
    est = predict(name, r.recipe, run.rungs[:i], fixed_bytes=lab.fixed_bytes, held_bytes=lab.held_bytes,
                  available_bytes=None, must_match=("dtype", "checkpoint"), base=r.builds_on).needed
    return 0 if est is None else est.bytes


def test_the_smoke_ladder_on_a_card_that_holds_b5_and_not_b6(jax_smoke_ladder):
    """The smoke ladder's own planned memory (measured on this CPU), the cap set between what
    the rungs before B6 need and what B6 needs: B6 is refused, and nothing before it."""
    run = jax_smoke_ladder.result
    lab = JaxLab(get_config("smoke"), probe=False)
    names = [r.name for r in run.rungs if r.recipe and r.stage != "multi-gpu"]
    before = names[:names.index("B6")]
    most = max(needed(lab, run, n) for n in before)
    b6 = needed(lab, run, "B6")
    assert b6 > 1.2 * most            # the batch doubled twice: the smoke ladder's own numbers
    cap = (most * 1.1 + b6 / 1.1) / 2 / GIB
    got = replay(lab, run, cap)
    assert [n for n in before if got[n] is not None] == []
    assert isinstance(got["B6"], DoesNotFit)
    assert got["B6"].details["fit"]["needed"]["basis"] == "B5"
    assert "so later rungs build on B5" in got["B6"].reason


@pytest.fixture(scope="module")
def full_lab():
    return JaxLab(get_config("full"), probe=False)


def test_on_a_24_gib_card_the_h200_plan_stops_at_b6(full_lab):
    run = LadderResult.read(H200_RUN)
    got = replay(full_lab, run, 24)
    assert all(got[n] is None for n in ("R1", "R2", "R3c", "R3", "R4", "B1", "B4", "B5"))
    e = got["B6"]
    assert e.details["fit"]["needed"]["basis"] == "B5"
    planned = run.rung("B6").memory.bytes + full_lab.held_bytes
    assert e.details["memory_needed_bytes"] == pytest.approx(planned, rel=0.02)
    assert e.details["fit"]["checkpointed"]["basis"] == "R4" and e.details["fit"]["checkpointing_fits"]


def test_a_rung_that_fits_says_its_prediction_beside_its_plan(full_lab):
    """B5 admitted on a 24 GiB card: its memory record says what was predicted before it ran
    (from B4, the rung it builds on), beside the compiler's plan."""
    from perfladder.jax.lab import Plan
    run = LadderResult.read(H200_RUN)
    i = [r.name for r in run.rungs].index("B5")
    full_lab.result.rungs, full_lab.memory_cap_gib = run.rungs[:i], 24
    try:
        full_lab.admit(RUNGS["B5"], Given(rung=RUNGS["B5"], recipe=Recipe.from_dict(run.rungs[i].recipe),
                                          base_name="B4"))
    finally:
        full_lab.memory_cap_gib = None
    mem = full_lab.planned(Plan(traced_flops=1, temp_bytes=run.rung("B5").memory.bytes, text=""))
    assert "predicted before it ran: about 15.9 GiB, from B4 at batch 512" in mem.note
    assert mem.bytes == run.rung("B5").memory.bytes and mem.kind == "planned temporaries"


def test_a_card_without_bf16_or_with_old_kernels(full_lab):
    lab, seed = full_lab, full_lab.seed_recipe()
    lab.capability = (7, 0)                              # an emulated V100
    try:
        lab.admit(RUNGS["R1"], Given(rung=RUNGS["R1"], recipe=seed.replace(jit="nnx")))
        with pytest.raises(NotSupported, match=r"compute capability 7\.0\): bf16 needs bf16 tensor cores"):
            lab.admit(RUNGS["R2"], Given(rung=RUNGS["R2"], recipe=seed.replace(jit="nnx", dtype="bfloat16")))
        with pytest.raises(NotApplicable, match=r"our Pallas kernels \(addnorm\) compile for compute "
                                                r"capability 8\.0"):
            lab.admit(RUNGS["B7"], Given(rung=RUNGS["B7"],
                                         recipe=seed.replace(jit="nnx", fused=("addnorm",))))
        lab.capability = (8, 6)
        lab.admit(RUNGS["B7"], Given(rung=RUNGS["B7"],
                                     recipe=seed.replace(jit="nnx", dtype="bfloat16", fused=("addnorm",))))
    finally:
        lab.capability = None


def test_the_cap_is_recorded_in_the_results_file(monkeypatch):
    from perfladder.jax import device
    monkeypatch.setattr(device, "backend_started", lambda: True)     # this process's XLA: as it is
    monkeypatch.setenv(MEMORY_CAP_VARIABLE, "12")
    capped = JaxLab(get_config("smoke"), probe=False)
    assert capped.memory_cap_gib == 12.0
    assert any("XLA_PYTHON_CLIENT_PREALLOCATE" in n for n in capped.result.notes)
    data = json.loads(json.dumps(capped.result.to_dict()))
    validate(data)
    assert LadderResult.from_dict(data).memory_cap_gib == 12.0


@pytest.fixture
def settings(monkeypatch):
    """``memory_settings`` on an environment of the test's own, before JAX's backend starts,
    on an emulated 48 GiB card."""
    from perfladder.jax import device
    monkeypatch.setattr(device, "_SET_HERE", set())
    monkeypatch.setattr(device, "backend_started", lambda: False)
    monkeypatch.setattr(device, "gpu_total_bytes", lambda env=None: 48 * GIB)
    return device


def test_jax_does_not_preallocate_unless_the_user_says_so(settings):
    env = {}
    lines = settings.memory_settings(env)
    assert env == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"} and lines == ["XLA_PYTHON_CLIENT_PREALLOCATE=false"]
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    settings.memory_settings(env)
    assert env == {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}


def test_the_cap_becomes_jax_allocator_fraction(settings, monkeypatch):
    env = {MEMORY_CAP_VARIABLE: "12"}
    lines = settings.memory_settings(env)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2500"          # 12 of 48 GiB
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"             # taken as one pool
    assert lines[0] == "XLA_PYTHON_CLIENT_PREALLOCATE=true (the cap, taken as one pool)"
    assert "device memory capped to 12 GiB of 48.0 GiB" in lines[-1]
    env = {MEMORY_CAP_VARIABLE: "12", "XLA_CLIENT_MEM_FRACTION": "0.5"}   # the user's wins
    settings.memory_settings(env)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env
    monkeypatch.setattr(settings, "backend_started", lambda: True)      # too late: said, not hidden
    env = {MEMORY_CAP_VARIABLE: "12"}
    lines = settings.memory_settings(env)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env and "not set in JAX's allocator" in lines[-1]


def before(run: LadderResult, name: str) -> LadderResult:
    """``run`` as it stood when rung ``name`` was about to start (a file to --resume)."""
    d = run.to_dict()
    names = [r["name"] for r in d["rungs"]]
    d["rungs"] = d["rungs"][:names.index(name)]
    return LadderResult.from_dict(d)


def test_through_the_engine_b6_is_recorded_and_b5_stays_the_base(jax_smoke_ladder):
    """The real engine on the real lab, continuing the smoke ladder at B6 on a card that holds
    B5 and not B6: B6 is refused before it compiles anything, and the chain stays on B5."""
    from perfladder.ladder.engine import LadderRun
    from perfladder.pages.cards import result_line
    run = jax_smoke_ladder.result
    lab = JaxLab(get_config("smoke"), probe=False)
    b5, b6 = needed(lab, run, "B5"), needed(lab, run, "B6")
    lab.memory_cap_gib = (b5 * 1.1 + b6 / 1.1) / 2 / GIB
    ladder = LadderRun(lab, RUNGS, resume=before(run, "B6"))
    got = ladder.run("B6")
    assert (got.outcome, got.kind, got.measured, got.kept) == ("does_not_fit", "skipped", False, False)
    assert got.builds_on == "B5" and ladder.chain.fastest[0] == "B5"
    assert got.details["memory_needed_bytes"] == b6
    assert "so later rungs build on B5" in result_line(lab.result, got)


# -- on a GPU ---------------------------------------------------------------------------------
CAPPED = """
import perfladder.jax, jax
print(jax.devices()[0].memory_stats()["bytes_limit"])
"""


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="JAX's GPU allocator needs a GPU")
def test_the_cap_holds_jax_allocator():
    """A fresh process (XLA reads its settings once): the cap becomes the allocator's limit."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_CLIENT_MEM_FRACTION",
                                                             "XLA_PYTHON_CLIENT_MEM_FRACTION")}
    env[MEMORY_CAP_VARIABLE] = "2"
    out = subprocess.run([sys.executable, "-c", CAPPED], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 1.8 * GIB <= int(out.stdout.split()[-1]) <= 2.05 * GIB


def test_a_rung_whose_compiled_plan_does_not_fit_is_refused_before_it_runs():
    """Nothing before R1 to predict it from, so the prediction lets it through; its compiled
    program's plan (read after compiling, before the first call) is over the emulated card's
    memory: recorded as not fitting, in one line naming the plan, and the chain stays on R0."""
    from perfladder.ladder.engine import LadderRun
    from perfladder.pages.cards import result_line
    lab = JaxLab(get_config("smoke"), probe=False)
    lab.memory_cap_gib = 1024 / GIB                 # 1 KiB: less than any program plans
    got = LadderRun(lab, RUNGS).run("R1")
    assert (got.outcome, got.kind, got.measured) == ("does_not_fit", "skipped", False)
    assert got.error.startswith("does not fit: its compiled program plans ")
    assert got.details["fit"]["source"] == "the compiled program's plan"
    assert got.details["memory_needed_bytes"] > got.details["memory_available_bytes"]
    assert "traceback" not in got.details and "compiled program plans" in result_line(lab.result, got)


def test_the_loss_gates_reference_plans_less_memory_than_the_plain_step_it_stands_for():
    """The beyond rungs' loss reference (``reference_recipe``) recomputes its blocks: at the same
    batch its compiled plan holds less than the plain bf16 step's, so the gate never needs more
    memory than the rungs it checks (un-checkpointed, it ran a 24 GiB card out of memory at
    batch 1024 where the rungs themselves fit)."""
    from perfladder.jax.program import planned_temp_bytes
    from perfladder.jax.trial import gate_batches, reference_recipe
    lab = JaxLab(get_config("smoke"), probe=False)
    B = 2 * lab.config.big_batch
    X, Y = gate_batches(lab, B)[0]
    ref = reference_recipe(B)
    plain = ref.replace(checkpoint=False)
    assert ref.dtype == plain.dtype == "bfloat16"
    planned = {r.checkpoint: planned_temp_bytes(lab.build_step(r, plain_code=True).lower(X, Y).compile())
               for r in (ref, plain)}
    assert planned[True] < planned[False], planned        # (the smoke model: a few blocks, small)
