"""The JAX ladder: its registry of rung declarations, and how to run it on the engine.

    import perfladder.config, perfladder.jax as pj
    result = pj.run_ladder(perfladder.config.get_config("smoke"))       # everything
    run = pj.Ladder(perfladder.config.get_config("smoke"))              # rung by rung
    run.run("R0"); run.run("R1", jit_step=my_jit)                      # a technique of your own
"""
from __future__ import annotations

from perfladder.config import LadderConfig
from perfladder.jax.lab import JaxLab
from perfladder.jax.rungs.beyond import BEYOND
from perfladder.jax.rungs.multigpu import MULTI_GPU
from perfladder.jax.rungs.seed import SEED
from perfladder.ladder import engine
from perfladder.results.record import LadderResult

RUNGS = engine.registry(SEED + BEYOND + MULTI_GPU)


def Ladder(config: LadderConfig, command: str = "", ahead: bool | None = None) -> engine.LadderRun:
    """A JAX ladder to run rung by rung (``.run(name)``), on a fresh ``JaxLab``. ``ahead``:
    compile the expected programs first (see ``_ahead``; None: only what a book build's stage
    compiled before the notebook)."""
    lab = JaxLab(config, command)
    _ahead(lab, engine.check_rungs(RUNGS, None), ahead)
    return engine.LadderRun(lab, RUNGS)


def run_ladder(config: LadderConfig, rungs=None, learn: bool = True, progress=None,
               command: str = "", optional: bool = False, kernels: bool = True,
               resume=None, checkpoint=None, ahead: bool | None = None) -> LadderResult:
    """Run ``rungs`` (default: every non-optional rung) in ladder order, then the kernel
    report and the learning check of the fastest configuration; see ``perfladder.ladder.engine``."""
    names = engine.check_rungs(RUNGS, rungs, optional=optional)     # bad names: before any setup
    lab = JaxLab(config, command)
    _ahead(lab, names, ahead)
    return engine.run_ladder(lab, RUNGS, names, learn=learn, progress=progress,
                             optional=optional, kernels=kernels, resume=resume,
                             checkpoint=checkpoint)


def _ahead(lab: JaxLab, names, ahead: bool | None) -> None:
    """The ladder's expected programs compiled before its first rung, said in the result's
    notes (and on stdout): the book build's stage (``perfladder.book.ahead``), when it ran for
    this framework and config, else, with ``ahead=True``, in threads here
    (``perfladder.jax.ahead``). ``ahead=None`` does not compile here: measured on the H200,
    the threads took longer than the compiles they saved the rungs, and without the job that
    held them up they would have saved little (``benchmarks/results/h200-jax-ahead-2026-12-03``);
    beside the PyTorch helpers, in the book's stage, their time is hidden. ``False``: neither."""
    from perfladder.jax import ahead as compile_ahead
    from perfladder.ladder.expected import take_ahead
    take_ahead(lab, ahead, False,
               lambda: compile_ahead.ladder_ahead(lab, RUNGS, names), compile_ahead.summary)


def ahead_stage(config: LadderConfig, rungs=None, workers: int | None = None,
                enough=None) -> dict:
    """A book build's compile-ahead for this ladder (``perfladder.book.ahead``), in this
    process: XLA's settings the notebook makes before the backend starts, a lab, the expected
    programs (``rungs``: only these rungs') in ``workers`` threads, no more started once
    ``enough()`` says so; the report."""
    from perfladder.jax import ahead as compile_ahead
    from perfladder.jax.compiler import cublas_gemms, fast_cpu_compiles
    fast_cpu_compiles() if config.is_smoke else cublas_gemms()
    names = engine.check_rungs(RUNGS, rungs)          # a bad name: before any setup
    return compile_ahead.ladder_ahead(JaxLab(config, probe=False), RUNGS, names, workers=workers,
                                      enough=enough)
