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
    on_gpu = resolve_recipe(cfg, "fast", None, gpus=2)   # the fused kernel replaces cuDNN's
    assert on_gpu.attn_impl is None and on_gpu.fused == ("addnorm", "attention")
    assert resolve_recipe(cfg, "fast", None, gpus=0).fused == ()
    assert resolve_recipe(cfg, "seed", None, gpus=2).dtype == "float32"
    with pytest.raises(ValueError, match="has no field.*'mode'"):
        resolve_recipe(cfg, "fast", {"batch_size": 8, "mode": "reduce-overhead"}, gpus=0)


def test_the_fast_form_is_the_fastest_configuration_not_a_list():
    """Without a ladder, the configuration the rung declarations walk to (GPU-only techniques on
    a GPU only); with one, the rung it kept last; the seed form is what R5 builds on."""
    from perfladder.config import get_config
    from perfladder.jax import RUNGS, Recipe
    from perfladder.jax.parallel.measure import fast_recipe, recipe_for
    from perfladder.ladder.declared import recipe_of
    from perfladder.results.record import LadderResult, RungResult
    cfg = get_config("smoke")
    walked = fast_recipe(cfg, on_gpu=False)
    assert walked == Recipe(batch_size=4 * cfg.big_batch, jit="split", dtype="bfloat16", embed_fp32=True)
    assert fast_recipe(cfg, on_gpu=True) == walked.replace(fused=("addnorm", "attention"))
    ran = LadderResult(framework="jax", device="cpu", config=cfg.to_dict(), baseline="R1")
    kept = walked.replace(jit="nnx")
    ran.add(RungResult(name="B3", key="split_jit", label="split", tokens_per_s=100.0, stage="beyond",
                       kept=True, recipe=kept.to_dict()))
    assert fast_recipe(cfg, ran) == kept
    assert recipe_for(cfg, "seed") == recipe_of(RUNGS, RUNGS["R5"].builds_on, Recipe.seed(cfg), cfg)
    with pytest.raises(ValueError, match="the chapter's fixed recipe"):
        recipe_for(cfg, "seed", kept)
