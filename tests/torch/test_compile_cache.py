"""Inductor's compile cache as a fault source, made for real (``perfladder.torch.compiler``):
a full disk under it, with no other folder to turn to, fails R1 for the machine
(``outcome="failed"``, its cause), and the run says it is incomplete; with room again R1 is
measured, and once every file of its cache is cut short the cache is set aside (moved, not
deleted) and R1 measured again; a missing compiler fails R1 for the machine too. Each case runs
the CLI in its own process, on the smallest ladder that compiles (R1 alone, no learning
check): inductor's cache folder and its in-memory caches are per process."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from perfladder.faults import EXIT_INCOMPLETE
from perfladder.results.record import LadderResult

TESTS = Path(__file__).resolve().parents[1]
SRC = str(TESTS.parent / "src")
FULL_DISK = str(TESTS / "_full_disk.py")


def cli(cache: Path, out: Path, *more: str, full: list[str] | None = None,
        **variables: str) -> subprocess.CompletedProcess:
    """``perfladder run torch`` of R1 alone with inductor's cache in ``cache``; ``full``: folders
    whose disk is full (``tests/_full_disk.py``); ``variables``: more of its environment."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(PYTHONPATH=SRC, CUDA_VISIBLE_DEVICES="", TORCHINDUCTOR_CACHE_DIR=str(cache), **variables)
    start = [sys.executable, "-m", "perfladder"]
    if full is not None:
        env.update(FULL_DISK=os.pathsep.join(full), FULL_DISK_AFTER="0")
        start = [sys.executable, FULL_DISK]
    args = ["run", "torch", "--config", "smoke", "--rungs", "R1", "--no-learn", "--quiet",
            "--out", str(out), *more]
    return subprocess.run(start + args, env=env, capture_output=True, text=True, timeout=600)


def said(err: str) -> list[str]:
    """What a run said on stderr, less the --no-learn flag's own line."""
    return [ln for ln in err.splitlines() if ln.strip() and "--no-learn" not in ln]


@pytest.fixture(scope="module")
def no_room(tmp_path_factory):
    """R1 run with the disk full under inductor's cache and under every temporary folder it
    could turn to: ``(process, results file, cache folder)``."""
    tmp = tmp_path_factory.mktemp("no-room")
    cache, out = tmp / "inductor", tmp / "torch.json"
    fallback = os.path.join(tempfile.gettempdir(), "perfladder-inductor-")
    return cli(cache, out, full=[str(cache), fallback]), out, cache


def test_a_full_disk_fails_the_rung_for_the_machine_and_the_run_is_incomplete(no_room):
    proc, out, cache = no_room
    assert proc.returncode == EXIT_INCOMPLETE, proc.stderr[-3000:]
    r1 = LadderResult.read(out).rung("R1")
    assert (r1.outcome, r1.details["cause"], r1.final) == ("failed", "out_of_space", False)
    assert r1.details["where"] == str(cache)
    notes = LadderResult.read(out).notes
    assert any(str(cache) in n and "cannot be written" in n and "free" in n for n in notes), notes
    assert said(proc.stderr)[-1].startswith("perfladder: incomplete: R1 failed for the machine")
    assert "internal error" not in proc.stderr
    assert json.loads(out.read_text())["versions"]["perfladder"]


@pytest.fixture(scope="module")
def resumed(no_room):
    """The run on a full disk resumed in the same folder with room again (``--resume``): the
    process, and the cache folder it filled. Its cache is the next test's first run's too,
    so that one cold compile serves both."""
    _, failed, cache = no_room
    out = failed.with_name("resumed.json")           # the failed run's file stays for its test
    shutil.copyfile(failed, out)
    return cli(cache, out, "--resume", str(out)), out, cache


def test_resume_after_the_disk_is_freed_measures_the_rung(resumed):
    again, out, _ = resumed
    assert again.returncode == 0, again.stderr[-3000:]
    assert LadderResult.read(out).rung("R1").outcome == "measured"


def test_once_the_disk_is_freed_r1_is_measured_and_a_cache_cut_short_is_set_aside(resumed, tmp_path):
    first, out, cache = resumed                   # the same folder, with room again
    assert first.returncode == 0, first.stderr[-3000:]
    assert LadderResult.read(out).rung("R1").outcome == "measured"
    cut = {}
    for f in cache.rglob("*"):
        if f.is_file() and f.stat().st_size > 1:
            os.truncate(f, f.stat().st_size // 2)        # what a full disk or a killed compile leaves
            cut[f.relative_to(cache)] = f.stat().st_size
    assert cut

    again = cli(cache, tmp_path / "again.json")
    assert again.returncode == 0, again.stderr[-3000:]
    result = LadderResult.read(tmp_path / "again.json")
    assert result.rung("R1").outcome == "measured"
    [moved] = [p for p in cache.parent.iterdir() if p.name.startswith("inductor.unreadable-")]
    # moved, not deleted: every file cut short is there as it was
    assert {f: (moved / f).stat().st_size for f in cut if (moved / f).exists()} == cut
    notes = [n for n in result.notes if str(moved) in n]
    assert len(notes) == 1 and f"{cache} could not be read" in notes[0]
    assert "Traceback" not in again.stderr
    assert any(str(moved) in ln for ln in said(again.stderr))


def test_a_missing_compiler_fails_the_rung_for_the_machine(tmp_path):
    out = tmp_path / "torch.json"
    proc = cli(tmp_path / "inductor", out, CXX=str(tmp_path / "no-such-compiler" / "g++"))
    assert proc.returncode == EXIT_INCOMPLETE, proc.stderr[-3000:]
    r1 = LadderResult.read(out).rung("R1")
    assert (r1.outcome, r1.details["cause"]) == ("failed", "missing_compiler")
    assert "internal error" not in proc.stderr


def test_a_small_disk_turns_the_cache_off_before_the_first_compile(tmp_path, monkeypatch, capsys):
    """On a disk with too little room the cache is off for the run, said in one line naming the
    folder and its free space, kept in the notes; kernels go to a folder of this process."""
    from collections import namedtuple

    import torch.compiler.config as compiler_config

    from perfladder import compile_cache
    from perfladder.torch.compiler import CACHE_ENV, guard_compile_cache
    small = tmp_path / "small"
    monkeypatch.setenv(CACHE_ENV, str(small))
    usage, real = namedtuple("usage", "total used free"), shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: usage(2**20, 0, 2**20) if str(p).startswith(str(small)) else real(p))
    # torch's config flags are set and put back by hand: monkeypatch's undo leaves the flag
    # undefined for every later compile in the process
    was, compiler_config.force_disable_caches = compiler_config.force_disable_caches, False
    notes = []
    try:
        guard_compile_cache()
        compile_cache.listen(notes.append)
        compile_cache.listen(None)
        instead = Path(os.environ[CACHE_ENV])
        assert instead != small and instead.is_dir() and compiler_config.force_disable_caches
    finally:
        compiler_config.force_disable_caches = was
    assert len(notes) == 1 and f"{small} cannot be written" in notes[0] and "1.0 MiB free" in notes[0]
    assert str(instead) in notes[0] and notes[0] in capsys.readouterr().err
    shutil.rmtree(instead)
