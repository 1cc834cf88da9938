"""perfladder.compile_cache, framework-free: what can take a compile cache (a full disk made at
the write point, a disk with too little room), setting a folder aside (moved whole, never
deleted), and each line said once and kept in the run's notes."""
from __future__ import annotations

import shutil
from collections import namedtuple

import pytest
from _full_disk import install

from perfladder import compile_cache


@pytest.fixture(autouse=True)
def fresh_run():
    compile_cache.begin()
    yield
    compile_cache.begin()


def test_a_folder_that_can_take_a_cache(tmp_path):
    assert compile_cache.unwritable(tmp_path / "new" / "cache") is None
    assert list((tmp_path / "new" / "cache").iterdir()) == []        # its probe is gone


def test_a_full_disk_and_a_small_one_cannot(tmp_path, monkeypatch):
    full, small = tmp_path / "full", tmp_path / "small"
    with monkeypatch.context() as m:
        install([full], patch=m.setattr)
        assert compile_cache.unwritable(full) == "No space left on device"
    usage = namedtuple("usage", "total used free")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: usage(2**20, 0, 2**20) if str(p).startswith(str(small)) else real(p))
    assert compile_cache.unwritable(small).startswith("too little room")
    assert compile_cache.free_words(small) == "1.0 MiB free"
    assert [p.name for p in small.iterdir()] == []


def test_a_folder_set_aside_is_moved_whole_and_an_empty_one_takes_its_place(tmp_path):
    cache = tmp_path / "cache"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "kernel.py").write_text("cut sh")
    first = compile_cache.set_aside(cache)
    (cache / "again").write_text("x")
    second = compile_cache.set_aside(cache)                 # the same second: another name
    assert first != second and first.parent == second.parent == tmp_path
    assert (first / "ab" / "kernel.py").read_text() == "cut sh"
    assert [p.name for p in second.iterdir()] == ["again"]
    assert cache.is_dir() and list(cache.iterdir()) == []


def test_each_line_is_said_once_and_kept_in_the_notes_of_the_run(capsys):
    compile_cache.tell("cache X turned off", key="off")          # before the run's notes exist
    notes = []
    compile_cache.listen(notes.append)
    assert compile_cache.tell("cache X turned off again", key="off") is False
    assert compile_cache.tell("cache Y set aside") is True
    assert notes == ["cache X turned off", "cache Y set aside"]
    assert capsys.readouterr().err.splitlines() == ["perfladder: cache X turned off",
                                                    "perfladder: cache Y set aside"]
    compile_cache.begin()                                         # a new run says it again
    compile_cache.listen(notes.append)
    assert compile_cache.tell("cache X turned off", key="off") is True
