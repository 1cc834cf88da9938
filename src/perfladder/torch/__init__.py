"""perfladder's PyTorch side (imports torch, never jax).

The profiler's CUDA instrumentation (CUPTI) must be torn down when a profile ends, or
every later timing in the process pays a per-launch tax; ``TEARDOWN_CUPTI=1`` asks
kineto to do that, and it has to be in the environment before the profiler first starts,
so it is set here, before anything else of ours touches torch.
"""
import os

os.environ["TEARDOWN_CUPTI"] = "1"

from .model import GPT  # noqa: E402
from .stream import batches  # noqa: E402
from .timer import device_name, has_gpu, throughput, versions  # noqa: E402

__all__ = ["GPT", "batches", "throughput", "device_name", "has_gpu", "versions"]
