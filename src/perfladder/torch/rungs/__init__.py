"""The PyTorch ladder: its registry of rung declarations, and how to run it on the engine.

    import perfladder.config, perfladder.torch as pt
    result = pt.run_ladder(perfladder.config.get_config("smoke"))       # everything
    run = pt.Ladder(perfladder.config.get_config("smoke"))              # rung by rung
    run.run("R0"); run.run("R1", compile_model=my_compile)              # a technique of your own
"""
from __future__ import annotations

from perfladder import ahead as compile_ahead
from perfladder.config import LadderConfig
from perfladder.ladder import engine
from perfladder.results.record import LadderResult
from perfladder.torch.lab import TorchLab
from perfladder.torch.rungs.beyond import BEYOND
from perfladder.torch.rungs.multigpu import MULTI_GPU
from perfladder.torch.rungs.seed import SEED

RUNGS = engine.registry(SEED + BEYOND + MULTI_GPU)


def Ladder(config: LadderConfig, command: str = "", device=None, ahead: bool | None = None
           ) -> engine.LadderRun:
    """A PyTorch ladder to run rung by rung (``.run(name)``), on a fresh ``TorchLab``.
    ``ahead``: compile the expected steps first, in helper processes (``perfladder.ahead``;
    None: when the full config runs on a GPU, where compiles are what a build waits for)."""
    lab = TorchLab(config, device=device, command=command)
    compile_ahead.before_first_rung(lab, RUNGS, engine.check_rungs(RUNGS, None), ahead)
    return engine.LadderRun(lab, RUNGS)


def run_ladder(config: LadderConfig, rungs=None, learn: bool = True, progress=None,
               command: str = "", optional: bool = False, kernels: bool = True, device=None,
               resume=None, checkpoint=None, ahead: bool | None = None) -> LadderResult:
    """Run ``rungs`` (default: every non-optional rung) in ladder order, then the kernel
    report and the learning check of the fastest configuration; see ``perfladder.ladder.engine``."""
    names = engine.check_rungs(RUNGS, rungs, optional=optional)     # bad names: before any setup
    lab = TorchLab(config, device=device, command=command)
    compile_ahead.before_first_rung(lab, RUNGS, names, ahead)
    return engine.run_ladder(lab, RUNGS, names,
                             learn=learn, progress=progress, optional=optional, kernels=kernels,
                             resume=resume, checkpoint=checkpoint)
