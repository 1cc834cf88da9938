"""perfladder.ladder.fit and .support through the real engine, on a fake lab whose rungs record
the memory a linear model gives them (no torch, no jax): the prediction before each rung, the
records of rungs that do not fit or are not supported, what later rungs build on, and the
line a page shows."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from perfladder.config import get_config
from perfladder.ladder.engine import Rung, registry, run_ladder
from perfladder.ladder.fit import (
    GIB,
    HEADROOM,
    MEMORY_CAP_VARIABLE,
    Point,
    basis_for,
    check_cap_gib,
    check_fit,
    estimate,
    fits,
    memory_cap_gib,
    predict,
)
from perfladder.ladder.rung import DoesNotFit, Evidence, NotApplicable, NotSupported
from perfladder.ladder.support import Kernels, check_card
from perfladder.measure.evidence import Memory, Timing
from perfladder.pages.cards import card_rows, result_line
from perfladder.results.record import LadderResult

SMOKE = get_config("smoke")
MIB = 2 ** 20
FIXED = 1 * GIB                 # what the fake step holds whatever the batch
PER_SEQ = 64 * MIB              # activations per sequence ...
PER_SEQ_CKPT = 16 * MIB         # ... and with checkpointing


@dataclass(frozen=True)
class Recipe:
    batch_size: int = 8
    bf16: bool = False
    checkpoint: bool = False
    tricks: tuple = ()
    fused: bool = False

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return {**dataclasses.asdict(self), "tricks": list(self.tricks)}

    @classmethod
    def from_dict(cls, d):
        return cls(**{**d, "tricks": tuple(d["tricks"])})


def device_bytes(recipe: Recipe) -> int:
    return FIXED + (PER_SEQ_CKPT if recipe.checkpoint else PER_SEQ) * recipe.batch_size


class FitLab:
    """A lab whose card is emulated: ``cap_gib`` of memory, compute ``capability``."""
    framework, baseline, seed_top = "torch", "R0", "R3"

    def __init__(self, cap_gib=None, capability=None, on_gpu=False):
        self.config, self.on_gpu, self.device_name = SMOKE, on_gpu, "emulated card"
        self.cap_gib, self.capability = cap_gib, capability
        self.result = LadderResult(framework="torch", device=self.device_name,
                                   config=SMOKE.to_dict(), baseline="R0")
        self.ran = []

    def admit(self, rung, given):
        recipe = given.recipe
        check_card(self.device_name, self.capability, self.precision(recipe),
                   [Kernels("fused kernels", (8, 0))] if recipe.fused else [])
        cap = None if self.cap_gib is None else int(self.cap_gib * GIB)
        check_fit(rung.name, recipe.to_dict(), self.result.rungs, fixed_bytes=FIXED,
                  available_bytes=cap, cap_bytes=cap, must_match=("bf16", "checkpoint"),
                  base=given.base_name, builds_on=given.base_name if rung.stage == "beyond" else None)

    def seed_recipe(self):
        return Recipe()

    def recipe_from_dict(self, d):
        return Recipe.from_dict(d)

    def use(self, **code):
        pass

    def precision(self, recipe):
        return "bf16" if recipe.bf16 else "fp32"

    def flops_per_token(self, seq_len):
        return 1000

    def free(self):
        pass


def measured(lab, given):
    lab.ran.append(given.rung.name)
    r = given.recipe
    t = Timing(windows=[1000.0 * (len(lab.ran))] * 3, seconds=[1.0] * 3, settled=3, stable=True,
               target_spread=0.03, steps_per_window=10, warmup=5, batch_shape=[r.batch_size, 16])
    return Evidence(timing=t, memory=Memory(device_bytes(r), "measured peak"))


def trick(name):
    return lambda r, c: r.replace(tricks=(*r.tricks, name))


def batch(n):
    return lambda r, c: r.replace(batch_size=n)


RUNGS = registry([
    Rung("R0", "eager", "eager", measured),
    Rung("R1", "compile", "compile", measured, builds_on="R0", change=trick("compile")),
    Rung("R2", "bf16", "+bf16", measured, builds_on="R1", change=lambda r, c: r.replace(bf16=True)),
    Rung("R3", "batch_up", "+batch", measured, builds_on="R2", change=batch(64)),
    Rung("R4", "checkpoint", "+checkpoint", measured, builds_on="R3",
         change=lambda r, c: r.replace(checkpoint=True)),
    Rung("B1", "fused_adamw", "+fused AdamW", measured, stage="beyond", change=trick("adamw")),
    Rung("B5", "batch_x2", "batch x2", measured, stage="beyond", change=batch(128)),
    Rung("B6", "batch_x4", "batch x4", measured, stage="beyond", change=batch(256)),
    Rung("B8", "fused_rope", "+fused RoPE", measured, stage="beyond",
         change=lambda r, c: r.replace(fused=True)),
    Rung("B14", "bf16_residual", "+bf16 residual", measured, stage="beyond", change=trick("residual")),
])


def run(lab):
    return run_ladder(lab, RUNGS, learn=False, kernels=False)


def test_a_capped_card_stops_the_batch_doubling_at_the_largest_batch_that_fits():
    # B5 (batch 128) needs 1 + 8 GiB, B6 (256) 1 + 16 GiB: a 12 GiB card holds B5, not B6
    lab = FitLab(cap_gib=12)
    res = run(lab)
    b6 = res.rung("B6")
    assert b6.outcome == "does_not_fit" and not b6.measured and b6.final and not b6.kept
    assert "B6" not in lab.ran                              # refused before it ran
    assert b6.details["memory_needed_bytes"] == device_bytes(Recipe(batch_size=256))
    assert b6.details["memory_available_bytes"] == 12 * GIB
    assert b6.details["fit"]["needed"]["basis"] == "B5"     # the rung it builds on, measured
    assert "traceback" not in b6.details
    # later rungs build on what was really kept, at the batch that fit
    for name in ("B8", "B14"):
        r = res.rung(name)
        assert r.measured and r.batch_size == 128
    assert res.rung("B8").builds_on == "B5"
    assert [r.name for r in res.rungs if r.measured] == [n for n in RUNGS if n != "B6"]


def test_the_page_says_it_in_one_line_with_checkpointing_as_the_way_in():
    res = run(FitLab(cap_gib=12))
    b6 = res.rung("B6")
    line = result_line(res, b6)
    assert "\n" not in line and "does not fit" in line and "17.0 GiB" in line and "12.0 GiB" in line
    assert "later rungs build on B5" in line
    # the card's full entry: what it was predicted from, and what checkpointing would need
    error = dict(card_rows(res, b6))["error"]
    assert "\n" not in error and "predicted from B5" in error
    ck = device_bytes(Recipe(batch_size=256, checkpoint=True))        # 1 + 4 GiB, from R4
    assert b6.details["fit"]["checkpointed"]["bytes"] == ck
    assert b6.details["fit"]["checkpointing_fits"] is True
    assert "with activation checkpointing (as R4) about 5.0 GiB, which fits" in error


def test_without_a_cap_or_a_limit_every_rung_runs():
    lab = FitLab(cap_gib=None)
    res = run(lab)
    assert all(r.measured for r in res.rungs) and lab.ran == list(RUNGS)


def test_nothing_like_it_measured_no_prediction_the_rung_runs():
    # 4 GiB: R3 (batch 64, predicted from R2 at 8: 5 GiB) does not fit; R4 checkpoints, and no
    # checkpointed configuration has been measured: it runs (1 + 1 GiB); B1 builds on R3's
    # recipe, predicted from R2 as R3 was
    lab = FitLab(cap_gib=4)
    res = run(lab)
    assert res.rung("R3").outcome == "does_not_fit"
    assert res.rung("R3").details["fit"]["needed"]["basis"] == "R2"
    assert res.rung("R4").measured
    assert res.rung("B1").outcome == "does_not_fit"


def test_within_the_headroom_is_refused():
    need = device_bytes(Recipe(batch_size=256))
    points = [Point("B5", 128, device_bytes(Recipe(batch_size=128)), Recipe(batch_size=128).to_dict())]
    recipe = Recipe(batch_size=256).to_dict()
    assert predict("B6", recipe, [], fixed_bytes=FIXED, available_bytes=need).needed is None
    est = estimate(recipe, points, FIXED, ("checkpoint",))
    assert est.bytes == need
    assert fits(need, int(need * (1 + HEADROOM)) + 1) and not fits(need, need)


def test_the_basis_matches_precision_and_checkpointing_and_prefers_the_base():
    r = Recipe(batch_size=64, bf16=True, tricks=("a", "b"))
    pts = [Point("R1", 8, GIB, Recipe(tricks=("a", "b")).to_dict()),               # fp32
           Point("R4", 64, GIB, r.replace(checkpoint=True).to_dict()),            # checkpointed
           Point("X", 8, GIB, r.replace(batch_size=8).to_dict()),                 # batch alone
           Point("Y", 8, GIB, r.replace(batch_size=8, tricks=("a",)).to_dict())]  # one more field
    must = ("bf16", "checkpoint")
    assert basis_for(r.to_dict(), pts, must).name == "X"
    assert basis_for(r.to_dict(), pts, must, base="Y").name == "Y"
    assert basis_for(r.to_dict(), pts, must, base="R1").name == "X"      # across precisions: no
    assert basis_for(r.replace(bf16=False, checkpoint=True).to_dict(), pts, must) is None


def test_a_card_without_bf16_records_bf16_rungs_not_supported_and_runs_the_rest():
    lab = FitLab(capability=(7, 5), on_gpu=True)
    res = run(lab)
    outcomes = {r.name: r.outcome for r in res.rungs}
    assert outcomes["R0"] == outcomes["R1"] == "measured"
    bf16 = [n for n in RUNGS if n not in ("R0", "R1")]
    assert all(outcomes[n] == "not_supported" for n in bf16) and lab.ran == ["R0", "R1"]
    r2 = res.rung("R2")
    assert "compute capability 7.5" in r2.error and "no emulated bf16 number" in r2.error
    assert r2.details["capability"] == "7.5"


def test_kernels_the_card_cannot_run_are_not_applicable():
    res = run(FitLab(capability=(8, 0), on_gpu=True))
    assert res.rung("B8").measured
    with pytest.raises(NotApplicable, match=r"compute capability 7\.0\): fused kernels compile for "
                                            r"compute capability 8\.0"):
        check_card("card", (7, 0), "fp32", [Kernels("fused kernels", (8, 0))])
    with pytest.raises(NotApplicable, match="need triton, which is not installed"):
        check_card("card", (9, 0), "bf16", [Kernels("our kernels", (8, 0), "triton", False)])
    with pytest.raises(NotSupported):        # precision first: a bf16 kernel on a bf16-less card
        check_card("card", (7, 0), "bf16", [Kernels("fused kernels", (8, 0))])
    check_card("cpu", None, "bf16", [Kernels("fused kernels", (8, 0), "triton", False)])   # no GPU


def test_exceptions_carry_their_outcomes():
    assert (DoesNotFit.outcome, NotSupported.outcome, NotApplicable.outcome) == (
        "does_not_fit", "not_supported", "not_applicable")


@pytest.mark.parametrize("value, cap", [("24", 24.0), (" 7.5 ", 7.5), ("", None)])
def test_the_cap_is_read_from_one_variable(value, cap):
    assert memory_cap_gib({MEMORY_CAP_VARIABLE: value}) == cap
    assert memory_cap_gib({}) is None


@pytest.mark.parametrize("bad", ["0", "-3", "lots", "nan", "inf"])
def test_a_bad_cap_is_one_line_naming_it(bad):
    with pytest.raises(ValueError, match=rf"\$PERFLADDER_MEMORY_CAP_GIB='{bad}' is not valid; valid: a "
                                         r"number of GiB > 0"):
        memory_cap_gib({MEMORY_CAP_VARIABLE: bad})
    with pytest.raises(ValueError, match="--memory-cap-gib"):
        check_cap_gib(True, "--memory-cap-gib")


def test_out_of_memory_errors_are_told_apart_by_name():
    from perfladder.ladder.fit import out_of_memory

    class OutOfMemoryError(RuntimeError):          # torch.OutOfMemoryError's name and base
        pass

    class XlaRuntimeError(RuntimeError):
        pass
    assert out_of_memory(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert out_of_memory(XlaRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate"))
    assert not out_of_memory(XlaRuntimeError("INTERNAL: cuDNN error"))
    assert not out_of_memory(RuntimeError("out of memory"))     # not a framework's error: not guessed


def test_the_compiled_plan_refuses_what_the_prediction_let_through():
    """JAX's own plan, read after compiling and before running: a kernel that keeps more for
    the backward than the rung it builds on is refused in one line, with the prediction that
    had let it through beside the plan."""
    from perfladder.ladder.fit import Estimate, check_plan
    basis = Point("B5", 1024, 16 * GIB, {"batch_size": 1024})
    guess = Estimate(bytes=16 * GIB, batch=1024, basis=basis, fixed_bytes=GIB, per_sequence_bytes=1.0)
    check_plan(15 * GIB, GIB, 1024, 24 * GIB, predicted=guess)           # fits: nothing raised
    check_plan(40 * GIB, GIB, 1024, None)                               # no limit known
    with pytest.raises(DoesNotFit) as e:
        check_plan(23 * GIB, GIB, 1024, 24 * GIB, cap_bytes=24 * GIB, predicted=guess)
    line = e.value.reason
    assert line.startswith("does not fit: its compiled program plans 23.0 GiB of temporaries at batch 1024")
    assert "there is 24.0 GiB (capped at 24.0 GiB)" in line and "predicted before compiling: about 16.0 GiB, from B5" in line
    assert "\n" not in line and e.value.details["memory_needed_bytes"] == 24 * GIB
    assert e.value.outcome == "does_not_fit"
