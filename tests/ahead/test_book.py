"""perfladder.ahead.book: the book build's stage that compiles both ladders' programs before
the notebooks (its failure path runs through the script in tests/book/test_build_script.py;
each framework's compile-ahead in tests/ahead/test_torch.py and tests/ahead/test_jax.py)."""
from __future__ import annotations

import json
import sys
import types

import pytest

from perfladder.ahead import book as ahead


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_one_framework_writes_its_report_whole(tmp_path, monkeypatch, framework):
    """``one``: the framework side's ``stage`` (found by name), its report written with the
    framework and config, through a temporary file (never half-written)."""
    asked = {}

    def stage(cfg, rungs, **kw):
        asked.update(config=cfg.name, rungs=rungs, kw=kw)
        return {"steps": 1, "compiled": ["R2"], "seconds": 3.0, "failed": {}, "workers": 1}
    monkeypatch.setitem(sys.modules, f"perfladder.ahead.{framework}",
                        types.SimpleNamespace(stage=stage))
    monkeypatch.setenv("PERFLADDER_CONFIG", "smoke")
    report = ahead.one(framework, tmp_path, ["R2"])
    written = json.loads((tmp_path / f"{framework}.json").read_text())
    assert written == report and report["framework"] == framework and report["config"] == "smoke"
    assert asked["rungs"] == ["R2"] and list(tmp_path.iterdir()) == [tmp_path / f"{framework}.json"]
    assert ("reserve_bytes" if framework == "torch" else "workers") in asked["kw"]


def test_both_stages_side_by_side_one_line_each(tmp_path, monkeypatch, capsys):
    """``run`` starts both frameworks at once (the JAX one without preallocation, with the
    cache the notebook will read) and says what each compiled."""
    started = []

    class Proc:
        def __init__(self, argv, env):
            fw = argv[argv.index("one") + 1]
            started.append((fw, env.get("XLA_PYTHON_CLIENT_PREALLOCATE"), env.get("JAX_COMPILATION_CACHE_DIR")))
            (tmp_path / f"{fw}.json").write_text(json.dumps(
                {"steps": 3, "compiled": ["R2", "B3"], "seconds": 12.0, "failed": {"B4": "no cuDNN"}}))
            self.returncode = 0

        def wait(self, timeout=None):
            return 0
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setattr(ahead.subprocess, "Popen", Proc)
    assert ahead.run(tmp_path) == 0
    assert [s[0] for s in started] == ["torch", "jax"]
    assert all(p == "false" and c == str(tmp_path / "jax-cache") for _, p, c in started)
    out = capsys.readouterr().out
    assert "[ahead] jax: 2 of 3 expected programs in 12 s; not compiled: B4" in out


def test_the_jax_side_is_told_it_has_done_enough_once_torch_is_done(tmp_path, monkeypatch, capsys):
    """Torch ends; the JAX side, still compiling ``GRACE_S`` later, finds the file that tells it
    to start no more jobs, then writes its report (what it did not compile, its ladder will)."""
    class Proc:
        def __init__(self, argv, env):
            self.fw = argv[argv.index("one") + 1]
            self.returncode = 0

        def wait(self, timeout=None):
            if self.fw == "jax" and not (tmp_path / ahead.ENOUGH).exists():
                raise ahead.subprocess.TimeoutExpired("jax", timeout)
            (tmp_path / f"{self.fw}.json").write_text(json.dumps(
                {"steps": 1, "compiled": [], "seconds": 1.0, "failed": {"B8": "not compiled: the stage had done enough"}}))
            return 0
    monkeypatch.setattr(ahead.subprocess, "Popen", Proc)
    assert ahead.run(tmp_path) == 0
    assert (tmp_path / ahead.ENOUGH).exists()
    assert "[ahead] jax: 0 of 1 expected programs in 1 s; not compiled: B8" in capsys.readouterr().out
