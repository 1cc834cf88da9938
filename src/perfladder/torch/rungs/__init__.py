"""The PyTorch ladder: its registry of rung declarations, and how to run it on the engine.

    import perfladder.config, perfladder.torch as pt
    result = pt.run_ladder(perfladder.config.get_config("smoke"))       # everything
    run = pt.Ladder(perfladder.config.get_config("smoke"))              # rung by rung
    run.run("R0"); run.run("R1", compile_model=my_compile)              # a technique of your own
"""
from __future__ import annotations

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
    ``ahead``: compile the expected steps first, in helper processes (``perfladder.torch.ahead``;
    None: when the full config runs on a GPU, where compiles are what a build waits for)."""
    lab = TorchLab(config, device=device, command=command)
    _ahead(lab, engine.check_rungs(RUNGS, None), ahead)
    return engine.LadderRun(lab, RUNGS)


def run_ladder(config: LadderConfig, rungs=None, learn: bool = True, progress=None,
               command: str = "", optional: bool = False, kernels: bool = True, device=None,
               resume=None, checkpoint=None, ahead: bool | None = None) -> LadderResult:
    """Run ``rungs`` (default: every non-optional rung) in ladder order, then the kernel
    report and the learning check of the fastest configuration; see ``perfladder.ladder.engine``."""
    names = engine.check_rungs(RUNGS, rungs, optional=optional)     # bad names: before any setup
    lab = TorchLab(config, device=device, command=command)
    _ahead(lab, names, ahead)
    return engine.run_ladder(lab, RUNGS, names,
                             learn=learn, progress=progress, optional=optional, kernels=kernels,
                             resume=resume, checkpoint=checkpoint)


def _ahead(lab: TorchLab, names, ahead: bool | None) -> None:
    """The ladder's expected steps compiled before its first rung, said in the result's notes
    (and on stdout: a minute in which nothing else appears to run): the book build's stage
    (``perfladder.book.ahead``), when it ran for this framework and config, else in helper
    processes here (``perfladder.torch.ahead``). ``ahead=None``: here only for the full config
    on a GPU (the smoke config's compiles take seconds on a CPU, where helpers would cost more
    than they save); ``False``: neither."""
    from perfladder.ladder.expected import take_ahead
    from perfladder.torch import ahead as compile_ahead
    take_ahead(lab, ahead, lab.on_gpu and not lab.config.is_smoke,
               lambda: compile_ahead.ladder_ahead(lab, RUNGS, names), compile_ahead.summary)


def ahead_stage(config: LadderConfig, rungs=None, reserve_bytes: float = 0.0) -> dict:
    """A book build's compile-ahead for this ladder (``perfladder.book.ahead``), in this
    process: a lab, the expected steps (``rungs``: only these rungs') in helpers that leave
    ``reserve_bytes`` of the free device memory to others; the report."""
    from perfladder.torch import ahead as compile_ahead
    names = engine.check_rungs(RUNGS, rungs)          # a bad name: before any setup
    lab = TorchLab(config, probe=False)
    room = max(0.0, compile_ahead.device_room(lab) - reserve_bytes)
    return compile_ahead.ladder_ahead(lab, RUNGS, names, room=room)
