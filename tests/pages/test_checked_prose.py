"""The book's prose against the runs it describes: no number typed in any page's prose and no
claim sentence without a check (``perfladder.pages.prose``); every number of a ladder page a glue
key the page computes; every check of a ladder page holding on every complete committed run, not
only the one shown; a run that contradicts a claim getting the mark in the rendered page; the
batch-64 passages printed in the version the run's evidence supports, on the chapter's RTX 4090
run and on every H200 run alike."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from perfladder.pages import prose
from perfladder.pages.chapter import checks_for, numbers_for
from perfladder.pages.chapter.machine import Story
from perfladder.pages.chapter.seed_run import SEED_PACE, seed_shaped_run
from perfladder.pages.story import NOT_SUPPORTED, Check, glue_values, pays, verdict
from perfladder.results.committed import committed_runs, complete_on_their_cards, read_run, reference_run

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"torch": "01_pytorch_ladder.ipynb", "jax": "02_jax_ladder.ipynb"}
GLUE = re.compile(r"\{glue:md\}`([^`]+)`")
# every page whose prose the book prints (the exercises page is code with a few words around it)
PROSE = ["notebooks/01_pytorch_ladder.ipynb", "notebooks/02_jax_ladder.ipynb",
         "notebooks/03_comparison.ipynb", "notebooks/05_scaling.ipynb",
         "chapter13/index.md", "chapter13/case_study.md"]


def markdown_of(page: str) -> list[str]:
    """The page's prose: a notebook's markdown cells, or a text page."""
    path = ROOT / page
    if path.suffix != ".ipynb":
        return [path.read_text()]
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def used_keys(framework: str) -> set[str]:
    return {k for text in markdown_of(f"notebooks/{PAGES[framework]}") for k in GLUE.findall(text)}


def rendered(framework: str, run) -> str:
    """The ladder page's prose as the book prints it for ``run``."""
    values = glue_values(run, checks_for(framework), numbers_for(framework))
    return "\n\n".join(prose.render(t, values) for t in markdown_of(f"notebooks/{PAGES[framework]}"))


def stories(framework: str) -> list[Story]:
    return [v for v in numbers_for(framework).values() if isinstance(v, Story)]


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


COMPLETE = [(fw, run.path, run in complete_on_their_cards(ROOT, fw))
            for fw in PAGES for run in complete_on_their_cards(ROOT, fw, earlier=True)]


@pytest.mark.parametrize(("framework", "path", "today"), COMPLETE,
                         ids=lambda v: getattr(v, "parent", Path(str(v))).name)
def test_every_complete_committed_run_supports_every_claim(framework, path, today):
    """A claim of a ladder page holds on every complete committed run (every rung of today's
    ladder and its learning check), not only on the one shown: a claim true of one run only is
    a test failure, not a reader's discovery. A run complete against the ladder before today's
    contradicts no claim with a settled measurement: a claim on a rung added since is one it
    cannot judge, and one on a rung it measured unsettled one it neither supports nor refutes
    (its page marks both)."""
    run = read_run(path)
    wrong = {c.key: c.judge(run)[1] for c in checks_for(framework) if not c.judge(run)[0]}
    if not today:
        wrong = {k: why for k, why in wrong.items()
                 if not why.startswith("cannot be judged") and "unsettled" not in why}
    assert not wrong, f"{path.parent.name} contradicts these claims of {PAGES[framework]}: {wrong}"


@pytest.mark.parametrize("page", PROSE)
def test_no_page_types_a_number_or_makes_an_unchecked_claim(page):
    found = [str(p) for text in markdown_of(page) for p in prose.problems(text)]
    assert not found, f"{page}:\n" + "\n".join(found)


@pytest.mark.parametrize("framework", PAGES)
def test_no_version_of_a_story_types_a_number_and_every_field_is_computed(framework):
    ref = reference(framework)
    values = glue_values(ref, (), numbers_for(framework))
    for story in stories(framework):
        for text in story.texts():
            assert not prose.story_problems(text), (story.key, prose.story_problems(text))
            text.format_map(values)                      # every {field} is a value the page computes


def test_the_checker_refuses_typed_numbers_and_unchecked_claims_and_reads_marks():
    text = ("The H200 has about four times the RTX 4090's bf16 rate (Section 13.4).\n\n"
            "R2a runs at 1.42x R1, and bf16 pays here.\n\n"
            "bf16 pays here{glue:md}`c_R2_faster`, and R3 runs {glue:md}`R3_ratio` R2.\n\n"
            "% definitional: what a technique does\n\n"
            "A fused kernel is faster when it moves fewer bytes.\n\n"
            "## Next\n\nThe fused kernel is faster.\n\n"
            "```python\nx = 4096  # code is not prose\n```\n\n$$\n6 \\times 512\n$$ (eq)\n\n"
            "The fastest configuration, B14, is kept; its kernels busy {glue:md}`B14_busy` of the step.")
    found = {(p.kind, p.found) for p in prose.problems(text)}
    assert found == {("typed number", "about four times"), ("typed number", "1.42"),
                     ("unchecked claim", "pays"), ("unchecked claim", "faster")}
    unchecked = [p.sentence for p in prose.problems(text) if p.found == "faster"]
    assert unchecked == ["The fused kernel is faster."]
    assert prose.render("R3 runs {glue:md}`R3_ratio` R2.", {"R3_ratio": "3.1x"}) == "R3 runs 3.1x R2."


def test_prose_moved_into_a_fold_is_checked_like_prose_outside_it():
    text = (":::{dropdown} Why R3 is faster\n:open:\n"
            "R3 runs at 1.42x R2, and the batch pays.\n\n"
            "The batch pays{glue:md}`c_R3_faster`.\n\n"
            "```{literalinclude} ../src/x.py\n:pyobject: f\n```\n:::\n\n"
            "% definitional: what a technique does\n\n"
            ":::{note}\nA fused kernel is faster when it moves fewer bytes.\n:::")
    found = {(p.kind, p.found, p.sentence[:12]) for p in prose.problems(text)}
    assert found == {("unchecked claim", "faster", "Why R3 is fa"), ("typed number", "1.42", "R3 runs at 1"),
                     ("unchecked claim", "pays", "R3 runs at 1")}


def plant_slower(run, name: str):
    """``run`` with rung ``name`` measured well below the rung it builds on."""
    planted = copy.deepcopy(run)
    r = planted.rung(name)
    base = planted.rung(r.builds_on)
    loss = 0.7 * base.tokens_per_s / r.tokens_per_s
    r.timing.windows = [w * loss for w in r.timing.windows]
    r.tokens_per_s *= loss
    return planted.finalize()


def test_a_contradicted_claim_is_marked_with_its_evidence_in_the_rendered_page():
    ref = reference("torch")
    check = next(c for c in checks_for("torch") if c.key == "c_B5_faster")
    assert check.marker(ref) == "" and NOT_SUPPORTED not in rendered("torch", ref)
    planted = plant_slower(ref, "B5")
    mark = check.marker(planted)
    assert NOT_SUPPORTED in mark and "B5" in mark and "slower" in mark
    page = rendered("torch", planted)
    assert page.count(NOT_SUPPORTED) >= 1
    sentence = next(ln for ln in page.split("\n\n") if NOT_SUPPORTED in ln)
    assert "Doubling the batch" in sentence and "B5" in sentence


def test_a_committed_run_of_an_earlier_ladder_is_rendered_with_its_marks():
    """A run that does not support every claim (a committed two-GPU build of an earlier ladder,
    without the last kernel rungs) prints each unsupported sentence marked, with its evidence."""
    run = read_run(ROOT / "benchmarks/results/h200x2-book/torch.json")
    failing = [c for c in checks_for("torch") if not c.judge(run)[0]]
    assert failing
    page = rendered("torch", run)
    assert page.count(NOT_SUPPORTED) >= len(failing)
    for c in failing:
        assert c.marker(run) in page


@pytest.mark.parametrize("union", [True, False], ids=["kernels' union recorded", "sums only"])
def test_the_chapters_pace_is_what_its_shaped_run_profiles_say(union):
    """``seed_shaped_run`` puts the chapter's pace on every profile it keeps, whether the template
    run recorded the kernels' busy union and the profiled wall (``busy_ms``, ``wall_ms``: newer
    runs) or only their summed time (older ones): the regime each batch-64 rung reads as is the
    chapter's, never the template's."""
    template = copy.deepcopy(reference("torch"))
    for name in SEED_PACE["torch"]:
        prof = template.rung(name).profile
        prof.busy_ms, prof.wall_ms = (prof.device_ms, 3 * prof.device_ms) if union else (None, None)
    run = seed_shaped_run(template.finalize())
    for name, (pace, _source) in SEED_PACE["torch"].items():
        assert (run.rung(name).regime["regime"] == "host-bound") == (pace == "host"), name


def test_the_chapters_rtx_4090_run_reads_true():
    """The page rendered from a run shaped like the chapter's (its rates, transcribed once in
    ``comparison.CHAPTER``, and the pace its prose reports, ``seed_run.SEED_PACE``) prints the
    chapter's story at batch 64: the device sets the pace of PyTorch's eager, compiled and bf16
    steps, and bf16 pays; JAX's bf16 step waits on the host. Every claim it does not support is
    marked, none printed as fact."""
    for framework, want in (("torch", {"s_R0": 1, "s_R1": 0, "s_R2": 1}), ("jax", {"s_R2": 2})):
        run = seed_shaped_run(reference(framework))
        assert run.device.endswith("RTX 4090")
        assert {s.key: s.version(run) for s in stories(framework)} | want == \
            {s.key: s.version(run) for s in stories(framework)}
        for name, (pace, _source) in SEED_PACE[framework].items():
            assert (run.rung(name).regime["regime"] == "host-bound") == (pace == "host")
        page = rendered(framework, run)
        assert "<missing" not in page
        for c in checks_for(framework):
            assert c.judge(run)[0] or c.marker(run) in page, c.key
    torch = rendered("torch", seed_shaped_run(reference("torch")))
    assert "bf16 pays" in torch and "the host, not the GPU, sets the pace" not in torch
    assert "the GPU, not the host, sets the pace of the eager step" in torch


@pytest.mark.parametrize("framework", PAGES)
def test_every_committed_run_prints_the_story_its_evidence_supports(framework):
    """Each committed run, of any card (complete or of an earlier ladder), has every claim decided and
    every number computed; it picks, for each machine-dependent passage, a version whose test
    holds on it (never a version it contradicts), and the runs between them print more than
    one version of the batch-64 passages: the page is not written for one run."""
    seen, complete = {}, complete_on_their_cards(ROOT, framework)
    for run in committed_runs(ROOT, framework):
        res = read_run(run.path)
        assert all(isinstance(c.judge(res)[0], bool) for c in checks_for(framework))   # decided, never raised
        for story in stories(framework):
            i = story.version(res)
            if i is not None:
                assert story.versions[i][0](res)[0], (run.name, story.key)
            seen.setdefault(story.key, set()).add(i)
        page = rendered(framework, res)
        if run in complete:                  # an earlier ladder lacks later rungs' keys
            assert "<missing" not in page, run.name
        for c in checks_for(framework):
            assert c.judge(res)[0] or c.marker(res) in page, (run.name, c.key)
    assert any(len(v) > 1 for v in seen.values()), seen


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


@pytest.mark.parametrize("framework", PAGES)
def test_the_roofline_paragraph_names_the_group_furthest_above_its_floor(framework):
    """``s_gap`` calls attention the next rung only where attention leads; where another group
    stands further above its floor, by however little, the page names that group and its gap
    instead (a JAX run on an H100 had the LayerNorms 0.07 ms ahead of attention)."""
    ref = reference(framework)
    story = next(s for s in stories(framework) if s.key == "s_gap")
    kb = next(r for r in ref.rungs if r.kernels and r.kernels.get("roofline")).kernels
    rows = {row["group"]: row for row in kb["roofline"]["rows"]}
    assert story.version(ref) == 0 and "a faster attention kernel" in story(ref)
    planted = copy.deepcopy(ref)
    prow = {row["group"]: row for row in next(r for r in planted.rungs if r.kernels
                                              and r.kernels.get("roofline")).kernels["roofline"]["rows"]}
    prow["layernorm/reductions"]["above_ms"] = rows["attention"]["above_ms"] + 0.07
    text = story(planted)
    assert story.version(planted) == 1 and "faster attention kernel" not in text
    assert "the LayerNorms and reductions stand furthest" in text
    assert f"{(rows['attention']['above_ms'] + 0.07):.1f} ms above it" in text
    page = rendered(framework, planted)
    assert text in page and NOT_SUPPORTED not in text


def test_every_roofline_group_has_words_for_the_prose():
    from perfladder.kernels.taxonomy import ROOFLINE_GROUPS
    from perfladder.pages.roofline_story import GROUP_WORDS
    assert set(GROUP_WORDS) == set(ROOFLINE_GROUPS)


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


def test_a_story_prints_the_version_its_run_supports_and_says_which_fields_it_lacks():
    ref = reference("torch")
    story = Story("s_x", ((verdict("R3", "slower"), "R3 loses: {R3_ratio}."),
                          (pays("R3"), "R3 pays: {R3_ratio}.")),
                  "R3: {R3_rate}.", lambda result: glue_values(result, (), {}))
    assert story.version(ref) == 1 and story(ref).startswith("R3 pays: ")
    assert story(plant_slower(ref, "R3")).startswith("R3 loses: ")
    broken = Story("s_y", (), "{R3_nothing}", lambda result: {})
    with pytest.raises(KeyError, match="R3_nothing"):
        broken(ref)


def test_the_text_pages_numbers_are_the_configurations():
    from perfladder.config import expected_num_params
    from perfladder.pages.chapter.text_numbers import text_values
    from perfladder.pages.claims import config_of
    ref = reference("torch")
    cfg = config_of(ref)
    values = text_values(ref)
    assert values["t_params_exact"] == f"{expected_num_params(cfg.gpt()):,}"
    assert values["t_rows"] == f"{cfg.batch_size * cfg.num_steps:,}"
    assert values["t_ffn_shape"] == (f"({cfg.batch_size * cfg.num_steps} × {cfg.num_hiddens}) @ "
                                     f"({cfg.num_hiddens} × {4 * cfg.num_hiddens})")
    parts = [int(values[k].replace(",", "")) for k in ("t_params_block", "t_params_embed", "t_params_norm")]
    assert parts[0] * cfg.num_blks + parts[1] + parts[2] == expected_num_params(cfg.gpt())


def test_the_page_says_which_run_it_shows_and_why():
    from perfladder.pages.chapter.phrases import shown_rule
    ref = reference("torch")
    said = shown_rule("torch")(ref)
    assert f"benchmarks/results/{reference_run(ROOT, 'torch').name}" in said and "newest complete run" in said
    own = copy.deepcopy(ref)
    own.created = "2030-01-01T00:00:00Z"                  # a GPU build's own run, not committed
    assert shown_rule("torch")(own).startswith("this build's own run")


CAPPED = ROOT / "benchmarks/results/h100-capped-24gib-book-2026-12-06"


@pytest.mark.parametrize("framework", PAGES)
def test_a_capped_cards_pages_say_which_rungs_it_could_not_run_not_that_they_contradict(framework):
    """On a card that could not hold some rungs (the committed run capped to 24 GiB), each claim
    about such a rung says it was not checked on this card and why, in a line, never the warning
    of a contradicted claim; the claims about the rungs it ran are judged as on any run."""
    from perfladder.pages.story import CARD_OUTCOMES, NOT_ON_THIS_CARD
    run = read_run(CAPPED / f"{framework}.json")
    off_card = {r.name for r in run.rungs if r.outcome in CARD_OUTCOMES}
    assert "B6" in off_card
    page = rendered(framework, run)
    marked = [c for c in checks_for(framework) if c.marker(run).startswith(f" *[{NOT_ON_THIS_CARD}")]
    assert all(c.marker(run) in page for c in marked)
    assert marked or framework == "torch"     # JAX's page has claims about B7 and B8, which did not fit
    for c in marked:
        assert any(f"{name} did not run here (does not fit" in c.marker(run) for name in off_card), c.key
    for line in page.split("\n\n"):
        if NOT_SUPPORTED in line:
            assert not any(f"{name} was not measured" in line for name in off_card), line
