"""A rung run again (a notebook cell run twice, ``--resume`` retrying a failure): the one rule of
``perfladder.ladder.rerun`` as the engine applies it, on a fake lab whose rates a test sets."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from conftest import timing_of

from perfladder.config import get_config
from perfladder.ladder.engine import LadderRun, Rung, registry, run_ladder
from perfladder.ladder.rung import Evidence
from perfladder.measure.learning import LearningCheck
from perfladder.results.record import LadderResult

SMOKE = get_config("smoke")
FULL = SMOKE.replace(name="full")


@dataclass(frozen=True)
class Recipe:
    tricks: tuple = ()

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)

    def to_dict(self):
        return {"tricks": list(self.tricks)}


class Lab:
    """``rate[name]``: what the rung measures (an exception: what it raises)."""
    framework, baseline, seed_top = "torch", "R0", "R2"
    on_gpu, device_name = False, "fake"

    def __init__(self, config=FULL, **rate):
        self.config, self.rate, self.calls = config, dict(rate), []
        self.code = {"compile_model": "library"}
        self.result = LadderResult(framework="torch", device="fake", config=config.to_dict(), baseline="R0")

    def seed_recipe(self):
        return Recipe()

    def recipe_from_dict(self, d):
        return Recipe(tuple(d["tricks"]))

    def use(self, **code):
        self.code.update(code)

    def precision(self, recipe):
        return "fp32"

    def flops_per_token(self, seq_len):
        return 1000

    def free(self):
        pass

    def kernel_report(self, name, recipe):
        return {"of": name}

    def learning_check(self, name, recipe, watch=None):
        return LearningCheck(steps=40, first=3.0, last=2.0, window=20)


def fn(name):
    def run(lab, given):
        lab.calls.append((name, given.base_name, given.recipe.tricks, lab.code["compile_model"]))
        rate = lab.rate.get(name, 100.0)
        if isinstance(rate, BaseException):
            raise rate
        return Evidence(timing=timing_of([rate] * 3), recipe=given.recipe)
    return run


def add(trick):
    return lambda r, c: r.replace(tricks=r.tricks + (trick,))


RUNGS = registry([
    Rung("R0", "eager", "eager", fn("R0")),
    Rung("R1", "compile", "compile", fn("R1"), builds_on="R0", change=add("compile")),
    Rung("R2", "bf16", "+bf16", fn("R2"), builds_on="R1", change=add("bf16")),
    Rung("R2c", "fp32_control", "control", fn("R2c"), kind="control", builds_on="R1", change=add("big")),
    Rung("B1", "fused_adamw", "+fused", fn("B1"), stage="beyond", change=add("fused")),
    Rung("B2", "compiled_adamw", "alt", fn("B2"), stage="beyond", change=add("alt"), alternative=True),
    Rung("B3", "onehot_embedding", "+onehot", fn("B3"), stage="beyond", change=add("onehot")),
    Rung("M1", "data_parallel", "dp", fn("M1"), stage="multi-gpu", kind="multi-gpu", builds_on="R0"),
    Rung("M2", "data_parallel_fast", "dp fast", fn("M2"), stage="multi-gpu", kind="multi-gpu"),
])
FAST = 200.0


def marks(result):
    return {r.name: r.built_on_earlier for r in result.rungs if r.built_on_earlier}


def test_a_seed_rung_run_again_replaces_its_entry_and_marks_what_built_on_it(tmp_path):
    lab = Lab()
    run = LadderRun(lab, RUNGS)
    for n in ("R0", "R1", "R2", "R2c", "M1"):
        run.run(n)
    first = run.result.rung("R1")
    lab.rate["R1"] = 300.0
    again = run.run("R1", compile_model=lambda m: m)             # the edited cell
    assert [r.name for r in run.result.rungs] == ["R0", "R1", "R2", "R2c", "M1"]   # in its place
    assert run.result.rung("R1") is again and again.tokens_per_s == 300.0
    assert again.replaces == {"tokens_per_s": first.tokens_per_s, "outcome": "measured", "error": None}
    assert marks(run.result) == {"R2": ["R1"], "R2c": ["R1"]}     # M1 built on R0 only
    gpu_only = {**RUNGS, "R2c": dataclasses.replace(RUNGS["R2c"], needs_gpu="a GPU")}
    gpu_run = LadderRun(Lab(), gpu_only)
    for n in ("R0", "R1", "R2c", "R1"):
        gpu_run.run(n)
    assert gpu_run.result.rung("R2c").result_kind == "not_applicable" and marks(gpu_run.result) == {}
    r2 = run.result.rung("R2")
    assert r2.ratio_prev is None and r2.verdict is None           # never read across versions
    assert r2.ratio_base == pytest.approx(1.0)                    # R0 was not run again
    back = LadderResult.read(run.result.write(tmp_path / "r.json"))
    assert marks(back) == marks(run.result) and back.rung("R1").replaces == again.replaces
    run.run("R2")                                                 # run on the new R1: unmarked
    assert marks(run.result) == {"R2c": ["R1"]}
    assert run.result.rung("R2").ratio_prev == pytest.approx(100.0 / 300.0)
    assert lab.calls[-1][3] != "library"                          # R2 built with the edited code


def test_marks_go_down_the_chain_and_a_rung_on_a_marked_base_inherits_them():
    run = LadderRun(Lab(), RUNGS)
    for n in ("R0", "R1", "R2", "B1", "B3", "M2"):
        run.run(n)
    run.run("R0")
    assert marks(run.result) == {n: ["R0"] for n in ("R1", "R2", "B1", "B3", "M2")}
    assert run.result.rung("R1").ratio_base is None               # its baseline was run again
    run.run("R2c")                                                # new, on R1 (marked): inherits
    assert run.result.rung("R2c").built_on_earlier == ["R0"]
    run.run("R1")
    assert marks(run.result)["R2"] == ["R0", "R1"] and run.result.rung("R1").built_on_earlier == []
    run.run("R2")
    assert run.result.rung("R2").built_on_earlier == []
    assert marks(run.result)["B1"] == ["R0", "R1", "R2"]          # B1 built on R2 (seed_top)


def test_a_rung_built_on_a_declared_recipe_is_marked_through_the_declarations():
    run = LadderRun(Lab(), RUNGS)
    for n in ("R0", "R1", "B1"):                                  # R2 (seed_top) never ran
        run.run(n)
    run.run("R1")
    assert marks(run.result) == {"B1": ["R1"]}                    # B1 ran on R2's declared recipe, on R1


def test_a_beyond_rung_run_again_builds_on_the_top_before_it_and_the_chain_is_read_again():
    lab = Lab(R2=100.0, B1=FAST, B3=FAST * 2)
    run = LadderRun(lab, RUNGS)
    for n in ("R0", "R1", "R2", "B1", "B3", "M2"):
        run.run(n)
    assert run.fastest()[0] == "B3" and run.result.rung("B3").builds_on == "B1"
    lab.rate["B1"] = 50.0                                         # the edit made B1 slower
    b1 = run.run("B1")
    assert lab.calls[-1][:3] == ("B1", "R2", ("compile", "bf16", "fused"))   # not on B3
    assert b1.kept is False and b1.verdict["verdict"] == "slower"
    assert marks(run.result) == {"B3": ["B1"], "M2": ["B1"]}
    assert run.fastest()[0] == "B3"                               # still the last kept entry
    run.run("B3")                                                 # now on R2 (B1 not kept)
    assert lab.calls[-1][:3] == ("B3", "R2", ("compile", "bf16", "onehot"))
    assert marks(run.result) == {"M2": ["B1", "B3"]}
    run.run("M2")
    assert lab.calls[-1][1] == "B3" and marks(run.result) == {}


def test_a_beyond_rung_that_stays_unkept_marks_nothing_after_it():
    lab = Lab(R2=100.0, B1=50.0, B3=FAST)
    run = LadderRun(lab, RUNGS)
    for n in ("R0", "R1", "R2", "B1", "B3"):
        run.run(n)
    run.run("B1")                                                 # still slower: B3's base is still R2
    assert marks(run.result) == {} and run.fastest()[0] == "B3"
    lab.rate["B1"] = FAST * 3                                     # now kept: B3 built on its absence
    run.run("B1")
    assert marks(run.result) == {"B3": ["B1"]} and run.result.rung("B1").kept


def test_an_interrupt_changes_nothing_and_the_cell_runs_again():
    lab = Lab(config=SMOKE)
    run = LadderRun(lab, RUNGS)
    for n in ("R0", "R1", "R2", "B1"):
        run.run(n)
    before = run.result.to_dict()
    chain = (dict(run.chain.recipes), run.chain.fastest)
    lab.rate["R1"] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        run.run("R1", compile_model=lambda m: m)
    lab.rate["B3"] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        run.run("B3", change=add("edited"))
    assert run.result.to_dict() == before and (dict(run.chain.recipes), run.chain.fastest) == chain
    assert lab.code == {"compile_model": "library"} and run.rungs["B3"] is RUNGS["B3"]
    del lab.rate["R1"], lab.rate["B3"]
    run.run("R1")
    run.run("B3")
    assert [r.name for r in run.result.rungs] == ["R0", "R1", "R2", "B1", "B3"]
    assert marks(run.result) == {"R2": ["R1"], "B1": ["R1"], "B3": ["R1"]}   # B3 on B1


def test_a_rung_run_again_that_fails_leaves_the_chain_on_its_declared_recipe():
    lab = Lab()
    run = LadderRun(lab, RUNGS)
    for n in ("R0", "R1", "R2"):
        run.run(n)
    lab.rate["R1"] = RuntimeError("planted")
    r1 = run.run("R1")
    assert r1.result_kind == "error" and r1.replaces["outcome"] == "measured"
    assert marks(run.result) == {"R2": ["R1"]} and "R1" not in run.chain.recipes
    assert run.chain.recipe_of("R1") == Recipe(("compile",))


def test_an_interrupt_while_a_measured_rung_is_recorded_waits_for_the_record():
    import os
    import signal

    from perfladder.ladder.rerun import uninterrupted
    got = []
    with pytest.raises(KeyboardInterrupt), uninterrupted():
        os.kill(os.getpid(), signal.SIGINT)
        got.append("recorded")                     # still runs: the Ctrl-C waits
    assert got == ["recorded"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


# -- --resume --------------------------------------------------------------------------------------------
def test_resume_retries_what_failed_and_reruns_what_built_on_it(tmp_path, capsys):
    lab = Lab(R1=RuntimeError("disk full (planted)"), R2=100.0, B1=FAST)
    res = run_ladder(lab, RUNGS, ["R0", "R1", "R2", "B1", "B3", "M1", "M2"], learn=False)
    assert res.rung("R1").result_kind == "error" and res.rung("M1").measured
    path = res.write(tmp_path / "r.json")
    capsys.readouterr()
    lab2 = Lab(R2=100.0, B1=FAST)
    res2 = run_ladder(lab2, RUNGS, ["R0", "R1", "R2", "B1", "B3", "M1", "M2"], learn=False,
                      resume=LadderResult.read(path))
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "perfladder: torch: retrying R1, which failed with RuntimeError: disk full (planted)"
    assert err[1] == "perfladder: torch: re-running R2, which was built on an earlier version of R1"
    assert [c[0] for c in lab2.calls] == ["R1", "R2", "B1", "B3", "M2"]   # R0 and M1 kept
    assert all(r.measured for r in res2.rungs) and marks(res2) == {}
    assert [r.name for r in res2.rungs] == ["R0", "R1", "R2", "B1", "B3", "M1", "M2"]
    assert res2.rung("R1").replaces["outcome"] == "error"
    back = LadderResult.read(res2.write(tmp_path / "r.json"))
    assert back.rung("R2").ratio_prev == pytest.approx(100.0 / 100.0) and marks(back) == {}


def test_resume_keeps_card_properties_and_runs_nothing_twice(tmp_path):
    from perfladder.ladder.rung import NotMeasured

    class DoesNotFit(NotMeasured):
        outcome = "does_not_fit"
    lab = Lab(B1=DoesNotFit("needs 90 GiB"))
    res = run_ladder(lab, RUNGS, ["R0", "R1", "R2", "B1"], learn=False)
    assert res.rung("B1").result_kind == "does_not_fit"
    lab2 = Lab()
    res2 = run_ladder(lab2, RUNGS, ["R0", "R1", "R2", "B1"], learn=False,
                      resume=LadderResult.read(res.write(tmp_path / "r.json")))
    assert lab2.calls == [] and res2.rung("B1").result_kind == "does_not_fit"
