"""perfladder's PyTorch side (imports torch, never jax).

    from perfladder import torch as pt
    run = pt.Ladder(config)          # a LadderRun: run.run("R0"), run.result, ...
    result = pt.run_ladder(config)   # every default rung, the kernel report, the learning check

The profiler's CUDA instrumentation (CUPTI) must be torn down when a profile ends, or
every later timing in the process pays a per-launch tax; ``TEARDOWN_CUPTI=1`` asks
kineto to do that, and it has to be in the environment before the profiler first starts,
so it is set here, before anything else of ours touches torch.
"""
import os

os.environ["TEARDOWN_CUPTI"] = "1"

from perfladder.ladder.engine import LadderRun, check_rungs, registry  # noqa: E402
from perfladder.ladder.engine import run_ladder as _run_ladder  # noqa: E402
from perfladder.torch.gates import (
    CorrectnessError,
    GateError,
    MirrorError,
    PrecisionError,
)  # noqa: E402
from perfladder.torch.idiom import TimeMachine, num_gpus, try_gpu  # noqa: E402
from perfladder.torch.kernels import kernel_breakdown  # noqa: E402
from perfladder.torch.lab import TorchLab  # noqa: E402
from perfladder.torch.model import GPT  # noqa: E402
from perfladder.torch.recipe import Recipe  # noqa: E402
from perfladder.torch.rungs.beyond import BEYOND  # noqa: E402
from perfladder.torch.rungs.multigpu import MULTI  # noqa: E402
from perfladder.torch.rungs.seed import SEED  # noqa: E402
from perfladder.torch.step import TrainStep, make_step  # noqa: E402
from perfladder.torch.stream import batches  # noqa: E402
from perfladder.torch.timer import device_name, has_gpu, throughput, versions  # noqa: E402

RUNGS = registry([*SEED, *BEYOND, *MULTI])


def Ladder(config, command: str = "", device=None) -> LadderRun:
    """A ladder to run rung by rung: ``run.run("R0")`` returns R0's ``RungResult``."""
    return LadderRun(TorchLab(config, device=device, command=command), RUNGS)


def run_ladder(config, rungs=None, learn: bool = True, progress=None, command: str = "",
               optional: bool = False, kernels: bool = True, device=None, resume=None,
               checkpoint=None):
    """Every default rung (or ``rungs``), the kernel report of the fastest configuration and
    its learning check; returns the ``LadderResult``."""
    check_rungs(RUNGS, rungs)               # a typo is refused before the lab loads and probes
    lab = TorchLab(config, device=device, command=command)
    return _run_ladder(lab, RUNGS, rungs, learn=learn, progress=progress, optional=optional,
                       kernels=kernels, resume=resume, checkpoint=checkpoint)


__all__ = ["GPT", "batches", "throughput", "device_name", "has_gpu", "versions", "Recipe",
           "RUNGS", "Ladder", "run_ladder", "TorchLab", "kernel_breakdown", "make_step",
           "TrainStep", "GateError", "CorrectnessError", "MirrorError", "PrecisionError",
           "TimeMachine", "try_gpu", "num_gpus"]


def __getattr__(name: str):
    """``plt`` (the chapter's ``d2l.plt``): matplotlib.pyplot, imported on first use."""
    from perfladder.idiom import lazy_attribute
    return lazy_attribute(__name__, name)
