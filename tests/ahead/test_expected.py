"""perfladder.ahead.expected: the compiled steps a ladder is expected to build, guessed from
the committed runs before it runs (on the PyTorch ladder, whose ahead.torch says which compile;
the JAX ladder's guess in tests/ahead/test_jax.py)."""
from __future__ import annotations

import copy

import pytest

from perfladder.ahead import expected as ahead
from perfladder.ahead.torch import compiles
from perfladder.config import get_config
from perfladder.ladder import engine
from perfladder.results.committed import read_run, reference_run
from perfladder.torch.lab import TorchLab
from perfladder.torch.recipe import Recipe
from perfladder.torch.rungs import RUNGS

NAMES = engine.check_rungs(RUNGS, None)


@pytest.fixture(scope="module")
def full_lab():
    return TorchLab(get_config("full"), device="cpu")


@pytest.fixture(scope="module")
def reference():
    return read_run(reference_run(framework="torch") / "torch.json")


# A committed H200 run with the history the guesses below are about, whatever run the pages show
# today: it kept B9 (its GELU kernel is in every later step), and its last kept rung is B14, so
# the rungs added to the ladder after it (B15-B18) include the CUDA-graph rung B16.
HISTORY_RUN = "h200-book-stage-2026-12-04"


@pytest.fixture(scope="module")
def kept_b9():
    from perfladder.paths import repo_root
    run = read_run(repo_root() / "benchmarks" / "results" / HISTORY_RUN / "torch.json")
    assert run.rung("B9").kept and [r.name for r in run.rungs if r.kept][-1] == "B14"
    return run


def test_the_guess_is_the_reference_runs_compiled_steps_one_per_set_of_graphs(full_lab, reference):
    ref = copy.deepcopy(reference)
    got = ahead.expected_recipes(full_lab, RUNGS, NAMES, ref, compiles=compiles)
    measured = {r.name: full_lab.recipe_from_dict(r.recipe) for r in ref.rungs if r.measured}
    assert "R1" not in got                                  # its first call is the chapter's compile
    # max-autotune (B11, asked for by name): its GEMMs are tuned at compile time, on an idle GPU
    with_b11 = [n for n in RUNGS if n in NAMES or n == "B11"]
    tuned = ahead.expected_recipes(full_lab, RUNGS, with_b11, ref, compiles=lambda r: True)
    assert tuned["B11"].autotune and "B11" not in ahead.expected_recipes(
        full_lab, RUNGS, with_b11, ref, compiles=compiles)
    assert all(r.compiled for r in got.values())
    listed = {r.name for r in ref.rungs}
    assert all(got[n] == measured[n] for n in got if n in listed)   # the reference's own recipes
    keys = [ahead._key(r) for r in got.values()]
    assert len(set(keys)) == len(keys)
    # every other compiled, measured one-GPU rung is there, or shares its graphs with one that is
    left = {n for n, r in measured.items() if r.compiled and not r.autotune and n not in ("R1",)
            and RUNGS[n].stage != "multi-gpu"} - set(got)
    assert all(ahead._key(measured[n]) in keys for n in left)
    if "B1" in measured and "R3" in measured:               # fused AdamW runs outside the graphs
        assert "B1" not in got and "R3" in got
    # which to start first: a rung's gates (where its step compiled) and its first call
    costs = ahead.expected_costs(reference)
    r2 = reference.rung("R2")
    assert costs["R2"] == pytest.approx(r2.details["seconds"]["gates"] + r2.compile.first_call_s)
    assert costs["R2"] > costs["R0"] and ahead.expected_costs(None) == {}


def test_a_rung_that_went_both_ways_in_past_runs_is_compiled_both_ways(full_lab, kept_b9):
    """History: past runs of the same ladder. Where B9 went the other way in half of them, the
    later rungs are also compiled as they would be without it; a rung decided the same way
    everywhere adds nothing, and neither does a past run of an older ladder (other rungs)."""
    kept = [r.name for r in kept_b9.rungs if r.stage == "beyond" and r.kept]
    assert "B9" in kept                          # the run built on its GELU kernel

    def past(i, flip=()):
        run = copy.deepcopy(kept_b9)
        run.created = f"past-{i}"
        for r in run.rungs:
            if r.name in flip:
                r.kept = not r.kept
        return run
    older = past(9, flip=("B9",))
    older.rungs = [r for r in older.rungs if r.name != "B13"]       # an older ladder's run
    assert ahead.undecided(full_lab, kept_b9, [kept_b9, past(1), past(2), older]) == []
    history = [kept_b9, past(1, flip=("B9",)), past(2), older]
    assert ahead.undecided(full_lab, kept_b9, history) == ["B9"]
    got = ahead.expected_recipes(full_lab, RUNGS, NAMES, kept_b9, history, compiles=compiles)
    alternatives = {n: r for n, r in got.items() if " if " in n}
    assert alternatives and all(n.endswith(" if B9 is not kept") for n in alternatives)
    assert all("gelu" not in r.fused for r in alternatives.values())
    assert "B10 if B9 is not kept" in alternatives
    assert alternatives["B10 if B9 is not kept"].fused == tuple(
        f for f in got["B10"].fused if f != "gelu")
    assert ahead.rung_of("B10 if B9 is not kept") == "B10"
    # B6 (batch x4 -> x2) gone the other way: the later steps at half its batch, half the memory
    got = ahead.expected_recipes(full_lab, RUNGS, NAMES, kept_b9, [past(3, flip=("B6",))],
                                compiles=compiles)
    needs = ahead.expected_needs(kept_b9, got)
    alt = got["B8 if B6 is not kept"]
    assert alt.batch_size * 2 == got["B8"].batch_size
    assert needs["B8 if B6 is not kept"] * 2 == pytest.approx(needs["B8"])


def test_without_a_reference_the_guess_walks_the_declared_chain():
    lab = TorchLab(get_config("smoke"), device="cpu")
    full = ahead.expected_recipes(lab, RUNGS, NAMES, None, compiles=compiles)
    assert "R1" not in full and "R0" not in full
    assert full["R2"] == Recipe(batch_size=lab.config.batch_size, compiled=True, bf16=True)
    beyond = [n for n in full if RUNGS[n].stage == "beyond"]
    assert beyond, full
    # each kept beyond rung builds on the one before: the last carries the changes before it
    later = full[beyond[-1]]
    assert later.bf16 and later.compiled and later.batch_size >= lab.config.big_batch
    # a reference of another config is not a guess for this one
    other = read_run(reference_run(framework="torch") / "torch.json")
    assert ahead.expected_recipes(lab, RUNGS, NAMES, other, compiles=compiles) == full


def test_the_committed_runs_are_the_reference_and_every_readable_run_of_the_framework(full_lab):
    reference, history = ahead.committed_runs(full_lab)
    assert reference.framework == "torch" and reference.created in {r.created for r in history}
    assert len(history) > 1 and all(r.framework == "torch" for r in history)


def test_the_summary_line_says_what_compiled_where_and_what_failed():
    report = {"steps": 3, "compiled": ["R2", "B3"], "workers": 1, "seconds": 12.4,
              "failed": {"B4": "RuntimeError: no cuDNN"}, "already_cached": 1}
    line = ahead.summary(report, "programs", "helper processes", "then")
    assert line == ("compiled ahead: 2 of 3 expected programs in 1 helper process, 12 s before the "
                    "first rung (then); 1 of them was in the cache already; not compiled ahead: B4 "
                    "(B4: RuntimeError: no cuDNN)")
    assert "in 2 threads" in ahead.summary({**report, "workers": 2}, "programs", "threads", "then")
    assert "; 2 of them were in the cache" in ahead.summary({**report, "already_cached": 2}, "x", "y", "z")
    assert ahead.summary({**report, "steps": 0}, "x", "y", "z") == ("compiled ahead: nothing (no "
                                                                   "compiled step expected)")


def test_rungs_added_after_the_reference_ran_are_guessed_on_top_of_what_it_kept(full_lab, kept_b9):
    """A rung the run does not list (added to the ladder since) is still compiled ahead:
    built on the run's last kept step, and kept or not for the rungs after it as most
    other runs of the ladder that measured it went (as if kept where none did)."""
    ref = copy.deepcopy(kept_b9)
    last_kept = next(r for r in reversed(ref.rungs) if r.stage == "beyond" and r.kept)
    later = [n for n in NAMES if NAMES.index(n) > NAMES.index(last_kept.name)
             and RUNGS[n].stage == "beyond"]
    ref.rungs = [r for r in ref.rungs if r.name not in later]
    graphs, after = next((g, a) for g, a in zip(later, later[1:])
                         if RUNGS[g].change(full_lab.recipe_from_dict(last_kept.recipe),
                                            full_lab.config).cudagraphs)
    alone = ahead.expected_recipes(full_lab, RUNGS, NAMES, ref, [ref], compiles=lambda r: True)
    base = full_lab.recipe_from_dict(last_kept.recipe)
    assert set(later) <= set(alone)
    assert alone[graphs] == RUNGS[graphs].change(base, full_lab.config)
    assert alone[after].cudagraphs                  # no run measured the CUDA-graph rung: kept

    def measured(kept_graphs):
        run = copy.deepcopy(kept_b9)
        run.created = f"with-{kept_graphs}"
        extra = copy.deepcopy(last_kept)
        extra.name, extra.kept = graphs, kept_graphs
        run.rungs = [*[r for r in run.rungs if r.name not in later], extra]
        return run
    history = [ref, measured(False), measured(False), measured(True)]
    assert ahead.newer_rungs(full_lab, ref, history) == {graphs: False}
    got = ahead.expected_recipes(full_lab, RUNGS, NAMES, ref, history, compiles=lambda r: True)
    assert not got[after].cudagraphs                # most runs did not keep it: built past it
    assert got[after] == RUNGS[after].change(base, full_lab.config)
    # the guess never takes a rung that another ladder (config) measured for a vote
    other = measured(True)
    other.config = {**other.config, "name": "smoke"}
    assert ahead.newer_rungs(full_lab, ref, [other]) == {}


def test_a_run_of_fewer_rungs_is_guessed_as_it_will_build_them(full_lab, kept_b9):
    """``--rungs`` without a rung the run kept: the later steps are guessed without its
    change, as the run builds them, not as the run measured them (with it)."""
    assert kept_b9.rung("B9").kept and "gelu" in kept_b9.rung("B12").recipe["fused"]
    names = [n for n in NAMES if n != "B9"]
    got = ahead.expected_recipes(full_lab, RUNGS, names, kept_b9, [kept_b9], compiles=compiles)
    assert "B9" not in got and "gelu" not in got["B12"].fused
    assert got["B12"] == RUNGS["B12"].change(got["B8"], full_lab.config)
