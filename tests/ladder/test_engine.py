"""perfladder.ladder.engine, the framework-free engine, on a fake lab with fake rungs (no torch, no jax):
the registry's checks, rung selection, how rungs chain and which are kept, failures that
become skipped rungs, the kernel report, the learning check and the progress events."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from conftest import timing_of

from perfladder.config import get_config
from perfladder.ladder.engine import (
    Chain,
    LadderRun,
    Rung,
    check_rungs,
    keeps,
    registry,
    run_ladder,
    run_rung,
)
from perfladder.ladder.rung import Evidence
from perfladder.measure.learning import LearningCheck
from perfladder.results.record import LadderResult, RungResult

SMOKE = get_config("smoke")
FULL = SMOKE.replace(name="full")          # smoke sizes, but the numbers decide


@dataclass(frozen=True)
class Recipe:
    """A stand-in recipe: a batch size and the techniques switched on, in order."""
    batch: int = 8
    tricks: tuple = ()

    def replace(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return {"batch": self.batch, "tricks": list(self.tricks)}

    @classmethod
    def from_dict(cls, d: dict) -> "Recipe":
        return cls(batch=d["batch"], tricks=tuple(d["tricks"]))


def add(trick):
    return lambda r, c: r.replace(tricks=r.tricks + (trick,))


class FakeLab:
    """What the engine needs of a backend. ``plan[name]``: the rung's windows (settled), or
    ``(windows, stable)``, or an exception the rung raises."""
    framework = "torch"
    baseline = "R0"
    seed_top = "R2"

    def __init__(self, config=FULL, plan=None, on_gpu=False):
        self.config, self.plan, self.on_gpu = config, dict(plan or {}), on_gpu
        self.device_name = "fake device"
        self.result = LadderResult(framework="torch", device="fake device", config=config.to_dict(),
                                   baseline=self.baseline)
        self.calls = []            # (rung, recipe, base) as each rung function saw them
        self.freed = 0
        self.kernel_calls, self.learn_calls = [], []
        self.kernel_error = None

    def seed_recipe(self):
        return Recipe()

    def use(self, **code):
        self.code = code

    def precision(self, recipe):
        return "fp32"

    def flops_per_token(self, seq_len):
        return 1000

    def recipe_from_dict(self, d):
        return Recipe.from_dict(d)

    def free(self):
        self.freed += 1

    def kernel_report(self, name, recipe):
        self.kernel_calls.append((name, recipe))
        if self.kernel_error is not None:
            raise self.kernel_error
        return {"framework": "fake", "of": name}

    def learning_check(self, name, recipe, watch=None):
        self.learn_calls.append((name, recipe))
        return LearningCheck(steps=40, first=3.0, last=2.0, window=20)


def fake(name, kind="rung", pin=None):
    """A rung function: records what it was handed, returns the planted measurement. ``pin``
    changes the recipe it reports (as a rung that picks something inside, like B7)."""
    def fn(lab, given):
        recipe, base = given.recipe, given.base_name
        lab.calls.append((name, recipe, base))
        p = lab.plan.get(name, [100.0, 100.0, 100.0])
        with given.watch("gates"):                 # a phase, timed as the trials time theirs
            pass
        if isinstance(p, Exception):
            raise p
        windows, stable = p if isinstance(p, tuple) else (p, True)
        ran = recipe if pin is None else recipe.replace(tricks=recipe.tricks + (pin,))
        return Evidence(timing=timing_of(windows, stable=stable), recipe=ran)
    fn.__name__ = f"rung_{name}"
    return fn


def declarations():
    return [
        Rung("R0", "eager", "eager", fake("R0")),
        Rung("R1", "compile", "compile", fake("R1"), builds_on="R0", change=add("compile")),
        Rung("R2", "bf16", "+bf16", fake("R2"), builds_on="R1", change=add("bf16")),
        Rung("R2c", "fp32_control", "control", fake("R2c", kind="control"), kind="control",
             builds_on="R0", change=lambda r, c: r.replace(batch=c.big_batch)),
        Rung("B1", "fused_adamw", "+fused", fake("B1"), stage="beyond", change=add("fused")),
        Rung("B2", "compiled_adamw", "alternative", fake("B2"), stage="beyond", change=add("alt"), alternative=True),
        Rung("B3", "cuda_graphs", "+graphs", fake("B3"), stage="beyond", change=add("graphs"),
             needs_gpu="graphs exist only on a GPU"),
        Rung("B4", "onehot_embedding", "+onehot", fake("B4"), stage="beyond", change=add("onehot")),
        Rung("B5", "attention_kernel", "pinned", fake("B5", pin="pinned"), stage="beyond", alternative=True),
        Rung("B6", "max_autotune", "+tune", fake("B6"), stage="beyond", change=add("tune"), optional=True),
        Rung("M1", "data_parallel", "dp", fake("M1", kind="multi-gpu"), stage="multi-gpu", kind="multi-gpu",
             builds_on="R0"),
        Rung("M2", "data_parallel_fast", "dp fast", fake("M2", kind="multi-gpu"), stage="multi-gpu",
             kind="multi-gpu"),
    ]


RUNGS = registry(declarations())
FAST = [200.0, 201.0, 202.0]
SLOW = [50.0, 51.0, 52.0]


def ladder(config=FULL, plan=None, names=None, on_gpu=False, **kw):
    lab = FakeLab(config, plan, on_gpu=on_gpu)
    events = []
    res = run_ladder(lab, RUNGS, names, progress=lambda *e: events.append(e), **kw)
    return lab, res, events


def seen(lab):
    """{rung: (base, recipe tricks, batch)} as each rung function was handed them."""
    return {n: (b, r.tricks, r.batch) for n, r, b in lab.calls}


# -- the registry ----------------------------------------------------------------------------------------
def nop(lab, recipe, base):
    raise AssertionError("never run")


@pytest.mark.parametrize("rungs, msg", [
    ([Rung("R0", "eager", "a", nop), Rung("R0", "compile", "b", nop)], "rung name 'R0' declared twice"),
    ([Rung("R0", "eager", "a", nop), Rung("R1", "eager", "b", nop)], r"technique key 'eager' declared twice \(rung 'R1'\)"),
    ([Rung("B1", "compile", "b", nop, stage="beyond"), Rung("R0", "eager", "a", nop)],
     r"rung 'R0' \(seed\) is declared after a later stage"),
    ([Rung("M1", "data_parallel", "m", nop, stage="multi-gpu"), Rung("B1", "compile", "b", nop, stage="beyond")],
     "rung 'B1' .* after a later stage"),
    ([Rung("R1", "compile", "b", nop, builds_on="R9")], "rung 'R1' builds on 'R9', which is not declared before it"),
    ([Rung("R1", "compile", "b", nop, builds_on="R0"), Rung("R0", "eager", "a", nop)], "builds on 'R0', which is not declared before"),
])
def test_registry_refuses_inconsistent_declarations(rungs, msg):
    with pytest.raises(ValueError, match=msg):
        registry(rungs)


@pytest.mark.parametrize("kw, msg", [
    (dict(key="Fast-Path"), r"rung 'X': key='Fast-Path' must match \^\[a-z0-9_\]\+\$"),
    (dict(key=""), "key=''"),
    (dict(stage="later"), r"stage='later'; valid choices: \('seed', 'beyond', 'multi-gpu'\)"),
    (dict(kind="bonus"), r"kind='bonus'; valid choices: \('rung', 'control', 'multi-gpu'\)"),
])
def test_a_bad_declaration_names_the_value_and_the_choices(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Rung(**{"name": "X", "key": "x", "label": "x", "fn": nop, **kw})


def test_registry_keeps_declaration_order():
    assert list(RUNGS) == ["R0", "R1", "R2", "R2c", "B1", "B2", "B3", "B4", "B5", "B6", "M1", "M2"]


# -- which rungs run -------------------------------------------------------------------------------------
def test_check_rungs_default_and_optional():
    assert check_rungs(RUNGS) == [n for n in RUNGS if n != "B6"]
    assert check_rungs(RUNGS, optional=True) == list(RUNGS)
    assert check_rungs(RUNGS, ["B6"]) == ["B6"]                 # an optional rung runs when named
    assert check_rungs(RUNGS, ["M1", "B6", "R0"]) == ["R0", "B6", "M1"]   # in ladder order
    assert check_rungs(RUNGS, "R1") == ["R1"]


def test_check_rungs_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as e:
        check_rungs(RUNGS, ["R0", "R9", "b1"])
    msg = str(e.value)
    assert msg.startswith("unknown rung(s) 'R9', 'b1'; valid choices: ")
    assert msg.endswith(", ".join(RUNGS))


def test_run_ladder_runs_only_the_named_rungs():
    lab, res, _ = ladder(names=["R1", "B6"], learn=False, kernels=False)
    assert [r.name for r in res.rungs] == ["R1", "B6"] and [c[0] for c in lab.calls] == ["R1", "B6"]


# -- how rungs chain ---------------------------------------------------------------------------------------
def test_seed_rungs_build_on_declared_recipes_even_when_the_base_did_not_run():
    lab, res, _ = ladder(names=["R2", "R2c"], learn=False)
    assert seen(lab) == {"R2": ("R1", ("compile", "bf16"), 8), "R2c": ("R0", (), SMOKE.big_batch)}
    r2 = res.rung("R2")
    assert r2.builds_on == "R1" and r2.ratio_prev is None and r2.verdict is None
    assert r2.recipe == {"batch": 8, "tricks": ["compile", "bf16"]}


def test_the_engine_fills_in_the_declaration():
    _, res, _ = ladder(names=["R1", "R2c"], learn=False)
    r1 = res.rung("R1")
    assert (r1.name, r1.key, r1.label, r1.stage, r1.builds_on) == ("R1", "compile", "compile", "seed", "R0")
    assert res.rung("R2c").kind == "control" and res.rung("R2c").key == "fp32_control"
    assert r1.kept is None                                      # keeping is for beyond rungs


def test_a_rung_builds_on_what_its_base_actually_ran():
    """B5 pins something inside (as B7 pins an attention kernel): what it ran is recorded, and a
    later rung that builds on it gets that recipe, not the declared one."""
    lab, _, _ = ladder(SMOKE, names=["B5", "M2"], learn=False, kernels=False)
    assert seen(lab)["B5"] == ("R2", ("compile", "bf16"), 8)   # the beyond start: seed_top's recipe
    # smoke: B5 is an alternative and not kept, so M2 builds on R2 still
    assert seen(lab)["M2"][0] == "R2"
    pinned = [Rung("R0", "eager", "eager", fake("R0", pin="pinned")),
              Rung("R1", "compile", "compile", fake("R1"), builds_on="R0", change=add("compile"))]
    lab = FakeLab()
    run_ladder(lab, registry(pinned), learn=False)
    assert seen(lab)["R1"] == ("R0", ("pinned", "compile"), 8)


def test_multi_gpu_rungs_run_last_and_build_on_their_named_rung_or_the_fastest():
    lab, res, _ = ladder(plan={"B1": FAST}, learn=False, kernels=False)
    assert [r.name for r in res.rungs][-2:] == ["M1", "M2"]
    assert seen(lab)["M1"] == ("R0", (), 8)
    assert seen(lab)["M2"] == ("B1", ("compile", "bf16", "fused"), 8)


# -- the keep rule ----------------------------------------------------------------------------------------
def test_full_keeps_only_a_faster_verdict():
    plan = {"R2": [100.0, 101.0, 102.0],
            "B1": FAST,                                      # faster than R2: kept
            "B2": SLOW,                                      # slower: not kept
            "B4": [199.0, 203.0, 206.0],                     # overlaps B1's windows: within noise
            "B5": ([400.0, 800.0, 1200.0], False)}           # 'faster' by far, but never settled
    lab, res, _ = ladder(plan=plan, learn=False, kernels=False, on_gpu=True)
    v = {r.name: (r.verdict or {}).get("verdict") for r in res.rungs}
    assert v["B1"] == "faster" and v["B2"] == "slower" and v["B4"] == "within noise"
    assert v["B5"] == "unsettled" and v["B3"] == "slower"
    assert {r.name: r.kept for r in res.rungs if r.stage == "beyond"} == {
        "B1": True, "B2": False, "B3": False, "B4": False, "B5": False}
    s = seen(lab)
    assert s["B1"][0] == "R2" and s["B2"][0] == s["B3"][0] == s["B4"][0] == s["B5"][0] == "B1"
    assert s["B4"][1] == ("compile", "bf16", "fused", "onehot")         # B2, B3 left out
    assert res.rung("B4").ratio_prev == pytest.approx(203.0 / 201.0)


def test_a_disturbed_base_does_not_discard_a_settled_rung_above_all_its_windows():
    """R2 never settles (windows 80-120); B1 settles above every one of them: its speedup is not
    credited, but the chain builds on it. B2 settles inside R2's range: neither."""
    plan = {"R2": ([80.0, 120.0, 100.0], False),
            "B1": [150.0, 151.0, 152.0],
            "B2": [110.0, 111.0, 112.0]}
    lab, res, _ = ladder(plan=plan, names=["R0", "R1", "R2", "B1", "B2"], learn=False, kernels=False,
                         on_gpu=True)
    b1, b2 = res.rung("B1"), res.rung("B2")
    assert b1.verdict["verdict"] == "unsettled" and b1.verdict["unsettled"] == ["R2"]
    assert b1.verdict["against_all"] == [80.0, 120.0] and b1.kept is True
    assert seen(lab)["B2"][0] == "B1"                      # built on B1, not on the disturbed R2
    assert b2.verdict["against"] == "B1" and b2.verdict["verdict"] == "slower" and not b2.kept


def test_keeps_directly():
    rung = RUNGS["B1"]
    res = RungResult(name="B1", key="fused", label="x", tokens_per_s=2.0, timing=timing_of([2.0]))
    for v, kept in (("faster", True), ("slower", False), ("within noise", False), ("unsettled", False)):
        res.verdict = {"verdict": v}
        assert keeps(rung, res, smoke=False) is kept, v
    above = {"verdict": "unsettled", "against": "R3", "unsettled": ["R3"], "range": [2.0, 2.1],
             "against_all": [0.5, 1.9]}
    assert keeps(rung, res.__class__(**{**res.__dict__, "verdict": above}), smoke=False) is True
    for change in ({"unsettled": ["B1"]}, {"unsettled": ["B1", "R3"]}, {"against_all": [0.5, 2.0]},
                   {"against_all": None}):
        res.verdict = {**above, **change}                    # itself unsettled, or not above all
        assert keeps(rung, res, smoke=False) is False, change
    res.verdict = None                                       # nothing to compare with
    assert keeps(rung, res, smoke=False) is False
    assert keeps(rung, res, smoke=True) is True
    assert keeps(RUNGS["B2"], res, smoke=True) is False      # an alternative
    skipped = RungResult(name="B1", key="fused", label="x", kind="skipped", error="no")
    assert keeps(rung, skipped, smoke=True) is False


def test_smoke_keeps_every_added_technique_and_no_alternative():
    """In smoke the numbers decide nothing: a slower added technique is kept, a faster
    alternative is not, so a smoke run always walks the same configurations."""
    plan = {"R2": [100.0] * 3, "B1": SLOW, "B2": FAST, "B4": SLOW}
    lab, res, _ = ladder(SMOKE, plan=plan, learn=False, kernels=False)
    assert res.rung("B1").verdict["verdict"] == "slower" and res.rung("B1").kept is True
    assert res.rung("B2").verdict["verdict"] == "faster" and res.rung("B2").kept is False
    assert res.rung("B3").kind == "skipped" and res.rung("B3").kept is False
    s = seen(lab)
    assert s["B2"][0] == "B1" and s["B4"] == ("B1", ("compile", "bf16", "fused", "onehot"), 8)
    assert s["B5"][0] == "B4"


# -- failures become skipped rungs ----------------------------------------------------------------------------
def test_a_raising_rung_is_a_loud_skip_and_the_ladder_goes_on(capsys):
    plan = {"B1": RuntimeError("CUDA out of memory (planted)"), "B4": FAST}
    lab, res, _ = ladder(plan=plan, kernels=False)
    b1 = res.rung("B1")
    assert b1.kind == "skipped" and b1.tokens_per_s is None and b1.kept is False
    assert b1.error == "RuntimeError: CUDA out of memory (planted)"
    tb = b1.details["traceback"]
    assert tb.startswith("Traceback") and "test_engine.py" in tb and "raise p" in tb
    assert b1.recipe == {"batch": 8, "tricks": ["compile", "bf16", "fused"]}
    assert (b1.key, b1.label, b1.stage, b1.builds_on) == ("fused_adamw", "+fused", "beyond", "R2")
    assert "perfladder: torch B1 (+fused) not measured: RuntimeError: CUDA out of memory (planted)" \
        in capsys.readouterr().err
    assert [r.name for r in res.rungs] == check_rungs(RUNGS)          # every later rung ran
    assert seen(lab)["B2"][0] == "R2"                                 # nothing kept
    assert res.learning is not None
    assert lab.freed >= len(res.rungs)                                # freed after every rung, failed too
    # where the failed rung's time went, up to the failure
    assert set(b1.details["seconds"]) == {"gates", "total"}
    assert 0 <= b1.details["seconds"]["gates"] <= b1.details["seconds"]["total"]


def test_a_raising_change_is_a_skip_too():
    broken = [Rung("R0", "eager", "eager", fake("R0")),
              Rung("R1", "compile", "compile", fake("R1"), builds_on="R0",
                   change=lambda r, c: r.replace(colour="red"))]
    lab = FakeLab()
    res = run_ladder(lab, registry(broken), learn=False)
    r1 = res.rung("R1")
    assert r1.kind == "skipped" and "TypeError" in r1.error and "colour" in r1.error
    assert r1.recipe == {"batch": 8, "tricks": []} and [c[0] for c in lab.calls] == ["R0"]


def test_needs_gpu_on_cpu_is_skipped_without_running():
    lab, res, _ = ladder(names=["B3"], learn=False, kernels=False)
    b3 = res.rung("B3")
    assert b3.kind == "skipped" and b3.error == "not applicable on CPU: graphs exist only on a GPU"
    assert b3.recipe["tricks"] == ["compile", "bf16", "graphs"] and lab.calls == []
    lab, res, _ = ladder(names=["B3"], learn=False, kernels=False, on_gpu=True)
    assert res.rung("B3").measured and [c[0] for c in lab.calls] == ["B3"]


def test_skipped_rungs_stay_valid_results(tmp_path):
    _, res, _ = ladder(plan={"B1": ValueError("x" * 5000)}, learn=False)
    assert len(res.rung("B1").error) <= 3000
    back = LadderResult.read(res.write(tmp_path / "r.json"))
    assert back.rung("B1").kind == "skipped" and back.rung("B3").error.startswith("not applicable")


# -- after the rungs: the kernel report and the learning check ----------------------------------------------------
def test_kernel_report_of_the_fastest_configuration():
    lab, res, _ = ladder(SMOKE, learn=False)
    assert lab.kernel_calls == [("B4", Recipe(tricks=("compile", "bf16", "fused", "onehot")))]
    kb = dict(res.rung("B4").kernels)
    assert kb.pop("seconds") >= 0 and kb == {"framework": "fake", "of": "B4"}   # its own time too
    assert [r.name for r in res.rungs if r.kernels] == ["B4"]
    lab, _, _ = ladder(names=["R0", "R1"], learn=False)
    assert lab.kernel_calls == []                              # no beyond rung: no report
    lab, _, _ = ladder(SMOKE, learn=False, kernels=False)
    assert lab.kernel_calls == []


def test_a_failing_kernel_report_is_recorded_not_raised(capsys):
    lab = FakeLab(SMOKE)
    lab.kernel_error = RuntimeError("the profile recorded no CUDA kernels (planted)")
    res = run_ladder(lab, RUNGS)
    assert res.rung("B4").kernels is None
    assert res.rung("B4").details["kernels_error"] == "RuntimeError: the profile recorded no CUDA kernels (planted)"
    assert any(n.startswith("kernel breakdown of B4 failed: RuntimeError") for n in res.notes)
    assert "perfladder: kernel breakdown of B4 failed" in capsys.readouterr().err
    assert res.learning is not None and [r.name for r in res.rungs][-1] == "M2"   # the ladder finished


def test_kernel_report_when_the_fastest_did_not_run_here():
    lab = FakeLab(SMOKE)
    run = LadderRun(lab, RUNGS)
    kb = run.kernel_report()
    assert kb.pop("seconds") >= 0 and kb == {"framework": "fake", "of": "R2"}   # seed_top's declared recipe
    assert lab.kernel_calls == [("R2", Recipe(tricks=("compile", "bf16")))]
    assert any("R2 not in this run" in n for n in lab.result.notes)


def test_learning_check_trains_the_fastest_configuration():
    lab, res, _ = ladder(SMOKE, names=["R0", "R1", "R2", "B1", "B2"])
    assert lab.learn_calls == [("B1", Recipe(tricks=("compile", "bf16", "fused")))]
    assert res.learning.configuration == "B1" and res.learning.passed and res.learning.seconds >= 0
    assert ladder(names=["R0"], learn=False)[1].learning is None


def test_without_beyond_rungs_full_trains_the_fastest_settled_rung_and_smoke_the_seed_top():
    plan = {"R0": [100.0] * 3, "R1": ([900.0, 1000.0, 1500.0], False), "R2": [300.0] * 3}
    lab, res, _ = ladder(FULL, plan=plan, names=["R0", "R1", "R2"])
    assert res.learning.configuration == "R2"                 # R1 is faster, but never settled
    plan["R2"] = [50.0] * 3
    lab, res, _ = ladder(FULL, plan=plan, names=["R0", "R1", "R2"])
    assert res.learning.configuration == "R0"
    lab, res, _ = ladder(SMOKE, plan=plan, names=["R0", "R1"])
    assert res.learning.configuration == "R2" and lab.learn_calls[0][1].tricks == ("compile", "bf16")


# -- progress and rung-by-rung runs ---------------------------------------------------------------------------------
def test_progress_events_in_order():
    lab, res, events = ladder(SMOKE)
    names = check_rungs(RUNGS) + ["learning"]
    assert [(e[0], e[1]) for e in events] == [(k, n) for n in names for k in ("start", "end")]
    assert all(e[2] is None for e in events if e[0] == "start")
    ends = [e[2] for e in events if e[0] == "end"]
    assert ends[:-1] == res.rungs and ends[-1] is res.learning


def test_ladder_run_rung_by_rung():
    lab = FakeLab(plan={"B1": FAST})
    run = LadderRun(lab, RUNGS)
    b1 = run.run("B1")                                         # any order: builds on seed_top's recipe
    assert b1.builds_on == "R2" and run.result.rungs == [b1]
    assert b1.verdict is None and b1.kept is False             # R2 did not run: nothing to beat
    assert run.fastest()[0] == "R2"
    run.run("R2")
    b4 = run.run("B4")                                         # B4 vs R2 (100): slower, not kept
    assert b4.builds_on == "R2" and b4.kept is False
    lab = FakeLab(plan={"B1": FAST})
    run = LadderRun(lab, RUNGS)
    run.run("R2")
    b1 = run.run("B1")
    assert b1.verdict["verdict"] == "faster" and b1.kept and run.fastest()[0] == "B1"
    again = run.run("B1")                                     # run again: measured again, in its place
    assert again.replaces["tokens_per_s"] == b1.tokens_per_s and run.result.rungs[1] is again
    with pytest.raises(ValueError, match="unknown rung.*'B9'"):
        run.run("B9")
    assert "ran=['R2', 'B1']" in repr(run)
    check = run.learning_check()
    assert run.result.learning is check and check.configuration == "B1"


def test_run_rung_records_into_the_lab_result():
    lab = FakeLab()
    chain = Chain(RUNGS, lab)
    r = run_rung(RUNGS["R1"], lab, chain)
    assert lab.result.rungs == [r] and chain.recipes["R1"] == Recipe(tricks=("compile",))
    assert chain.fastest is None                              # seed rungs leave the beyond chain alone



def test_resume_continues_an_earlier_run_from_its_file(tmp_path):
    """A later run (e.g. the multi-GPU rungs on a machine with both GPUs free) continues an
    earlier results file: its rungs are not run again, the multi-GPU rung builds on the
    earlier run's fastest configuration, and a file of another framework or config is refused."""
    lab, res, _ = ladder(plan={"B1": FAST}, names=["R0", "R1", "R2", "B1", "B2"], learn=False)
    path = res.write(tmp_path / "torch.json")
    earlier = LadderResult.read(path)
    lab2, res2, _ = ladder(names=["R0", "M1", "M2"], learn=False, kernels=False, resume=earlier)
    assert [c[0] for c in lab2.calls] == ["M1", "M2"]                   # R0 is not run again
    assert [r.name for r in res2.rungs] == ["R0", "R1", "R2", "B1", "B2", "M1", "M2"]
    assert seen(lab2)["M2"][:2] == ("B1", ("compile", "bf16", "fused"))  # the earlier run's winner
    assert seen(lab2)["M1"][:2] == ("R0", ())
    other = LadderResult.read(path)
    other.config["name"] = "smoke"
    with pytest.raises(ValueError, match="cannot continue"):
        ladder(names=["M1"], resume=other)


def test_a_resumed_file_keeps_the_settings_of_both_processes(tmp_path):
    """The notes of the run that continues a file (its device memory settings, say) join the
    earlier run's where they differ, marked as the continuing run's."""
    _, res, _ = ladder(names=["R0", "R1"], learn=False)
    earlier = LadderResult.read(res.write(tmp_path / "torch.json"))
    earlier.notes[:] = ["shared setting", "memory: grown as needed"]
    lab2 = FakeLab(FULL, None)
    lab2.result.notes[:] = ["shared setting", "memory: one pool"]
    res2 = run_ladder(lab2, RUNGS, ["R0", "M1"], learn=False, kernels=False, resume=earlier)
    assert res2.notes[:2] == ["shared setting", "memory: grown as needed"]
    assert res2.notes[2].startswith("continued by: ")
    assert res2.notes[3:] == ["the continuing run: memory: one pool"]


def test_a_cell_s_recipe_change_replaces_the_declared_one_for_this_ladder_only():
    """``LadderRun.run(name, change=...)``: the rung runs the recipe the given change makes (an
    edited cell measures the edit), later rungs build on what it ran, and the registry the
    ladder was made from is untouched."""
    from _ladders import FakeLab, fake_rungs

    from perfladder.config import get_config
    from perfladder.ladder.engine import LadderRun
    rungs = fake_rungs()
    declared = rungs["R3"].change
    run = LadderRun(FakeLab(get_config("smoke")), rungs)
    for name in ("R0", "R1", "R2"):
        run.run(name)
    r3 = run.run("R3", change=lambda r, c: r.replace(batch_size=48))
    assert r3.recipe["batch_size"] == 48 and r3.recipe["bf16"] is True     # on R2's recipe
    assert rungs["R3"].change is declared
    assert run.run("B1").recipe["batch_size"] == 48                         # builds on what ran
    with pytest.raises(ValueError, match="change='big' is not valid"):
        LadderRun(FakeLab(get_config("smoke")), rungs).run("R0", change="big")


def test_every_entry_says_what_became_of_it_and_only_failures_are_not_final():
    from perfladder.results.record import FINAL_OUTCOMES, OUTCOMES, RungResult
    assert set(FINAL_OUTCOMES) < set(OUTCOMES) and {"failed", "error"} == set(OUTCOMES) - set(FINAL_OUTCOMES)
    measured = RungResult(name="R1", key="compile", label="compile", tokens_per_s=1.0, outcome="measured")
    broke = RungResult(name="R2", key="bf16", label="bf16", kind="skipped", error="x", outcome="failed")
    card = RungResult(name="B6", key="batch_x4", label="b", kind="skipped", error="x", outcome="does_not_fit")
    old = RungResult(name="R3", key="batch", label="b", kind="skipped", error="x")      # before outcomes
    assert [r.final for r in (measured, broke, card, old)] == [True, False, True, False]
    assert RungResult.from_dict(card.to_dict()).outcome == "does_not_fit"


def test_a_rung_that_runs_out_of_device_memory_does_not_fit_in_one_line(capsys):
    """A real out-of-memory error the prediction let through (seen on a GPU capped to 24 GiB) is
    a property of the card: outcome does_not_fit, one line, no traceback kept; later rungs go on."""
    class OutOfMemoryError(RuntimeError):     # torch.OutOfMemoryError, told apart by its name
        pass
    message = ("CUDA out of memory. Tried to allocate 768.00 MiB. GPU 0 has a total capacity of "
               "79.18 GiB of which 30.30 GiB is free.\nIncluding non-PyTorch memory, ...")
    lab, res, _ = ladder(plan={"B1": OutOfMemoryError(message), "B4": FAST}, kernels=False)
    b1 = res.rung("B1")
    assert (b1.outcome, b1.kind, b1.final, b1.kept) == ("does_not_fit", "skipped", True, False)
    assert b1.error == ("does not fit: ran out of device memory (CUDA out of memory); "
                        "no prediction refused it first")
    assert "traceback" not in b1.details and b1.details["message"].startswith("CUDA out of memory.")
    err = capsys.readouterr().err
    assert "Traceback" not in err and "B1 (+fused) not measured: does not fit" in err
    assert res.rung("B4").measured and res.rung("B4").builds_on == "R2"     # built on what was kept
