"""The JAX ladder: its registry of rung declarations, and how to run it on the engine.

    import perfladder.config, perfladder.jax as pj
    result = pj.run_ladder(perfladder.config.get_config("smoke"))       # everything
    run = pj.Ladder(perfladder.config.get_config("smoke"))              # rung by rung
    run.run("R0"); run.run("R1", jit_step=my_jit)                      # a technique of your own
"""
from __future__ import annotations

from perfladder import ahead as compile_ahead
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
    compile the expected programs first (``perfladder.ahead``; None: only what a book build's
    stage compiled before the notebook)."""
    lab = JaxLab(config, command)
    compile_ahead.before_first_rung(lab, RUNGS, engine.check_rungs(RUNGS, None), ahead)
    return engine.LadderRun(lab, RUNGS)


def run_ladder(config: LadderConfig, rungs=None, learn: bool = True, progress=None,
               command: str = "", optional: bool = False, kernels: bool = True,
               resume=None, checkpoint=None, ahead: bool | None = None) -> LadderResult:
    """Run ``rungs`` (default: every non-optional rung) in ladder order, then the kernel
    report and the learning check of the fastest configuration; see ``perfladder.ladder.engine``."""
    names = engine.check_rungs(RUNGS, rungs, optional=optional)     # bad names: before any setup
    lab = JaxLab(config, command)
    compile_ahead.before_first_rung(lab, RUNGS, names, ahead)
    return engine.run_ladder(lab, RUNGS, names, learn=learn, progress=progress,
                             optional=optional, kernels=kernels, resume=resume,
                             checkpoint=checkpoint)
