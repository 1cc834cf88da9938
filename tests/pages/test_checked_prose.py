"""The ladder pages' prose against the runs they show: every number in it is a glue key the page
computes, every qualitative claim is a check that holds on the committed reference run, and a
run that contradicts a claim gets it marked in place, with the evidence, not printed as fact."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from perfladder.pages.chapter import checks_for, numbers_for
from perfladder.pages.story import NOT_SUPPORTED, Check, glue_values, verdict
from perfladder.results.committed import read_run, reference_run

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"torch": "01_pytorch_ladder.ipynb", "jax": "02_jax_ladder.ipynb"}
GLUE = re.compile(r"\{glue:md\}`([^`]+)`")


def used_keys(framework: str) -> set[str]:
    nb = json.loads((ROOT / "notebooks" / PAGES[framework]).read_text())
    return {k for c in nb["cells"] if c["cell_type"] == "markdown" for k in GLUE.findall("".join(c["source"]))}


def reference(framework: str):
    return read_run(reference_run(ROOT, framework=framework) / f"{framework}.json")


@pytest.mark.parametrize("framework", PAGES)
def test_every_inserted_number_and_claim_exists(framework):
    values = glue_values(reference(framework), checks_for(framework), numbers_for(framework))
    missing = used_keys(framework) - set(values)
    assert not missing, f"{PAGES[framework]} uses glue keys the page never computes: {sorted(missing)}"


@pytest.mark.parametrize("framework", PAGES)
def test_every_check_is_placed_in_the_prose(framework):
    orphans = {c.key for c in checks_for(framework)} - used_keys(framework)
    assert not orphans, f"checks that no sentence of {PAGES[framework]} carries: {sorted(orphans)}"


@pytest.mark.parametrize("framework", PAGES)
def test_the_reference_run_supports_every_claim(framework):
    ref = reference(framework)
    wrong = {c.key: c.judge(ref)[1] for c in checks_for(framework) if not c.judge(ref)[0]}
    assert not wrong, f"the reference run contradicts these claims of {PAGES[framework]}: {wrong}"


def test_a_contradicted_claim_is_marked_with_its_evidence():
    ref = reference("torch")
    r2 = ref.rung("R2")
    planted = copy.deepcopy(ref)
    faster = planted.rung("R2")
    gain = 1.5 * ref.rung("R1").tokens_per_s / r2.tokens_per_s       # bf16 suddenly pays 1.5x R1
    faster.timing.windows = [w * gain for w in r2.timing.windows]
    faster.tokens_per_s = r2.tokens_per_s * gain
    planted.finalize()
    check = next(c for c in checks_for("torch") if c.key == "c_R2_slower")
    assert check.marker(ref) == ""
    mark = check.marker(planted)
    assert NOT_SUPPORTED in mark and "R2" in mark and "faster" in mark


def test_a_claim_about_a_rung_the_run_lacks_is_marked_not_raised():
    ref = reference("jax")
    c = Check("c_x", "B99 pays", verdict("B99", "faster"))
    holds, why = c.judge(ref)
    assert not holds and "cannot be judged" in why and "B99" in why


def test_glue_values_refuse_a_check_named_like_a_number():
    with pytest.raises(ValueError, match="R2_rate"):
        glue_values(reference("torch"), [Check("R2_rate", "x", verdict("R2", "slower"))])


def test_a_compile_the_run_did_not_record_is_not_printed_as_seconds():
    """A run that compiled inside its gates, before the timed first call, and wrote no
    compilation count (PyTorch runs before the count was recorded): its page must not read that
    first call (hundredths of a second) as the compile time; a run that recorded its compiles
    shows their seconds."""
    from perfladder.pages import cards
    from perfladder.pages.claims import compile_recorded
    for framework in PAGES:
        ref = reference(framework)
        r1 = ref.rung("R1")
        assert compile_recorded(r1) and r1.compile.compilations
        values = glue_values(ref, checks_for(framework), numbers_for(framework))
        assert values["R1_first_call"] == f"{r1.compile.first_call_s:.1f} s"
        old = copy.deepcopy(ref)
        old.rung("R1").compile.compilations = None
        old.rung("R1").compile.first_call_s = 0.015                    # the timed call after the gates
        assert not compile_recorded(old.rung("R1"))
        values = glue_values(old, checks_for(framework), numbers_for(framework))
        assert values["R1_first_call"] == "not recorded in this run"
        assert "first call not recorded in this run" in cards.rung_text(old, "R1")
        assert compile_recorded(ref.rung("R0"))                        # eager: nothing to record


@pytest.mark.parametrize("framework", PAGES)
def test_an_inserted_ratio_says_what_the_card_beside_it_credits(framework):
    """The prose's ``<rung>_ratio`` credits what the card beside it credits (the one credit rule,
    ``verdict.credit``): the ratio where one may be printed, else that none is credited, never
    a bound or the bare ratio of two medians."""
    from perfladder.pages.claims import call
    ref = reference(framework)
    values = glue_values(ref, checks_for(framework), numbers_for(framework))
    unsettled = 0
    for r in ref.rungs:
        c = call(ref, r)
        if not r.measured or r.builds_on is None:
            continue
        said = values[f"{r.name}_ratio"]
        assert "at least" not in said, (r.name, said)
        if c.ratio is None:
            unsettled += 1
            assert said.startswith("no ratio credited"), (r.name, said)
    if framework == "jax":
        assert unsettled >= 2       # R1 and R3 in the committed reference


def test_the_roofline_reading_follows_the_kernel_report():
    from perfladder.pages.story import largest_gap, roofline_of
    ref = reference("torch")
    kb = next(r for r in ref.rungs if r.kernels).kernels
    rows = {row["group"]: row for row in kb["roofline"]["rows"]}
    assert roofline_of(None, "time_ms")(ref) == f"{kb['roofline']['time_ms']:.1f} ms"
    assert roofline_of("attention", "floor_ms")(ref) == f"{rows['attention']['floor_ms']:.1f} ms"
    holds, why = largest_gap("attention")(ref)
    assert holds and "attention" in why
    planted = copy.deepcopy(ref)
    for row in next(r for r in planted.rungs if r.kernels).kernels["roofline"]["rows"]:
        if row["group"] == "matmul":
            row["above_ms"] = rows["attention"]["above_ms"] + 1.0       # the matmuls fall further behind
    holds, why = largest_gap("attention")(planted)
    assert not holds and "matmul" in why
    bare = copy.deepcopy(ref)
    for r in bare.rungs:
        r.kernels = None
    check = Check("c_x", "attention stands furthest above its floor", largest_gap("attention"))
    assert not check.judge(bare)[0] and "cannot be judged" in check.judge(bare)[1]


COMMITTED = sorted(p for fw in PAGES for p in (ROOT / "benchmarks" / "results").glob(f"*/{fw}.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_prose_reads_every_committed_run(path):
    """A GPU build's page reads its own run, whatever wandered in it: every claim is decided
    (held or marked) and every number computed, on each committed run of the framework."""
    run, framework = read_run(path), path.stem
    values = glue_values(run, checks_for(framework), numbers_for(framework))
    assert {c.key for c in checks_for(framework)} <= set(values)
    assert all(isinstance(c.judge(run)[0], bool) for c in checks_for(framework))


def test_a_small_change_is_judged_by_size_and_the_keep_is_said_as_the_ladder_did():
    """'The rate barely moves' holds within 3% either way, whatever the noise verdict, and is
    marked past it; what the ladder did with the rung is said from its own record."""
    from perfladder.pages.story import keep_words, small_change
    ref = reference("jax")
    b3, b1 = ref.rung("B3"), ref.rung("B1")
    assert small_change("B3", 0.03)(ref)[0] == (abs(b3.tokens_per_s / b1.tokens_per_s - 1) <= 0.03)
    planted = copy.deepcopy(ref)
    gain = 1.10 * b1.tokens_per_s / b3.tokens_per_s
    r = planted.rung("B3")
    r.timing.windows = [w * gain for w in b3.timing.windows]
    r.tokens_per_s = b3.tokens_per_s * gain
    holds, why = small_change("B3", 0.03)(planted)
    assert not holds and "1.10x B1" in why
    r.kept = True
    assert "keeps B3 and builds on it" in keep_words("B3")(planted)
    r.kept = False
    r.tokens_per_s = b1.tokens_per_s
    r.timing.windows = list(b1.timing.windows)
    planted.finalize()
    said = keep_words("B3")(planted)
    assert "goes on from B1" in said and "keeps" not in said
