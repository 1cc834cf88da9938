"""perfladder's JAX / Flax NNX side. Imports jax, flax and optax -- never torch."""
from .model import GPT
from .stream import batches
from .timer import device_name, has_gpu, throughput, versions

__all__ = ["GPT", "batches", "throughput", "device_name", "has_gpu", "versions"]
