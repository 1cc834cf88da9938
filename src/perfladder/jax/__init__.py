"""perfladder's JAX / Flax NNX side. Imports jax, flax and optax -- never torch.

    import perfladder.config, perfladder.jax as pj
    result = pj.run_ladder(perfladder.config.get_config("smoke"))

The chapter's idiom works too: ``from perfladder import jax as d2l`` gives ``d2l.TimeMachine``,
``d2l.GPT``, ``d2l.try_gpu``, ``d2l.num_gpus`` and ``d2l.plt`` (see ``perfladder.jax.idiom``).
"""
from perfladder.jax.compiler import cublas_gemms, fast_cpu_compiles
from perfladder.jax.device import device_name, has_gpu, versions
from perfladder.jax.idiom import TimeMachine, num_gpus, try_gpu
from perfladder.jax.kernels import compiled_hlo_text, kernel_breakdown
from perfladder.jax.lab import JaxLab
from perfladder.jax.model import GPT
from perfladder.jax.recipe import Recipe
from perfladder.jax.rungs import RUNGS, Ladder, run_ladder
from perfladder.jax.step import TrainStep
from perfladder.jax.stream import batches
from perfladder.jax.timer import throughput

__all__ = ["GPT", "batches", "throughput", "device_name", "has_gpu", "versions", "Recipe",
           "RUNGS", "Ladder", "run_ladder", "JaxLab", "TrainStep", "kernel_breakdown",
           "compiled_hlo_text", "fast_cpu_compiles", "cublas_gemms", "TimeMachine", "try_gpu", "num_gpus"]


def __getattr__(name: str):
    """``plt`` (the chapter's ``d2l.plt``): matplotlib.pyplot, imported on first use."""
    from perfladder.idiom import lazy_attribute
    return lazy_attribute(__name__, name)
