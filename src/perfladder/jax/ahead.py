"""A rung's programs compiled side by side, before any of them runs: ``Beside``.

XLA compiles in C++ with Python's lock released, so several threads compile several programs
at once. A JAX rung compiles its timed step on the calling thread (with XLA's GEMM autotuning,
which times candidate kernels on the GPU) while helper threads compile the programs its gates
will run (``perfladder.jax.gate_programs``: no autotuning, so nothing of theirs runs on the GPU
while the step's kernels are being timed). When the gates and the first call come, they find
their programs compiled. On the H200, a step and one gate program took 14.3 s of wall time
side by side against 19.8 s one after the other (``benchmarks/xla_compile_flags.py``).

A job that fails in its thread is recorded, not raised: the gate that needs the program
compiles it again when it runs, and raises there, with its own context.

``compile_ahead``: the ladder's expected programs compiled before its first rung, in threads,
into JAX's persistent compilation cache (on a GPU a fresh folder per process,
``perfladder.jax.lab``). A rung's own compile then finds its program there and loads it: the
cache is keyed by the program's text without source locations, so the library's code, with
which the threads build each step, and a notebook's identical code give one key; a reader's
changed code gives another, and that rung compiles as it always did. What is compiled: each
expected step (``perfladder.ladder.expected``, R1 left out: its first call is where the chapter
shows what compiling costs), the step-form gates' 8-row steps, and the loss gates' plain bf16
reference at each beyond batch; with each step, the model gate's programs. Unlike the programs beside a rung
(no autotuning), these are autotuned as the rungs' own are, the threads' timing of candidate
GEMM algorithms sharing the GPU with one another (``benchmarks/jax_ahead_probe.py`` compares
the chosen kernels with those of a program compiled alone).
"""
from __future__ import annotations

import os
import queue
import threading
import time
from typing import Callable

from perfladder.jax.timer import cache_hit_count, compile_count

__all__ = ["Beside", "compile_ahead", "expected_jobs", "compiles", "summary"]


class Beside:
    """Run each of ``jobs`` (functions of no arguments) in a helper thread of its own, all
    started at once; ``join()`` waits for them and returns what they did: ``jobs``,
    ``seconds`` (wall, until the last finished), ``compilations`` (theirs, not the caller's)
    and, if one raised, the first ``error``."""

    def __init__(self, jobs: list[Callable[[], object]]):
        self.jobs = list(jobs)
        self._t0 = time.perf_counter()
        self._done: list[dict] = [{} for _ in self.jobs]
        self._threads = [threading.Thread(target=self._run, args=(job, out), daemon=True,
                                          name=f"perfladder-compile-beside-{i}")
                         for i, (job, out) in enumerate(zip(self.jobs, self._done))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _run(job: Callable[[], object], out: dict) -> None:
        c0 = compile_count(this_thread=True)
        try:
            job()
        except Exception as e:        # said in the report; the gate itself raises later
            out["error"] = f"{type(e).__name__}: {e}"[:500]
        finally:
            out["compilations"] = compile_count(this_thread=True) - c0
            out["end"] = time.perf_counter()

    def join(self) -> dict:
        for t in self._threads:
            t.join()
        report = {"jobs": len(self.jobs),
                  "seconds": max((d["end"] for d in self._done), default=self._t0) - self._t0,
                  "compilations": sum(d["compilations"] for d in self._done)}
        errors = [d["error"] for d in self._done if "error" in d]
        if errors:
            report["error"] = errors[0]
        return report


def ladder_ahead(lab, rungs: dict, names, workers: int | None = None) -> dict:
    """Compile the programs the ladder of ``rungs`` (running ``names``) is expected to build
    (``perfladder.ladder.expected``, guessed from the committed runs; ``expected_jobs``), the
    longest first, in ``workers`` threads; the report of ``compile_ahead``."""
    from perfladder.ladder import expected
    reference, history = expected.committed_runs(lab)
    recipes = expected.expected_recipes(lab, rungs, names, reference, history, compiles=compiles)
    costs = expected.expected_costs(reference)
    recipes = dict(sorted(recipes.items(), key=lambda kv: -costs.get(expected.rung_of(kv[0]), 0.0)))
    return compile_ahead(expected_jobs(lab, recipes), workers=workers)


def compiles(recipe) -> bool:
    """Whether ``recipe``'s step is compiled ahead: every jitted one (``perfladder.ladder.
    expected`` asks)."""
    return recipe.jit != "none"


def expected_jobs(lab, recipes: dict) -> dict[str, Callable[[], object]]:
    """``{name: job}`` for ``compile_ahead``: each of ``recipes`` (``{name: Recipe}``) compiled
    with the library's code on a gate batch of its shape, then its model gate's programs
    (``trial.gate_programs``: not autotuned); the step-form gates' steps for each jit form
    among them, and the loss gates' reference at each beyond batch among them. Not the
    un-jitted R0: its first call compiles some hundred small programs, one operation each,
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


def compile_ahead(jobs: dict[str, Callable[[], object]], workers: int | None = None) -> dict:
    """Run ``jobs`` (``expected_jobs``) in ``workers`` threads (default: half the CPU cores), one
    queue in the given order, and wait for them. Returns the report: ``steps``, ``workers``,
    ``seconds``, ``compiled`` (names), ``runs`` (``{name: [start, end]}``, wall-clock),
    ``compilations``, ``loaded`` (of those, how many a job loaded from the cache: another job's
    program, such as a model's initialisation, or an earlier build's) and ``failed``
    (``{name: error}``): a job that fails costs only its rung's compile."""
    t0 = time.perf_counter()
    n = max(1, min(len(jobs), workers or (os.cpu_count() or 2) // 2))
    report = {"steps": len(jobs), "workers": n if jobs else 0, "seconds": 0.0, "compiled": [],
              "failed": {}, "runs": {}, "compilations": 0, "loaded": 0}
    todo: queue.Queue = queue.Queue()
    for item in jobs.items():
        todo.put(item)
    lock = threading.Lock()

    def work():
        while True:
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
    for t in threads:
        t.join()
    report["seconds"] = time.perf_counter() - t0
    return report


def summary(report: dict) -> str:
    """One line for the result's notes and the page."""
    from perfladder.ladder.expected import summary as line
    return line(report, "programs", "threads",
                "each rung's compile then loads its program from JAX's persistent compilation cache")
