"""perfladder.jax.beside: a rung's gate programs compiled in a helper thread while its step
compiles; perfladder.jax.step.TrainStep.compile_ahead: the first call then compiles nothing.
(The ladder's compile-ahead, in threads before its first rung: tests/ahead/test_jax.py.)"""
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _jax_gate_helpers import fixed, model

from perfladder.jax.beside import Beside
from perfladder.jax.step import TrainStep, make_optimizer
from perfladder.jax.timer import compile_count


def test_jobs_run_in_threads_of_their_own_and_their_compiles_are_counted_there():
    names = []
    f = jax.jit(lambda x: x * 3 + 1)
    x = jnp.arange(5.0)
    main_before = compile_count(this_thread=True)
    beside = Beside([lambda: names.append(threading.current_thread().name),
                     lambda: f.lower(x).compile()])
    report = beside.join()
    assert names == ["perfladder-compile-beside-0"] and report["jobs"] == 2
    assert report["compilations"] == 1 and "error" not in report and report["seconds"] >= 0
    assert compile_count(this_thread=True) == main_before     # none of it on this thread
    before = compile_count()
    assert np.asarray(f(x))[1] == 4.0 and compile_count() == before   # the call found it compiled


def test_a_failing_job_is_reported_not_raised_and_the_others_still_run():
    ran = []

    def bad():
        raise ValueError("no such program")
    report = Beside([bad, lambda: ran.append(1)]).join()
    assert report["error"] == "ValueError: no such program" and ran == [1]
    assert Beside([]).join() == {"jobs": 0, "seconds": 0.0, "compilations": 0}


@pytest.mark.parametrize("jit", ["nnx", "split"])
def test_a_step_compiled_ahead_records_its_receipt_and_its_first_call_compiles_nothing(jit):
    X, Y = fixed(4)[0]
    m = model()
    step = TrainStep(m, make_optimizer(m), jit=jit)
    # this thread's compiles: a helper thread elsewhere in the process may be compiling too
    before = compile_count(this_thread=True)
    seconds = step.compile_ahead(X, Y)
    assert compile_count(this_thread=True) == before + 1 and seconds == step.compiled_ahead_s > 0
    assert step.observed.get("loss") == "float32"           # written while it was traced
    before = compile_count(this_thread=True)
    step(X, Y)
    assert compile_count(this_thread=True) == before and step.first_call_s is not None
    with pytest.raises(ValueError, match="has not run yet"):
        step.compile_ahead(X, Y)


def test_an_unjitted_step_has_nothing_to_compile_ahead():
    X, Y = fixed(4)[0]
    m = model()
    with pytest.raises(ValueError, match="no compiled program"):
        TrainStep(m, make_optimizer(m), jit="none").compile_ahead(X, Y)


def test_a_step_that_fails_to_compile_leaves_no_gate_program_compiling(monkeypatch):
    """A rung whose step fails to compile waits for the gate programs compiling beside it
    before it raises: none runs on into the next rung's compile and timing."""
    import time

    import perfladder.jax.trial as trial_module
    from perfladder.config import get_config
    from perfladder.jax.lab import JaxLab
    from perfladder.jax.recipe import Recipe
    from perfladder.ladder.rung import Given, Rung

    done = []

    def gate_program():                   # a gate program still compiling when the step fails
        time.sleep(0.5)
        done.append(1)

    def fails(self, X, Y):
        raise RuntimeError("no kernel for this shape")
    monkeypatch.setattr(trial_module, "gate_programs", lambda *args: [gate_program])
    monkeypatch.setattr(TrainStep, "compile_ahead", fails)
    lab = JaxLab(get_config("smoke"))
    given = Given(rung=Rung("R1", "compile", "jit", lambda lab, given: None), recipe=Recipe(batch_size=8))
    with pytest.raises(RuntimeError, match="no kernel"):
        trial_module.trial(lab, given)
    assert done == [1]
    assert not [t for t in threading.enumerate() if t.name.startswith("perfladder-compile-beside")]


# -- compile_ahead: the ladder's expected programs, before its first rung -----------------------
