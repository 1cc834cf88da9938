"""perfladder.results.committed: the committed runs, read the one way every page reads them."""
from __future__ import annotations

import json

import pytest
from _ladders import H200, ROOT

from perfladder.results.committed import (
    committed_runs,
    complete_on_their_cards,
    complete_runs,
    earlier_ladder,
    how_chosen,
    multi_gpu_run,
    read_run,
    reference_run,
)


def test_the_committed_pointer_states_a_rule_and_the_rule_picks_the_newest_complete_run():
    text = (ROOT / "benchmarks/results/reference.txt").read_text()
    assert "rule newest-complete" in text and "card H200" in text
    for fw in ("torch", "jax"):
        runs, complete = committed_runs(ROOT, fw), complete_runs(ROOT, fw, "H200")
        assert set(complete) < set(runs)                 # earlier ladders are evidence, not shown
        assert reference_run(ROOT, fw) == complete[-1].folder
        assert all(run.created <= complete[-1].created for run in complete)
        assert all("H200" in run.device for run in complete)
        assert all(json.loads(run.path.read_text())["config"]["name"] == "full" for run in runs)
        assert "newest complete run" in how_chosen(ROOT, fw) and "(H200)" in how_chosen(ROOT, fw)
        # every complete run on its own card is complete against that card's newest ladder
        assert set(complete) <= set(complete_on_their_cards(ROOT, fw))


def test_a_card_keeps_the_rule_to_the_reference_machine(tmp_path):
    pointer = tmp_path / "benchmarks" / "results"
    rungs = [{"name": "R0", "key": "eager"}, {"name": "R1", "key": "compile"}, {"name": "B9", "key": "x"}]
    for name, created, device, n in (("h200-old", "2026-01-01", "NVIDIA H200", 2),
                                     ("h200-new", "2026-02-01", "NVIDIA H200", 2),
                                     ("h100-newest", "2026-03-01", "NVIDIA H100 80GB HBM3", 3)):
        (pointer / name).mkdir(parents=True)
        (pointer / name / "torch.json").write_text(json.dumps(
            {"schema_version": 2, "config": {"name": "full"}, "created": created, "device": device,
             "rungs": rungs[:n], "learning": {}}))
    (pointer / "reference.txt").write_text("rule newest-complete\n")
    assert reference_run(tmp_path, "torch").name == "h100-newest"    # the newest ladder, any card
    (pointer / "reference.txt").write_text("rule newest-complete\ncard H200\n")
    assert reference_run(tmp_path, "torch").name == "h200-new"       # the newest H200 ladder
    assert "(H200)" in how_chosen(tmp_path, "torch")
    assert [r.name for r in complete_runs(tmp_path, "torch")] == ["h100-newest"]
    assert [r.name for r in complete_on_their_cards(tmp_path, "torch")] == ["h200-old", "h200-new", "h100-newest"]
    (pointer / "reference.txt").write_text("rule newest-complete\ncard RTX 4090\n")
    with pytest.raises(ValueError, match=r"no complete committed torch run on a card named 'RTX 4090' "
                                         r"\(the committed runs' cards: NVIDIA H100 80GB HBM3, NVIDIA H200\)"):
        reference_run(tmp_path, "torch")
    (pointer / "reference.txt").write_text("h200-old\ncard H200\n")
    with pytest.raises(ValueError, match="names a card \\(H200\\) but no rule"):
        reference_run(tmp_path, "torch")


def test_a_committed_file_rewritten_is_read_anew(tmp_path):
    """committed_runs reads each file once for each text it holds: a file rewritten in place
    (another date, a capped run) is summarised from what it holds now."""
    folder = tmp_path / "benchmarks" / "results" / "run"
    folder.mkdir(parents=True)
    path = folder / "torch.json"

    def write(created, **more):
        path.write_text(json.dumps({"schema_version": 2, "config": {"name": "full"}, "created": created,
                                    "rungs": [{"name": "R0", "key": "eager"}], "learning": {}, **more}))
    write("2026-01-01")
    assert [r.created for r in committed_runs(tmp_path)] == ["2026-01-01"]
    assert [r.created for r in committed_runs(tmp_path)] == ["2026-01-01"]
    write("2026-02-02")
    assert [r.created for r in committed_runs(tmp_path)] == ["2026-02-02"]
    write("2026-02-02", memory_cap_gib=24)
    assert committed_runs(tmp_path) == []
    path.write_text("{not json")
    assert committed_runs(tmp_path) == []


def test_a_rule_and_folders_in_the_pointer(tmp_path):
    pointer = tmp_path / "benchmarks" / "results"
    for name, created, learned in (("old", "2026-01-01", True), ("new", "2026-02-01", True),
                                   ("newer-partial", "2026-03-01", False)):
        (pointer / name).mkdir(parents=True)
        rungs = [{"name": "R0", "key": "eager"}, {"name": "R1", "key": "compile"}]
        (pointer / name / "torch.json").write_text(json.dumps(
            {"schema_version": 2, "config": {"name": "full"}, "created": created,
             "rungs": rungs[:2 if learned else 1], "learning": {} if learned else None}))
    (pointer / "smoke").mkdir()
    (pointer / "smoke" / "torch.json").write_text(json.dumps(
        {"schema_version": 2, "config": {"name": "smoke"}, "created": "2026-04-01", "rungs": [],
         "learning": {}}))
    (pointer / "reference.txt").write_text("# the rule\nrule newest-complete\n")
    assert [r.name for r in committed_runs(tmp_path)] == ["old", "new", "newer-partial"]
    assert reference_run(tmp_path, "torch").name == "new"
    (pointer / "reference.txt").write_text("rule newest-complete\ntorch old\n")
    assert reference_run(tmp_path, "torch").name == "old" and "named in" in how_chosen(tmp_path, "torch")
    (pointer / "reference.txt").write_text("rule newest\n")
    with pytest.raises(ValueError, match="rule 'newest' is not valid; valid choices: newest-complete"):
        reference_run(tmp_path, "torch")
    (pointer / "reference.txt").write_text("rule newest-complete\nold\n")
    with pytest.raises(ValueError, match="keep one"):
        reference_run(tmp_path, "torch")


def test_reference_run_reads_the_committed_pointer(tmp_path):
    for fw in ("torch", "jax"):
        assert (reference_run(framework=fw) / f"{fw}.json").is_file()
    pointer = tmp_path / "benchmarks" / "results"
    (pointer / "run-a").mkdir(parents=True)
    (pointer / "reference.txt").write_text("# comment\n\nrun-b\n")
    with pytest.raises(ValueError, match=r"names 'run-b', which is not a run folder; valid choices: run-a"):
        reference_run(tmp_path)
    (pointer / "reference.txt").write_text("run-a\n")
    assert reference_run(tmp_path) == pointer / "run-a"
    # one framework can move to a newer run: its own line wins, the other takes the default
    (pointer / "run-c").mkdir()
    (pointer / "reference.txt").write_text("run-a\njax run-c\n")
    assert reference_run(tmp_path, "jax").name == "run-c" and reference_run(tmp_path, "torch").name == "run-a"
    assert reference_run(tmp_path).name == "run-a"
    (pointer / "reference.txt").write_text("jax run-c\n")
    with pytest.raises(ValueError, match="names no run folder for torch"):
        reference_run(tmp_path, "torch")
    with pytest.raises(ValueError,
                       match=r"framework='mxnet' is not valid; valid choices: \('torch', 'jax'\)"):
        reference_run(tmp_path, "mxnet")
    (pointer / "reference.txt").write_text("numpy run-c\n")
    with pytest.raises(ValueError,
                       match=r"line 'numpy run-c' is not 'rule NAME', 'card NAME', 'FOLDER' or 'FRAMEWORK FOLDER'"):
        reference_run(tmp_path, "jax")
    (pointer / "reference.txt").unlink()
    with pytest.raises(FileNotFoundError, match="reference.txt is missing"):
        reference_run(tmp_path)


def test_read_run_takes_roofs_from_the_same_runs_probe(tmp_path):
    r = read_run(H200 / "jax.json")
    assert r.roofs["matmul_bf16_tflops"] == pytest.approx(785.73, abs=0.01)
    lone = tmp_path / "jax.json"
    lone.write_text((H200 / "jax.json").read_text())
    assert read_run(lone).roofs is None


def test_read_run_rereads_kernel_reports_once_and_a_plain_read_keeps_them(tmp_path):
    """``LadderResult.read`` gives the file as written; ``read_run`` the same run with its kernel
    reports read by today's taxonomy, and ``finalize`` (every ``add``) leaves them alone."""
    import json

    from perfladder.results.record import LadderResult
    path = tmp_path / "torch.json"
    data = json.loads((ROOT / "benchmarks/results/h200x2-book/torch.json").read_text())
    with_kernels = [r for r in data["rungs"] if r.get("kernels")]
    assert with_kernels
    kb = with_kernels[0]["kernels"]
    moved = next(k for k in kb["top"] if k["category"] != "other")
    kb["category_us"][moved["category"]] -= moved["total_us"]     # as an older taxonomy sorted it
    kb["category_us"]["other"] += moved["total_us"]
    moved["category"] = "other"
    path.write_text(json.dumps(data))
    plain = LadderResult.read(path)
    stored = plain.rung(with_kernels[0]["name"]).kernels
    assert stored["category_us"] == kb["category_us"]
    assert plain.finalize().rung(with_kernels[0]["name"]).kernels is stored
    reread = read_run(path).rung(with_kernels[0]["name"]).kernels
    assert reread["category_us"]["other"] < kb["category_us"]["other"]


def test_multi_gpu_run_is_the_committed_r5_or_nothing(tmp_path):
    r5 = multi_gpu_run()
    assert r5 is not None and r5["measurements"] and "torch:seed" in r5["baselines"]
    assert multi_gpu_run(tmp_path) is None
    (tmp_path / "r5.json").write_text("{not json")
    assert multi_gpu_run(tmp_path) is None


def test_a_run_held_to_a_memory_cap_is_no_evidence_of_speed():
    """A committed run under a memory cap (which rungs fit a 24 GiB card, its GPU shared with the
    other ladder) is a results file like any other, but not among the runs the claims are
    checked against and the strips drawn from."""
    capped = [p for p in (ROOT / "benchmarks" / "results").glob("*/torch.json")
              if json.loads(p.read_text()).get("memory_cap_gib") is not None]
    assert capped                                              # there is one to leave out
    paths = {run.path for run in committed_runs(ROOT, "torch")}
    assert paths and not paths & set(capped)


def test_a_rung_added_to_the_ladder_keeps_the_runs_before_it_as_evidence_of_the_ladder_before(tmp_path):
    """``complete_on_their_cards(earlier=True)``: the runs complete against the ladder before
    today's (``earlier_ladder``: the newest run with a learning check that lacks a rung of
    today's) stay, beside today's complete runs; a run of an older ladder still (fewer rungs)
    and one without its learning check do not."""
    pointer = tmp_path / "benchmarks" / "results"
    rungs = [{"name": n, "key": n.lower()} for n in ("R0", "R1", "B1", "B2")]
    for name, created, n, learned in (("oldest", "2026-01-01", 2, True), ("before", "2026-02-01", 3, True),
                                      ("before-unlearned", "2026-02-02", 3, False),
                                      ("today", "2026-03-01", 4, True)):
        (pointer / name).mkdir(parents=True)
        (pointer / name / "torch.json").write_text(json.dumps(
            {"schema_version": 2, "config": {"name": "full"}, "created": created, "device": "NVIDIA H200",
             "rungs": rungs[:n], **({"learning": {}} if learned else {})}))
    runs = committed_runs(tmp_path, "torch")
    assert [n for n, _ in earlier_ladder(runs)] == ["R0", "R1", "B1"]
    assert [r.name for r in complete_on_their_cards(tmp_path, "torch")] == ["today"]
    assert [r.name for r in complete_on_their_cards(tmp_path, "torch", earlier=True)] == ["before", "today"]
    assert earlier_ladder([r for r in runs if r.name == "today"]) == ()
