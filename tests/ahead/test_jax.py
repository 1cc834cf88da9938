"""perfladder.ahead.jax: the JAX ladder's expected programs compiled in threads before its first
rung, into JAX's persistent compilation cache, and loaded from it by the rungs' own compiles."""
import jax
import pytest

_LOADS = r'''
import json, sys
from functools import partial
import jax
from perfladder.jax.compiler import cublas_gemms, fast_cpu_compiles
if sys.argv[2] == "gpu":                                 # as the full config's notebook does
    cublas_gemms()
    jax.config.update("jax_compilation_cache_dir", sys.argv[1])   # a fresh persistent cache
    # JAX writes no program that compiled in under a second (its default), and at this
    # one-block smoke size the loss reference compiles faster than that on the H200: what is
    # tested is that the keys of the programs compiled ahead match the rungs' own
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
else:
    fast_cpu_compiles(cache_dir=sys.argv[1])
from flax import nnx
from perfladder.config import get_config
from perfladder.ahead import jax as ahead
from perfladder.jax.lab import JaxLab
from perfladder.jax.recipe import Recipe
from perfladder.jax.step import loss_fn
from perfladder.jax.timer import cache_hit_count
from perfladder.jax.trial import gate_batches, model_gates, reference_losses, step_form_gate

def train_step(model, optimizer, X, Y, view=None):       # a notebook's own copy of the code
    loss, grads = nnx.value_and_grad(partial(loss_fn, view=view))(model, X, Y)
    optimizer.update(model, grads)
    return loss

lab = JaxLab(get_config("smoke").replace(num_blks=1), probe=False)
b3 = Recipe(batch_size=8, dtype="bfloat16", jit="split")
report = ahead.compile_ahead(ahead.expected_jobs(lab, {"B3": b3}), workers=2)
lab.use(train_step=train_step)
out = {"report": report, "line": ahead.summary(report)}
for name, run in [("step", lambda: lab.build_step(b3).compile_ahead(*gate_batches(lab, 8)[0])),
                  ("step form", lambda: step_form_gate(lab, b3)),
                  ("loss reference", lambda: reference_losses(lab, 8)),
                  ("model gate", lambda: model_gates(lab, b3, lab.build_step(b3), *gate_batches(lab, 8)[0]))]:
    h0 = cache_hit_count()
    run()
    out[name] = cache_hit_count() - h0
print(json.dumps(out))
'''


def _loads(tmp_path, where: str) -> dict:
    import json
    import os
    import subprocess
    import sys
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}   # beside this process's JAX
    out = subprocess.run([sys.executable, "-c", _LOADS, str(tmp_path / "cache"), where],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
def test_on_a_gpu_programs_compiled_ahead_are_loaded_by_the_rungs_own_compiles(tmp_path):
    """The same on a GPU, where the step-form gate's step runs at full fp32 matmul precision
    (part of its program's key) and XLA autotunes each step while the threads share the GPU."""
    got = _loads(tmp_path, "gpu")
    assert got["report"]["failed"] == {}
    assert got["step"] == 1 and got["step form"] >= 1 and got["loss reference"] == 1
    assert got["model gate"] >= 1


def test_programs_compiled_ahead_are_loaded_by_the_rungs_own_compiles(tmp_path):
    """In a fresh cache, threads compile an expected step with the library's code (and its
    model gate's programs), the step-form gates' steps and the loss reference; afterwards a
    step built from a notebook's own copy of the code, a step-form gate, the loss reference and
    a model gate each load their program (cache hits)."""
    got = _loads(tmp_path, "cpu")
    report = got["report"]
    assert report["failed"] == {} and report["workers"] == 2
    assert set(report["compiled"]) == {"B3", "step-form gate (split)", "loss reference (batch 8)"}
    assert list(report["runs"]) and report["compilations"] > 3 and report["loaded"] < report["compilations"]
    assert got["line"].startswith("compiled ahead: 3 of 3 expected programs in 2 threads")
    assert got["step"] == 1 and got["step form"] >= 1 and got["loss reference"] == 1
    assert got["model gate"] >= 1


def test_a_failing_job_is_reported_and_the_others_still_compile():
    ran = []

    def bad():
        raise RuntimeError("no GPU for cuDNN")
    report = ahead_mod().compile_ahead({"B4": bad, "R2": lambda: ran.append(1)}, workers=1)
    assert report["compiled"] == ["R2"] and ran == [1]
    assert report["failed"] == {"B4": "RuntimeError: no GPU for cuDNN"}
    assert "not compiled ahead: B4 (B4: RuntimeError: no GPU for cuDNN)" in ahead_mod().summary(report)
    assert ahead_mod().compile_ahead({})["workers"] == 0


def ahead_mod():
    from perfladder.ahead import jax as ahead
    return ahead


def test_the_jax_guess_is_the_reference_runs_jitted_steps_without_r1():
    from perfladder.ahead import expected
    from perfladder.config import get_config
    from perfladder.jax.lab import JaxLab
    from perfladder.jax.rungs import RUNGS
    from perfladder.ladder import engine
    lab = JaxLab(get_config("full"), probe=False)
    reference, history = expected.committed_runs(lab)
    assert reference is not None and reference.framework == "jax"
    got = expected.expected_recipes(lab, RUNGS, engine.check_rungs(RUNGS, None), reference, history,
                                    compiles=ahead_mod().compiles)
    measured = {r.name: r for r in reference.rungs if r.measured}
    assert "R1" not in got and "R0" not in got and "R2" in got
    assert all(r.jit != "none" for r in got.values())
    assert all(got[n] == lab.recipe_from_dict(measured[n].recipe) for n in got
               if " if " not in n and n in measured)
    # rungs newer than the reference (here B9-B11, measured by later runs) are guessed too
    newer = [n for n in got if " if " not in n and n not in measured]
    assert all(RUNGS[n].stage == "beyond" for n in newer)
    jobs = ahead_mod().expected_jobs(lab, got)
    assert "R0 (un-jitted, one step)" not in jobs
    # the order the threads take them in: the guess's steps, the gates', then the other ways
    import unittest.mock
    with unittest.mock.patch.object(ahead_mod(), "compile_ahead", lambda jobs, **kw: list(jobs)):
        order = ahead_mod().ladder_ahead(lab, RUNGS, engine.check_rungs(RUNGS, None))
    others = [i for i, k in enumerate(order) if " if " in k]
    gates = [i for i, k in enumerate(order) if k.startswith(("step-form", "loss reference"))]
    assert others and gates and max(gates) < min(others)
    assert all(" if " not in k for k in order[: min(gates)])
    assert {"step-form gate (nnx)", "step-form gate (split)"} <= set(jobs)
    assert any(k.startswith("loss reference (batch") for k in jobs)


def test_jobs_past_the_time_limit_are_reported_not_waited_for():
    import threading
    release, done = threading.Event(), []

    def slow():
        release.wait(60)
        done.append(1)
    report = ahead_mod().compile_ahead({"slow": slow, "next": lambda: None}, workers=1, timeout_s=0.5)
    assert done == []                        # returned while the slow job still ran
    release.set()
    assert report["failed"] == {"slow": "not compiled within the time limit",
                                "next": "not compiled within the time limit"}
    assert report["compiled"] == []


def test_once_enough_no_job_starts_and_none_is_waited_for():
    import threading
    release, ran = threading.Event(), []

    def first():
        ran.append("first")
        release.wait(60)
    report = ahead_mod().compile_ahead({"first": first, "second": lambda: ran.append("second")},
                                       workers=1, enough=lambda: bool(ran))
    release.set()
    assert ran == ["first"]
    assert report["failed"] == {"first": "not compiled: the stage had done enough",
                                "second": "not compiled: the stage had done enough"}


def test_the_jax_ladder_compiles_ahead_only_when_asked(monkeypatch):
    """``ahead=None``: nothing compiles ahead in a notebook (``by_default``); ``ahead=True``:
    the guess's programs (R1 left out) in threads, said in the result's notes and report."""
    from perfladder import ahead as door
    from perfladder.config import get_config
    from perfladder.jax import rungs as jax_rungs
    from perfladder.ladder import engine
    calls = []

    def fake(jobs, **kw):
        calls.append(sorted(jobs))
        return {"steps": len(jobs), "workers": 1, "seconds": 1.0, "compiled": sorted(jobs), "failed": {}}
    monkeypatch.setattr(ahead_mod(), "compile_ahead", fake)
    run = jax_rungs.Ladder(get_config("smoke"), ahead=True)
    assert calls and "R2" in calls[0] and not any(k.startswith("R1") for k in calls[0])
    assert run.result.ahead["compiled"] == calls[0]
    assert any(n.startswith(f"compiled ahead: {len(calls[0])} of {len(calls[0])} expected programs")
               for n in run.result.notes)
    run.lab.result.ahead = None
    door.before_first_rung(run.lab, jax_rungs.RUNGS, engine.check_rungs(jax_rungs.RUNGS, None), None)
    assert len(calls) == 1 and run.lab.result.ahead is None          # not by default

