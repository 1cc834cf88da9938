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

from perfladder.torch.checks import CorrectnessError, MirrorError  # noqa: E402
from perfladder.torch.device import device_name, has_gpu, versions  # noqa: E402
from perfladder.torch.gates import GateError, PrecisionError  # noqa: E402
from perfladder.torch.idiom import TimeMachine, num_gpus, try_gpu  # noqa: E402
from perfladder.torch.kernels import kernel_breakdown  # noqa: E402
from perfladder.torch.lab import TorchLab  # noqa: E402
from perfladder.torch.model import GPT  # noqa: E402
from perfladder.torch.recipe import Recipe  # noqa: E402
from perfladder.torch.rungs import RUNGS, Ladder, run_ladder  # noqa: E402
from perfladder.torch.step import TrainStep, make_step  # noqa: E402
from perfladder.torch.stream import batches  # noqa: E402
from perfladder.torch.timer import throughput  # noqa: E402

__all__ = ["GPT", "batches", "throughput", "device_name", "has_gpu", "versions", "Recipe",
           "RUNGS", "Ladder", "run_ladder", "TorchLab", "kernel_breakdown", "make_step",
           "TrainStep", "GateError", "CorrectnessError", "MirrorError", "PrecisionError",
           "TimeMachine", "try_gpu", "num_gpus"]


def __getattr__(name: str):
    """``plt`` (the chapter's ``d2l.plt``): matplotlib.pyplot, imported on first use."""
    from perfladder.idiom import lazy_attribute
    return lazy_attribute(__name__, name)
