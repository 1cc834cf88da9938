"""perfladder's JAX / Flax NNX side. Imports jax, flax and optax -- never torch.

    from perfladder import jax as pj
    result = pj.run_ladder(perfladder.config.get_config('smoke'))
"""
from .ladder import Ladder
from .model import GPT
from .rungs import RUNGS, learning_check, run_ladder
from .steps import make_split_step, make_train_step
from .stream import batches
from .timer import device_name, has_gpu, throughput, versions

__all__ = ["GPT", "batches", "throughput", "device_name", "has_gpu", "versions",
           "Ladder", "RUNGS", "run_ladder", "learning_check",
           "make_train_step", "make_split_step"]
