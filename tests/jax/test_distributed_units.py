"""perfladder.jax.parallel.launch's pieces that need no second process: input checks and the
memory numbers' trip through a 32-bit gather."""
import jax
import numpy as np
import pytest

from perfladder.jax.parallel.launch import initialize, kib_to_bytes, mem_to_kib


def test_peak_memory_survives_a_32_bit_gather():
    peaks = [35_829_397_248, None, 1024]                    # an H200's 35.8 GB fast-form peak
    kib = mem_to_kib(peaks)
    assert kib.dtype == np.int32
    through = np.asarray(jax.numpy.asarray(kib))            # what process_allgather hands back
    back = kib_to_bytes(through)
    assert back[1] is None and back[2] == 1024
    assert 0 <= back[0] - peaks[0] < 1024                   # to the KiB, never wrapped
    wrapped = int(np.asarray(jax.numpy.asarray(np.int64(peaks[0]))))   # the bug this avoids
    assert wrapped != peaks[0]


@pytest.mark.parametrize("kw,match", [
    (dict(coordinator="localhost", num_processes=2, process_id=0), "HOST:PORT"),
    (dict(coordinator="localhost:1234", num_processes=2, process_id=2), r"process_id=2 must be in 0\.\.1"),
    (dict(coordinator="localhost:1234", num_processes=2, process_id=True), "process_id=True"),
])
def test_initialize_checks_its_arguments_before_connecting(kw, match):
    with pytest.raises(ValueError, match=match):
        initialize(**kw)


def test_the_launcher_resolves_the_attention_kernel_from_its_gpu_count():
    from perfladder.config import get_config
    from perfladder.jax.parallel.launch import resolve_recipe
    cfg = get_config("smoke")
    assert resolve_recipe(cfg, "fast", None, gpus=2)["attn_impl"] == "cudnn"
    assert resolve_recipe(cfg, "fast", None, gpus=0)["attn_impl"] is None
    assert resolve_recipe(cfg, "seed", None, gpus=2)["dtype"] == "float32"
    with pytest.raises(ValueError, match="unknown recipe keys.*'mode'"):
        resolve_recipe(cfg, "fast", {"batch_size": 8, "mode": "reduce-overhead"}, gpus=0)
