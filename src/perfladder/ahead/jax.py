"""The JAX ladder's expected programs compiled before its first rung, in threads:
``ladder_ahead`` (a book build runs it in a process of its own: ``perfladder.ahead.book``).

XLA compiles in C++ with Python's lock released, so threads compile programs side by side,
into JAX's persistent compilation cache. A rung's own compile then finds its program there and
loads it: the cache is keyed by the program's text without source locations, so the library's
code, with which the threads build each step, and a notebook's identical code give one key; a
reader's changed code gives another, and that rung compiles as it always did.

What is compiled (``expected_jobs``): each expected step (``perfladder.ahead.expected``; R1
left out: its first call is where the chapter shows what compiling costs) with its model
gate's programs, the step-form gates' 8-row steps, and the loss gates' plain bf16 reference at
each beyond batch. Unlike the programs compiled beside a rung (``perfladder.jax.beside``: no
autotuning), the steps are autotuned as the rungs' own are, while the threads share the GPU.
On the H200 a loaded step's kernels differed from one compiled alone in 9 lines of its HLO,
and two compiles alone differed in 26: XLA's autotuning varies by itself more than the sharing
changed it (``benchmarks/results/h200-jax-ahead-2026-12-03``).
"""
from __future__ import annotations

import os
import queue
import threading
import time
from typing import Callable

from perfladder.jax.timer import cache_hit_count, compile_count

__all__ = ["by_default", "compile_ahead", "compiles", "expected_jobs", "ladder_ahead", "stage", "summary"]


def ladder_ahead(lab, rungs: dict, names, workers: int | None = None,
                 enough: Callable[[], bool] | None = None) -> dict:
    """Compile the programs the ladder of ``rungs`` (running ``names``) is expected to build
    (``perfladder.ahead.expected``, guessed from the committed runs; ``expected_jobs``) in
    ``workers`` threads: the guess's own steps first, the longest first, then the gates'
    steps and references, then the steps compiled in case an undecided rung goes the other
    way (the least likely to be used); the report of ``compile_ahead``, which stops starting
    jobs once ``enough()`` says so."""
    from perfladder.ahead.expected import guess
    recipes, _ = guess(lab, rungs, names, compiles)
    jobs = expected_jobs(lab, recipes)
    jobs = {k: jobs[k] for k in sorted(jobs, key=lambda k: " if " in k)}     # stable: the rest keep order
    return compile_ahead(jobs, workers=workers, enough=enough)


def by_default(lab) -> bool:
    """Never in a notebook unless asked (``ahead=True``): measured on the H200, the threads took
    longer than the compiles they saved the rungs, and without the job that held them up they
    would have saved little (``benchmarks/results/h200-jax-ahead-2026-12-03``). Beside the
    PyTorch helpers, in the book build's stage (``stage``), their time is hidden."""
    return False


def stage(config, rungs=None, workers: int | None = None, enough=None) -> dict:
    """A book build's compile-ahead for the JAX ladder (``perfladder.ahead.book``), in this
    process: XLA's settings the notebook makes before the backend starts, a lab, the expected
    programs (``rungs``: only these rungs') in ``workers`` threads, no more started once
    ``enough()`` says so; the report."""
    from perfladder.jax.compiler import cublas_gemms, fast_cpu_compiles
    from perfladder.jax.lab import JaxLab
    from perfladder.jax.rungs import RUNGS
    from perfladder.ladder import engine
    fast_cpu_compiles() if config.is_smoke else cublas_gemms()
    names = engine.check_rungs(RUNGS, rungs)          # a bad name: before any setup
    return ladder_ahead(JaxLab(config, probe=False), RUNGS, names, workers=workers, enough=enough)


def compiles(recipe) -> bool:
    """Whether ``recipe``'s step is compiled ahead: every jitted one (``perfladder.ahead.
    expected`` asks)."""
    return recipe.jit != "none"


def expected_jobs(lab, recipes: dict) -> dict[str, Callable[[], object]]:
    """``{name: job}`` for ``compile_ahead``: each of ``recipes`` (``{name: Recipe}``) compiled
    with the library's code on a gate batch of its shape, then its model gate's programs
    (``trial.gate_programs``: not autotuned); the step-form gates' steps for each jit form
    among them, and the loss gates' reference at each beyond batch among them. Not the
    un-jitted R0: its first call compiles many small programs, one operation each,
    dispatched from Python; in a thread beside the others it held them up for minutes on the
    H200 (``benchmarks/results/h200-jax-ahead-2026-12-03``) to save R0 about 18 s."""
    import jax

    from perfladder.jax.gates import true_fp32
    from perfladder.jax.recipe import Recipe
    from perfladder.jax.trial import GATE_ROWS, gate_batches, gate_programs, reference_recipe

    def step_job(recipe, rows=None, gates=False):
        def job():
            X, Y = gate_batches(lab, lab.config.batch_size if rows else recipe.batch_size)[0]
            step = lab.build_step(recipe, plain_code=True)
            # a step-form gate runs its step at full fp32 matmul precision on a GPU, which the
            # program's text (so its cache key) carries
            with true_fp32(rows is not None and jax.default_backend() != "cpu"):
                step.compile_ahead(X[:rows] if rows else X, Y[:rows] if rows else Y)
            for program in gate_programs(lab, recipe, step, X, Y) if gates else ():
                program()
        return job

    jobs = {name: step_job(r, gates=True) for name, r in recipes.items()}
    for form in sorted({r.jit for r in recipes.values()} - {"none"}):
        jobs[f"step-form gate ({form})"] = step_job(Recipe(batch_size=GATE_ROWS, jit=form), GATE_ROWS)
    beyond = {r.batch_size for n, r in recipes.items() if n.startswith("B")}
    for b in sorted(beyond):
        jobs[f"loss reference (batch {b})"] = step_job(reference_recipe(b))
    return jobs


TIMEOUT_S = 600      # the threads' wall budget; past it no job starts and the rest are not waited for


def compile_ahead(jobs: dict[str, Callable[[], object]], workers: int | None = None,
                  timeout_s: float = TIMEOUT_S, enough: Callable[[], bool] | None = None) -> dict:
    """Run ``jobs`` (``expected_jobs``) in ``workers`` threads (default: half the CPU cores), one
    queue in the given order, and wait for them, ``timeout_s`` at most, or until ``enough()``
    (asked every second) says to start no more jobs and wait for none. Returns the report:
    ``steps``, ``workers``, ``seconds``, ``compiled`` (names), ``runs`` (``{name: [start, end]}``,
    wall-clock), ``compilations``, ``loaded`` (of those, how many a job loaded from the cache:
    another job's program, such as a model's initialisation, or an earlier build's) and
    ``failed`` (``{name: error}``): a job that fails, or that the time limit left undone, costs
    only its rung's compile."""
    t0 = time.perf_counter()
    stop = threading.Event()
    n = max(1, min(len(jobs), workers or (os.cpu_count() or 2) // 2))
    report = {"steps": len(jobs), "workers": n if jobs else 0, "seconds": 0.0, "compiled": [],
              "failed": {}, "runs": {}, "compilations": 0, "loaded": 0}
    todo: queue.Queue = queue.Queue()
    for item in jobs.items():
        todo.put(item)
    lock = threading.Lock()

    def work():
        while not stop.is_set():
            try:
                name, job = todo.get_nowait()
            except queue.Empty:
                return
            start, c0, h0 = time.time(), compile_count(this_thread=True), cache_hit_count(this_thread=True)
            error = None
            try:
                job()
            except Exception as e:      # reported; the rung compiles for itself, and raises there
                error = f"{type(e).__name__}: {e}"[:500]
            with lock:
                if stop.is_set():          # past the limit: the report is closed
                    return
                report["runs"][name] = [start, time.time()]
                report["compilations"] += compile_count(this_thread=True) - c0
                report["loaded"] += cache_hit_count(this_thread=True) - h0
                if error is None:
                    report["compiled"].append(name)
                else:
                    report["failed"][name] = error

    threads = [threading.Thread(target=work, daemon=True, name=f"perfladder-compile-ahead-{i}")
               for i in range(report["workers"])]
    for t in threads:
        t.start()
    while time.perf_counter() < t0 + timeout_s and not (enough is not None and enough()):
        alive = [t for t in threads if t.is_alive()]
        if not alive:
            break
        # a second at a time, so that ``enough`` is asked between
        alive[0].join(min(1.0, max(0.0, t0 + timeout_s - time.perf_counter())))
    stop.set()                      # a compile still running finishes unseen in its thread
    with lock:
        for name in jobs:
            if name not in report["runs"]:
                report["failed"][name] = "not compiled within the time limit" if not (
                    enough and enough()) else "not compiled: the stage had done enough"
        report["seconds"] = time.perf_counter() - t0
    return report


def summary(report: dict) -> str:
    """One line for the result's notes and the page."""
    from perfladder.ahead.expected import summary as line
    return line(report, "programs", "threads",
                "each rung's compile then loads its program from JAX's persistent compilation cache")
