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


def test_a_launchs_recipe_is_resolved_for_the_childrens_devices_and_handed_over():
    """The rungs resolve the recipe for the GPUs the children get (``on_gpu``, not this
    process's jax); the launcher, below them, runs the recipe it is handed, refusing none."""
    from perfladder.config import get_config
    from perfladder.jax.parallel.launch import make_spec
    from perfladder.jax.rungs.recipes import recipe_for
    cfg = get_config("smoke")
    on_gpu = recipe_for(cfg, "fast", on_gpu=True)        # the fused kernel replaces cuDNN's
    assert on_gpu.attn_impl is None and on_gpu.fused == ("addnorm", "attention")
    assert recipe_for(cfg, "fast", on_gpu=False).fused == ()
    assert recipe_for(cfg, "seed", on_gpu=True).dtype == "float32"
    with pytest.raises(ValueError, match="has no field.*'mode'"):
        make_spec(cfg, "fast", {"batch_size": 8, "mode": "reduce-overhead"})
    with pytest.raises(ValueError, match=r"recipe=None.*perfladder\.jax\.rungs\.recipes\.recipe_for"):
        make_spec(cfg, "fast", None)
    spec = make_spec(cfg, "fast", on_gpu, check_recipe=recipe_for(cfg, "seed").to_dict())
    assert spec["recipe"] == on_gpu.to_dict() and spec["check_recipe"]["dtype"] == "float32"



def test_the_fast_form_is_the_fastest_configuration_not_a_list():
    """Without a ladder, the configuration the rung declarations walk to (GPU-only techniques on
    a GPU only); with one, the rung it kept last; the seed form is what R5 builds on."""
    from perfladder.config import get_config
    from perfladder.jax import RUNGS, Recipe
    from perfladder.jax.rungs.recipes import fast_recipe, recipe_for
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
