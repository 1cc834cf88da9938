"""perfladder's PyTorch side (imports torch, never jax).

The profiler's CUDA instrumentation (CUPTI) must be torn down when a profile ends, or
every later timing in the process pays a per-launch tax; ``TEARDOWN_CUPTI=1`` asks
kineto to do that, and it has to be in the environment before the profiler first starts,
so it is set here, before anything else of ours touches torch.
"""
import os

os.environ["TEARDOWN_CUPTI"] = "1"

from .beyond import (Recipe, b1_fused_adamw, b2_compiled_adamw, b3_cudagraphs,  # noqa: E402
                     b4_onehot_embedding, b5_batch_x2, b6_batch_x4, b7_attention_backend,
                     b8_max_autotune, kernel_report)
from .ddp import ddp_tokens  # noqa: E402
from .gates import CorrectnessError, GateError, MirrorError, PrecisionError  # noqa: E402
from .idiom import TimeMachine, num_gpus, try_gpu  # noqa: E402
from .kernels import kernel_breakdown  # noqa: E402
from .ladder import Ladder  # noqa: E402
from .model import GPT  # noqa: E402
from .profile import profile_table  # noqa: E402
from .rungs import (DEFAULT_RUNGS, RUNGS, learning_check, r0_eager, r1_compile,  # noqa: E402
                    r2_bf16, r3_batch, r3c_fp32_control, r4_checkpoint, r5_ddp, run_ladder)
from .steps import TrainStep, make_step  # noqa: E402
from .stream import batches  # noqa: E402
from .timer import device_name, has_gpu, throughput, versions  # noqa: E402

__all__ = [
    "GPT", "batches", "throughput", "device_name", "has_gpu", "versions",
    "Ladder", "RUNGS", "DEFAULT_RUNGS", "run_ladder", "learning_check",
    "r0_eager", "r1_compile", "r2_bf16", "r3c_fp32_control", "r3_batch", "r4_checkpoint", "r5_ddp",
    "b1_fused_adamw", "b2_compiled_adamw", "b3_cudagraphs", "b4_onehot_embedding", "b5_batch_x2",
    "b6_batch_x4", "b7_attention_backend", "b8_max_autotune", "Recipe", "kernel_report",
    "kernel_breakdown", "make_step", "TrainStep", "profile_table", "ddp_tokens",
    "GateError", "CorrectnessError", "MirrorError", "PrecisionError",
    "TimeMachine", "try_gpu", "num_gpus",
]


def __getattr__(name: str):
    """``plt`` (the chapter's ``d2l.plt``): matplotlib.pyplot, imported on first use."""
    from ..idiom import lazy_attribute
    return lazy_attribute(__name__, name)
