"""perfladder's JAX / Flax NNX side. Imports jax, flax and optax -- never torch.

    import perfladder.config, perfladder.jax as pj
    result = pj.run_ladder(perfladder.config.get_config("smoke"))

The chapter's idiom works too: ``from perfladder import jax as d2l`` gives ``d2l.TimeMachine``,
``d2l.GPT``, ``d2l.try_gpu``, ``d2l.num_gpus`` and ``d2l.plt`` (see ``perfladder.jax.idiom``).
"""
from .beyond import (BEYOND, Recipe, b1_embed_fp32, b2_onehot, b3_split_step, b4_cudnn,
                     b5_batch2, b6_batch4, fastest, kernel_report)
from .idiom import TimeMachine, num_gpus, try_gpu
from .kernels import compiled_hlo_text, kernel_breakdown
from .ladder import Ladder
from .model import GPT
from .rungs import (RUNGS, learning_check, r0_unjitted, r1_jit, r2_bf16, r2a_naive_cast,
                    r3_batch, r3c_fp32_control, r4_checkpoint, r5_data_parallel, r5_fsdp,
                    run_ladder)
from .steps import make_split_step, make_train_step
from .stream import batches
from .timer import device_name, fast_cpu_compiles, has_gpu, throughput, versions

__all__ = ["GPT", "batches", "throughput", "device_name", "has_gpu", "versions",
           "Ladder", "RUNGS", "run_ladder", "learning_check",
           "r0_unjitted", "r1_jit", "r2a_naive_cast", "r2_bf16", "r3c_fp32_control", "r3_batch",
           "r4_checkpoint", "r5_data_parallel", "r5_fsdp",
           "b1_embed_fp32", "b2_onehot", "b3_split_step", "b4_cudnn", "b5_batch2", "b6_batch4",
           "BEYOND", "Recipe", "fastest", "kernel_report", "kernel_breakdown", "compiled_hlo_text",
           "make_train_step", "make_split_step", "fast_cpu_compiles",
           "TimeMachine", "try_gpu", "num_gpus"]


def __getattr__(name: str):
    """``plt`` (the chapter's ``d2l.plt``): matplotlib.pyplot, imported on first use."""
    from ..idiom import lazy_attribute
    return lazy_attribute(__name__, name)
