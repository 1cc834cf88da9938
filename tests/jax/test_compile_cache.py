"""JAX's persistent compilation cache as a fault source, made for real
(``perfladder.jax.compiler``): after a first run, every entry is cut short and the disk under
the folder is full. JAX compiles an entry it cannot read again on its own and warns for each;
the run sets the folder aside at the first (moved, not deleted), turns the cache off at the
first entry it cannot write, says each in one line instead of JAX's warnings, records both in
its notes, and measures R1. The CLI runs in its own process, on R1 alone without the learning
check: JAX's cache settings are per process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from perfladder.results.record import LadderResult

TESTS = Path(__file__).resolve().parents[1]
SRC = str(TESTS.parent / "src")
FULL_DISK = str(TESTS / "_full_disk.py")


def cli(cache: Path, out: Path, full: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(PYTHONPATH=SRC, CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu",
               JAX_COMPILATION_CACHE_DIR=str(cache))
    start = [sys.executable, "-m", "perfladder"]
    if full is not None:       # the first write (the run's own probe of the folder) still fits
        env.update(FULL_DISK=os.pathsep.join(full), FULL_DISK_AFTER="1")
        start = [sys.executable, FULL_DISK]
    args = ["run", "jax", "--config", "smoke", "--rungs", "R1", "--no-learn", "--quiet", "--out", str(out)]
    return subprocess.run(start + args, env=env, capture_output=True, text=True, timeout=600)


def test_a_cache_cut_short_on_a_full_disk_is_set_aside_turned_off_and_r1_measured(tmp_path):
    cache = tmp_path / "jax-cache"
    first = cli(cache, tmp_path / "first.json")
    assert first.returncode == 0, first.stderr[-3000:]
    cut = {}
    for f in cache.rglob("*"):
        if f.is_file() and f.stat().st_size > 1:
            os.truncate(f, f.stat().st_size // 2)
            cut[f.relative_to(cache)] = f.stat().st_size
    assert cut

    again = cli(cache, tmp_path / "again.json", full=[str(cache)])
    assert again.returncode == 0, again.stderr[-3000:]
    result = LadderResult.read(tmp_path / "again.json")
    assert result.rung("R1").outcome == "measured"
    [moved] = [p for p in tmp_path.iterdir() if p.name.startswith("jax-cache.unreadable-")]
    assert {f: (moved / f).stat().st_size for f in cut} == cut       # moved, not deleted
    aside = [n for n in result.notes if f"{cache} could not be read" in n]
    off = [n for n in result.notes if f"{cache} cannot be written" in n]
    assert len(aside) == 1 and str(moved) in aside[0]
    assert len(off) == 1 and "free" in off[0] and "turned off for this run" in off[0]
    # JAX's warnings, one per entry, are not what the user reads: one line per cause
    assert "UserWarning" not in again.stderr
    cache_lines = [ln for ln in again.stderr.splitlines() if str(cache) in ln]
    assert len(cache_lines) == 2, again.stderr
