"""``perfladder run --resume``: what failed is retried, what is final is kept, and the rungs that
built on the failure are run again on the retried one (``perfladder.ladder.rerun``), through
the real CLI on ``tests/_fake_ladder.py``. Each test checks what the results file then holds."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from perfladder.cli import main
from perfladder.results.record import LadderResult

HERE = Path(__file__).resolve().parent


@pytest.fixture
def fake(monkeypatch):
    sys.path.insert(0, str(HERE))
    import _fake_ladder
    monkeypatch.setitem(sys.modules, "perfladder.torch", _fake_ladder.module())
    return _fake_ladder


def run(tmp_path, *extra):
    return main(["run", "torch", "--config", "smoke", "--quiet", "--out", str(tmp_path / "r.json"),
                 "--png", str(tmp_path / "r.png"), *extra])


def test_resume_retries_the_failed_rung_and_reruns_what_built_on_it(tmp_path, fake, monkeypatch, capsys):
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    monkeypatch.setenv("FAKE_FAIL", "R1")
    run(tmp_path)
    first = LadderResult.read(tmp_path / "r.json")
    assert [(r.name, r.measured) for r in first.rungs] == [("R0", True), ("R1", False), ("R2", True),
                                                           ("R3", True)]
    assert "No space left on device" in first.rung("R1").error
    capsys.readouterr()
    calls.unlink()
    monkeypatch.delenv("FAKE_FAIL")                              # the fault is gone
    assert run(tmp_path, "--resume", str(tmp_path / "r.json"), "--overwrite") == 0
    err = capsys.readouterr().err
    assert ("perfladder: torch: retrying R1, which failed with OSError: [Errno 28] No space left on "
            "device (planted)\n") in err
    assert "re-running R2, which was built on an earlier version of R1" in err
    assert calls.read_text().split() == ["R1", "R2", "R3"]      # R0, measured, is kept
    data = json.loads((tmp_path / "r.json").read_text())
    rungs = {r["name"]: r for r in data["rungs"]}
    assert [r["name"] for r in data["rungs"]] == ["R0", "R1", "R2", "R3"]
    assert all(r["outcome"] == "measured" and r["built_on_earlier"] == [] for r in data["rungs"])
    assert rungs["R1"]["replaces"]["outcome"] == first.rung("R1").result_kind
    assert rungs["R2"]["replaces"]["tokens_per_s"] == first.rung("R2").tokens_per_s
    assert rungs["R0"]["replaces"] is None                         # kept, not run again
    r1, r2 = rungs["R1"]["tokens_per_s"], rungs["R2"]["tokens_per_s"]
    assert rungs["R2"]["ratio_prev"] == pytest.approx(r2 / r1)     # against the retried R1


def test_resume_of_a_complete_file_runs_no_rung(tmp_path, fake, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    run(tmp_path)
    before = [r.to_dict() for r in LadderResult.read(tmp_path / "r.json").rungs]
    calls.unlink()
    assert run(tmp_path, "--resume", str(tmp_path / "r.json"), "--overwrite") == 0
    assert not calls.exists()
    assert [r.to_dict() for r in LadderResult.read(tmp_path / "r.json").rungs] == before


def test_a_rung_that_fails_again_stays_failed_and_keeps_what_it_replaced(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "R3")
    run(tmp_path)
    run(tmp_path, "--resume", str(tmp_path / "r.json"), "--overwrite")
    r3 = LadderResult.read(tmp_path / "r.json").rung("R3")
    assert not r3.measured and r3.replaces["outcome"] == r3.result_kind and not r3.final
