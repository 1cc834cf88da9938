"""perfladder.ahead's one door, ``before_first_rung``: the book build's report when there is one,
else the framework side's own compile-ahead when asked or by its default; and the old import
paths of the annex's names, which stay importable."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import perfladder.ahead as door


class _Lab:
    """What the door reads of a lab."""
    framework = "torch"

    def __init__(self, config="full"):
        self.config = SimpleNamespace(name=config)
        self.result = SimpleNamespace(ahead=None, notes=[])


@pytest.fixture
def fake_side(monkeypatch):
    """A framework side that records each compile-ahead asked of it; its default: ``on``."""
    side = SimpleNamespace(asked=[], on=True)
    side.by_default = lambda lab: side.on
    side.ladder_ahead = lambda lab, rungs, names: side.asked.append(names) or {"mine": True}
    side.summary = lambda r: f"{len(r.get('compiled', []))} steps" if "compiled" in r else "here"
    monkeypatch.setattr(door, "side", lambda framework: side)
    return side


def test_a_book_builds_report_is_taken_and_nothing_compiles_here(tmp_path, monkeypatch, capsys, fake_side):
    report = {"steps": 2, "compiled": ["R2", "B3"], "seconds": 80.0, "failed": {}, "config": "full"}
    (tmp_path / "torch.json").write_text(json.dumps(report))
    monkeypatch.setenv(door.AHEAD_DIR_ENV, str(tmp_path))
    lab = _Lab()
    door.before_first_rung(lab, {}, ["R2"], None)
    assert fake_side.asked == [] and lab.result.ahead["compiled"] == ["R2", "B3"]
    assert lab.result.notes == [f"2 steps; compiled {lab.result.ahead['by']}"]
    assert "by the book build" in lab.result.ahead["by"] and "2 steps" in capsys.readouterr().out
    # another config's report, or none at all: the side's own default decides
    for lab, folder in [(_Lab("smoke"), tmp_path), (_Lab(), tmp_path / "absent")]:
        monkeypatch.setenv(door.AHEAD_DIR_ENV, str(folder))
        door.before_first_rung(lab, {}, ["R2"], None)
        assert lab.result.ahead == {"mine": True} and lab.result.notes == ["here"]
    assert fake_side.asked == [["R2"], ["R2"]]
    fake_side.on, lab = False, _Lab()
    door.before_first_rung(lab, {}, ["R2"], None)                     # default off: nothing
    assert len(fake_side.asked) == 2 and lab.result.ahead is None
    door.before_first_rung(lab, {}, ["R2"], True)                     # asked: compiled here
    assert len(fake_side.asked) == 3 and lab.result.ahead == {"mine": True}
    lab = _Lab()
    monkeypatch.setenv(door.AHEAD_DIR_ENV, str(tmp_path))
    door.before_first_rung(lab, {}, ["R2"], False)                    # off: not even the build's
    assert len(fake_side.asked) == 3 and lab.result.ahead is None


def test_each_side_says_its_default():
    full = SimpleNamespace(config=SimpleNamespace(is_smoke=False), on_gpu=True)
    smoke = SimpleNamespace(config=SimpleNamespace(is_smoke=True), on_gpu=True)
    torch_side = door.side("torch")
    assert torch_side.by_default(full) and not torch_side.by_default(smoke)
    assert not torch_side.by_default(SimpleNamespace(config=full.config, on_gpu=False))
    assert door.side("jax").by_default(full) is False      # measured slower in a notebook


@pytest.mark.parametrize("old, new", [
    ("perfladder.torch.ahead", "perfladder.ahead.torch"),
    ("perfladder.jax.ahead", "perfladder.ahead.jax"),
    ("perfladder.book.ahead", "perfladder.ahead.book"),
    ("perfladder.ladder.expected", "perfladder.ahead.expected"),
])
def test_the_annexs_old_import_paths_hand_on_the_same_names(old, new):
    import importlib
    was, now = importlib.import_module(old), importlib.import_module(new)
    names = [n for n in vars(was) if not n.startswith("_") and n not in ("sys", "annotations")]
    assert len(names) >= 5
    for n in names:
        assert getattr(was, n) is getattr(now, n, None) or getattr(was, n) is getattr(door, n), n
