"""The JAX ladder: its registry of rung declarations, and how to run it on the engine.

    import perfladder.config, perfladder.jax as pj
    result = pj.run_ladder(perfladder.config.get_config("smoke"))       # everything
    run = pj.Ladder(perfladder.config.get_config("smoke"))              # rung by rung
    run.run("R0"); run.run("R1"); print(perfladder.pages.report.text_table(run.result))
"""
from __future__ import annotations

from perfladder.config import LadderConfig
from perfladder.jax.lab import JaxLab
from perfladder.jax.rungs.beyond import BEYOND
from perfladder.jax.rungs.multigpu import MULTI_GPU
from perfladder.jax.rungs.seed import SEED
from perfladder.ladder import engine as engine
from perfladder.results.record import LadderResult

RUNGS = engine.registry(SEED + BEYOND + MULTI_GPU)


def Ladder(config: LadderConfig, command: str = "") -> engine.LadderRun:
    """A JAX ladder to run rung by rung (``.run(name)``), on a fresh ``JaxLab``."""
    return engine.LadderRun(JaxLab(config, command), RUNGS)


def run_ladder(config: LadderConfig, rungs=None, learn: bool = True, progress=None,
               command: str = "", optional: bool = False, kernels: bool = True,
               resume=None) -> LadderResult:
    """Run ``rungs`` (default: every non-optional rung) in ladder order, then the kernel
    report and the learning check of the fastest configuration; see ``perfladder.ladder.engine``."""
    names = engine.check_rungs(RUNGS, rungs, optional=optional)     # bad names: before any setup
    return engine.run_ladder(JaxLab(config, command), RUNGS, names, learn=learn, progress=progress,
                             optional=optional, kernels=kernels, resume=resume)
