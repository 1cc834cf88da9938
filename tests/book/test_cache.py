"""perfladder.book.cache: the notebook cache key changes with whatever a cached page depends on,
and scripts/build_book.sh builds with it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfladder.book import cache as bookcache

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = {"torch": "2.13.0", "jax": "0.10.2", "flax": "0.12.8", "optax": "0.2.8"}


@pytest.fixture
def src(tmp_path):
    """A copy of the library's source and assets."""
    dst = tmp_path / "perfladder"
    shutil.copytree(bookcache.package_dir(), dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def key(src, config="smoke", device="cpu", versions=VERSIONS):
    return bookcache.cache_key(config, device, src=src, versions=versions)


def test_the_key_is_stable_and_covers_code_and_assets(src):
    assert key(src) == key(src)
    files = [p.relative_to(src).as_posix() for p in bookcache.source_files(src)]
    assert "measure/gates.py" in files and "torch/step.py" in files and "jax/step.py" in files
    assert "assets/timemachine.txt" in files
    assert not any("__pycache__" in f for f in files)


@pytest.mark.parametrize("edit", ["change", "add", "remove", "asset"])
def test_changing_the_library_changes_the_key(src, edit):
    before = key(src)
    if edit == "change":
        p = src / "torch" / "step.py"
        p.write_text(p.read_text() + "\n# one more line\n")
    elif edit == "add":
        (src / "jax" / "new_module.py").write_text("X = 1\n")
    elif edit == "remove":
        (src / "measure" / "learning.py").unlink()
    else:
        p = src / "assets" / "timemachine.txt"
        p.write_bytes(p.read_bytes() + b" ")
    assert key(src) != before


def test_versions_config_and_device_change_the_key(src):
    base = key(src)
    assert key(src, versions={**VERSIONS, "jax": "0.10.3"}) != base
    assert key(src, versions={**VERSIONS, "optax": "absent"}) != base
    assert key(src, config="full") != base
    assert key(src, device="NVIDIA H200, 570.86") != base


def test_a_memory_cap_changes_the_key(src, monkeypatch):
    """Which rungs fit depends on the cap (perfladder.ladder.fit): a page built under another
    cap is not reused. Without one the key is what it always was."""
    monkeypatch.delenv("PERFLADDER_MEMORY_CAP_GIB", raising=False)
    plain = bookcache.key_parts("full", "NVIDIA H200", src=src, versions=VERSIONS)
    monkeypatch.setenv("PERFLADDER_MEMORY_CAP_GIB", "24")
    capped = bookcache.key_parts("full", "NVIDIA H200", src=src, versions=VERSIONS)
    assert "memory_cap_gib" not in plain and capped["memory_cap_gib"] == "24"
    assert {k: v for k, v in capped.items() if k != "memory_cap_gib"} == plain


def test_bad_input():
    with pytest.raises(ValueError, match="config"):
        bookcache.cache_key("", "cpu")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bookcache.source_hash("/nonexistent/perfladder")
    assert bookcache.framework_versions(["surely-not-installed-dist"]) == {
        "surely-not-installed-dist": "absent"}


def test_the_build_script_uses_the_key():
    """``build_book.sh PYTHON --key`` runs the script's own key step and stops before building:
    the key it prints is ``cache_key`` of this library, config and device."""
    env = {**os.environ, "PERFLADDER_CONFIG": "smoke",
           "PYTHONPATH": os.pathsep.join([str(bookcache.package_dir().parent),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_book.sh"), sys.executable, "--key"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    parts = dict(line.strip().split(": ", 1) for line in lines[1:])
    assert parts["config"] == "smoke" and parts["source"] == bookcache.source_hash()
    assert lines[0] == bookcache.cache_key("smoke", parts["device"])
    script = (ROOT / "scripts" / "build_book.sh").read_text()
    assert 'stamp="$KEY' in script          # the cache is emptied when the key changes
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "build_book.sh"), sys.executable, "--nope"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "valid: --key" in bad.stderr


def test_the_committed_runs_change_the_key(src, tmp_path):
    """A ladder page built without a GPU shows the reference run that reference.txt names:
    a cached page must not survive a change of that file or of any committed run."""
    runs = tmp_path / "results"
    (runs / "run-a").mkdir(parents=True)
    (runs / "run-a" / "torch.json").write_text("{}")
    (runs / "reference.txt").write_text("run-a\n")
    base = bookcache.cache_key("smoke", "cpu", src=src, versions=VERSIONS, results=runs)
    (runs / "reference.txt").write_text("run-b\n")
    moved = bookcache.cache_key("smoke", "cpu", src=src, versions=VERSIONS, results=runs)
    (runs / "run-a" / "torch.json").write_text('{"changed": 1}')
    edited = bookcache.cache_key("smoke", "cpu", src=src, versions=VERSIONS, results=runs)
    assert len({base, moved, edited}) == 3
    assert bookcache.key_parts("smoke", "cpu", src=src, versions=VERSIONS, results=None)["results"] == "absent"
    here = bookcache.key_parts("smoke", "cpu", src=src, versions=VERSIONS)        # the book root's
    assert here["results"] == bookcache.results_hash(ROOT / "benchmarks" / "results")
