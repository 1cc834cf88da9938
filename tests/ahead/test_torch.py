"""perfladder.ahead.torch: the ladder's compiled steps compiled in helper processes, loaded
from the compiler's cache by the rungs' own first calls."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from perfladder import ahead as door
from perfladder.ahead import torch as ahead
from perfladder.config import get_config
from perfladder.ladder import engine
from perfladder.torch.lab import TorchLab
from perfladder.torch.recipe import Recipe
from perfladder.torch.rungs import RUNGS

NAMES = engine.check_rungs(RUNGS, None)


@pytest.fixture(scope="module")
def full_lab():
    return TorchLab(get_config("full"), device="cpu")


def test_a_step_compiled_ahead_is_loaded_by_the_rungs_first_call(tmp_path):
    """In a fresh compiler cache: a helper is handed a step that cannot be built on a CPU (CUDA
    graphs), the longest expected, first, says why and goes on to compile R2's step; the step
    built afterwards in this process loads its graphs from the cache, which the helper had not
    found there."""
    script = textwrap.dedent("""
        import json
        from perfladder.config import get_config
        from perfladder.ahead import torch as ahead
        from perfladder.torch.lab import TorchLab
        from perfladder.torch.recipe import Recipe
        from perfladder.torch.timer import cache_events, loaded
        lab = TorchLab(get_config("smoke").replace(num_blks=1), device="cpu")
        r2 = Recipe(batch_size=8, compiled=True, bf16=True)
        graphs = Recipe(batch_size=8, compiled=True, cudagraphs=True)
        report = ahead.compile_ahead(lab, {"B3": graphs, "R2": r2}, workers=1,
                                     costs={"B3": 2.0, "R2": 1.0})
        with cache_events() as caches:
            step = lab.build_step(r2)
            step(*next(lab.stream(8)))
        print(json.dumps({"report": report, "hits": loaded(caches), "line": ahead.summary(report)}))
    """)
    # a fresh cache makes inductor write every C++ kernel of the step anew; without SIMD (same
    # setting in the helper and here) they build in half the time, and the caches under test --
    # inductor's FX graphs and AOTAutograd's -- hold and load them exactly the same way
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "TORCHINDUCTOR_VEC_ISA_OK": "0"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    report = got["report"]
    assert report["compiled"] == ["R2"] and report["workers"] == 1
    (b3_start, b3_end), (r2_start, r2_end) = report["runs"]["B3"], report["runs"]["R2"]
    assert b3_start < b3_end <= r2_start < r2_end
    assert "reduce-overhead" in report["failed"]["B3"] or "CUDA" in report["failed"]["B3"]
    assert report["already_cached"] == 0     # the helper compiled them ...
    assert got["hits"] >= 2                  # ... and the rung loads the forward and the backward
    assert "1 of 2 expected compiled steps" in got["line"] and "not compiled ahead: B3" in got["line"]


def test_helpers_past_their_time_are_stopped_and_their_steps_reported():
    lab = TorchLab(get_config("smoke"), device="cpu")
    recipes = {"R2": Recipe(batch_size=8, compiled=True, bf16=True),
               "R3": Recipe(batch_size=32, compiled=True, bf16=True)}
    report = ahead.compile_ahead(lab, recipes, workers=2, timeout_s=0.2)
    assert report["workers"] == 2 and report["compiled"] == []
    assert sorted(report["failed"]) == ["R2", "R3"]
    assert all("time limit" in e for e in report["failed"].values())


def test_nothing_expected_starts_no_helper():
    lab = TorchLab(get_config("smoke"), device="cpu")
    report = ahead.compile_ahead(lab, {})
    assert report["workers"] == 0 and "nothing" in ahead.summary(report)


def test_the_ladder_compiles_ahead_for_the_full_config_on_a_gpu_or_when_asked(monkeypatch, full_lab):
    from perfladder.torch import rungs as torch_rungs
    calls = []

    def fake(lab, recipes, **kw):
        calls.append((sorted(recipes), kw))
        return {"steps": len(recipes), "workers": 1, "seconds": 1.0, "compiled": sorted(recipes),
                "failed": {}}
    monkeypatch.setattr(ahead, "compile_ahead", fake)
    run = torch_rungs.Ladder(get_config("smoke"), device="cpu")
    assert calls == [] and not any(n.startswith("compiled ahead") for n in run.result.notes)
    run = torch_rungs.Ladder(get_config("smoke"), device="cpu", ahead=True)
    assert calls and "R2" in calls[0][0] and "R1" not in calls[0][0]
    assert any(n.startswith("compiled ahead") for n in run.result.notes)
    calls.clear()
    door.before_first_rung(full_lab, RUNGS, NAMES, None)              # the full config, on a CPU: not asked
    assert calls == []
    monkeypatch.setattr(full_lab, "on_gpu", True)           # ... on a GPU: by default
    door.before_first_rung(full_lab, RUNGS, NAMES, False)
    assert calls == []
    door.before_first_rung(full_lab, RUNGS, NAMES, None)
    (names, kw), = calls
    assert "B14" in names and "R1" not in names
    assert kw["needs"]["B14"] > kw["needs"]["R2"] > 0       # the reference run's measured peaks


def test_a_cache_hit_is_said_beside_the_first_call():
    from perfladder.measure.evidence import Compile
    from perfladder.pages.claims import first_call_text
    from perfladder.results.record import RungResult
    r = RungResult(name="B5", key="batch_x2", label="batch x2", tokens_per_s=1.0,
                   recipe={"compiled": True}, compile=Compile(first_call_s=1.25, compilations=3,
                                                              cache_hits=2))
    assert first_call_text(r) == "1.2 s, 2 of its graphs loaded from the compiler's cache"
    r.compile.cache_hits = 0
    assert first_call_text(r) == "1.2 s"


def test_the_helpers_launch_configurations_are_forgotten_and_no_other(tmp_path, monkeypatch):
    import time
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    (tmp_path / "ab").mkdir()
    old, new, kernel = (tmp_path / "ab" / n for n in ("old.best_config", "new.best_config", "k.py"))
    for f in (old, new, kernel):
        f.write_text("{}")
    since = time.time() - 5
    os.utime(old, (since - 100, since - 100))           # an earlier build's choice
    assert ahead.forget_tuning(since) == 1
    assert old.exists() and kernel.exists() and not new.exists()


def test_cache_events_say_what_the_caches_did_and_why_a_graph_was_not_cached(caplog):
    import logging

    import torch

    from perfladder.torch.timer import BYPASS_LOGGERS, CACHE_COUNTERS, cache_events
    f = torch.compile(lambda x: torch.sin(x) * 2, dynamic=False)
    with caplog.at_level(logging.INFO), cache_events() as caches:
        f(torch.randn(3, 5))
        logging.getLogger(BYPASS_LOGGERS[0]).info("Bypassing FX Graph Cache because '%s'", "a reason")
    assert set(caches) - {"bypass_reasons"} <= {name for _, name in CACHE_COUNTERS}
    assert caches.get("fxgraph_cache_hit", 0) + caches.get("fxgraph_cache_miss", 0) == 1
    assert caches["bypass_reasons"] == ["Bypassing FX Graph Cache because 'a reason'"]
    assert "a reason" not in caplog.text                       # kept from the console meanwhile
    with cache_events() as nothing:
        f(torch.randn(3, 5))                                   # compiled already: no cache asked
    assert nothing == {}
    assert logging.getLogger(BYPASS_LOGGERS[0]).propagate      # put back


def test_an_interrupt_stops_every_helper(monkeypatch):
    lab = TorchLab(get_config("smoke"), device="cpu")
    started = []

    class Started(subprocess.Popen):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            started.append(self)

    def pressed_stop(self, block=True, timeout=None):   # the reader presses stop meanwhile
        raise KeyboardInterrupt
    monkeypatch.setattr(ahead.subprocess, "Popen", Started)
    monkeypatch.setattr(ahead.queue.Queue, "get", pressed_stop)
    recipes = {"R2": Recipe(batch_size=8, compiled=True, bf16=True),
               "R3": Recipe(batch_size=32, compiled=True, bf16=True)}
    with pytest.raises(KeyboardInterrupt):
        ahead.compile_ahead(lab, recipes, workers=2)
    assert len(started) == 2 and all(p.poll() is not None for p in started)


def _fake_helpers(n, lines, stray=False):
    """Helpers that answer each recipe after a second's sleep, with its wall-clock start and end
    (and, with ``stray``, a library's own lines around the answer)."""
    script = textwrap.dedent(f"""
        import json, sys, time
        for line in sys.stdin:
            name, start = json.loads(line)["name"], time.time()
            time.sleep(1.0)
            if {stray}:
                print("a library's own line", flush=True)
            print(json.dumps({{"name": name, "error": None, "start": start, "end": time.time()}}),
                  flush=True)
            if {stray}:
                print(json.dumps({{"not": "an answer"}}), flush=True)
    """)
    return [ahead._Helper(None, dict(os.environ), lines, argv=[sys.executable, "-c", script])
            for _ in range(n)]


def _drive(helpers, lines, todo, need, room):
    import time
    recipes = {k: Recipe(batch_size=8, compiled=True) for k in todo}
    report = {"compiled": [], "failed": {}, "runs": {}, "already_cached": 0}
    try:
        ahead._drive(helpers, lines, list(todo), recipes, need, room=room, report=report,
                     deadline=time.perf_counter() + 60)
    finally:
        for h in helpers:
            h.stop()
    return report


def test_a_stray_line_before_a_helpers_answer_does_not_hide_it():
    """A library may print to a helper's stdout; its answers are still read as they come (not
    left in a buffer until the time limit), and a line that is not an answer is passed over."""
    import queue
    lines = queue.Queue()
    report = _drive(_fake_helpers(1, lines, stray=True), lines, ["R2", "R3"], {"R2": 1, "R3": 1}, 1)
    assert report["compiled"] == ["R2", "R3"] and report["failed"] == {}


def test_idle_helpers_take_only_what_the_device_memory_has_room_for():
    """Two helpers, three recipes: A and B each need more than half the room, so never run at
    once; C fits beside either and is taken by the helper left idle."""
    import queue
    lines = queue.Queue()
    report = _drive(_fake_helpers(2, lines), lines, ["A", "B", "C"], {"A": 6, "B": 6, "C": 3}, 10)
    assert sorted(report["compiled"]) == ["A", "B", "C"] and report["failed"] == {}
    (a0, a1), (b0, b1), (c0, c1) = (report["runs"][k] for k in "ABC")
    assert a1 <= b0 or b1 <= a0                         # A and B one after the other
    assert c0 < a1 and a0 < c1                          # C beside A, the first taken


def test_idle_helpers_are_stopped_side_by_side():
    """A torch helper takes seconds to exit once its input ends: every helper's input ends
    before the first has finished exiting (one after the other, the third would have seen its
    end only after the two before it had taken their second each)."""
    import queue
    import time
    script = textwrap.dedent("""
        import sys, time
        for line in sys.stdin:
            pass
        print(time.time(), flush=True)      # its input ended
        time.sleep(1.0)                     # a slow exit
    """)
    lines = queue.Queue()
    helpers = [ahead._Helper(None, dict(os.environ), lines, argv=[sys.executable, "-c", script])
               for _ in range(3)]
    time.sleep(0.5)                         # all three started and reading
    ahead.stop_all(helpers, grace_s=ahead.STOP_GRACE_S)
    assert all(h.proc.returncode == 0 for h in helpers)        # exited, not killed
    ends = []
    while len(ends) < 3:
        _, line = lines.get(timeout=5)
        if line is not None:
            ends.append(float(line))
    assert max(ends) - min(ends) < 1.0


def test_a_busy_helper_is_killed_at_the_stop():
    """A helper still compiling when the helpers stop (its time ran out) is killed, not waited
    for, while the idle one exits on its own."""
    import queue
    script = "import sys, time\nfor line in sys.stdin:\n    time.sleep(60)\n"
    lines = queue.Queue()
    busy, idle = (ahead._Helper(None, dict(os.environ), lines, argv=[sys.executable, "-c", script])
                  for _ in range(2))
    busy.give("R2", Recipe(batch_size=8, compiled=True))
    ahead.stop_all([busy, idle], grace_s=ahead.STOP_GRACE_S)
    assert busy.proc.returncode != 0 and idle.proc.returncode == 0
