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
    compile the expected programs first, in threads (``perfladder.jax.ahead``; None: when the
    full config runs on a GPU, where compiles are what a build waits for)."""
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
    """Compile the ladder's expected programs in threads before its first rung, and say so in
    the result's notes (and on stdout). ``ahead=None``: only for the full config on a GPU (on a
    CPU the smoke config's compiles are seconds, and its cache is shared already)."""
    if ahead is None:
        ahead = lab.on_gpu and not lab.config.is_smoke
    if not ahead:
        return
    from perfladder.jax import ahead as compile_ahead
    from perfladder.ladder import expected
    reference, history = expected.committed_runs(lab)
    recipes = expected.expected_recipes(lab, RUNGS, names, reference, history,
                                        compiles=compile_ahead.compiles)
    costs = expected.expected_costs(reference)
    recipes = dict(sorted(recipes.items(), key=lambda kv: -costs.get(expected.rung_of(kv[0]), 0.0)))
    report = compile_ahead.compile_ahead(compile_ahead.expected_jobs(lab, recipes))
    lab.result.ahead = report
    lab.result.notes.append(compile_ahead.summary(report))
    print(f"perfladder: {lab.result.notes[-1]}", flush=True)
