"""A rung's programs compiled side by side, before any of them runs: ``Beside``.

XLA compiles in C++ with Python's lock released, so several threads compile several programs
at once. A JAX rung compiles its timed step on the calling thread (with XLA's GEMM autotuning,
which times candidate kernels on the GPU) while helper threads compile the programs its gates
will run (``perfladder.jax.gate_programs``: no autotuning, so nothing of theirs runs on the GPU
while the step's kernels are being timed). When the gates and the first call come, they find
their programs compiled. On the H200, a step and one gate program took 14.3 s of wall time
side by side against 19.8 s one after the other (``benchmarks/results/h200-jax-cli``).

A job that fails in its thread is recorded, not raised: the gate that needs the program
compiles it again when it runs, and raises there, with its own context.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from perfladder.jax.timer import compile_count

__all__ = ["Beside"]


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
