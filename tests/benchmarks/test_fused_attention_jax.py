"""benchmarks/fused_attention_jax.py: its sweep's configurations each lower for CUDA at the
model's shape (so that the one GPU call times them all), the parsing of --attention-configs,
and the pick of the fastest matching configuration of each kernel."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location(
        "fused_attention_jax", ROOT / "benchmarks" / "fused_attention_jax.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_best_is_the_fastest_of_each_part_that_matches_the_default():
    rows = {"fwd:64/64/4/2": dict(part="fwd", block_m=64, block_n=64, num_warps=4, num_stages=2,
                                  matches_default=True, ms=2.0),
            "fwd:64/32/4/2": dict(part="fwd", block_m=64, block_n=32, num_warps=4, num_stages=2,
                                  matches_default=True, ms=1.5),
            "fwd:128/64/8/2": dict(part="fwd", block_m=128, block_n=64, num_warps=8, num_stages=2,
                                   matches_default=False, ms=0.5),          # wrong: never the best
            "bwd:64/32/4/2": dict(part="bwd", block=64, inner=32, num_warps=4, num_stages=2,
                                  matches_default=True, ms=3.0)}
    best = _module().best_attention_configs(rows)
    assert best == {"fwd": dict(config="fwd:64/32/4/2", ms=1.5, block_m=64, block_n=32, num_warps=4, num_stages=2),
                    "bwd": dict(config="bwd:64/32/4/2", ms=3.0, block=64, inner=32, num_warps=4, num_stages=2)}
    assert _module().best_attention_configs({"fwd:128/64/8/2": rows["fwd:128/64/8/2"]}) == {}
    # B12's kernels (the bias on load) are picked among their own rows only
    biased = {"bwd:64/64/8/1+bias": dict(part="bwd", bias=True, block=64, inner=64, num_warps=8,
                                         num_stages=1, matches_default=True, ms=2.5)}
    best = _module().best_attention_configs({**rows, **biased})
    assert best["bwd"]["config"] == "bwd:64/32/4/2"          # not the faster biased one
    assert best["bwd+bias"] == dict(config="bwd:64/64/8/1+bias", ms=2.5, block=64, inner=64,
                                    num_warps=8, num_stages=1)
    assert "fwd+bias" not in best


def test_parse_and_its_refusals():
    module = _module()
    assert module.parse_attention_configs("fwd:64/32/8/1, bwd:64/32/4/2") == [
        ("fwd:64/32/8/1", "fwd", dict(block_m=64, block_n=32, num_warps=8, num_stages=1)),
        ("bwd:64/32/4/2", "bwd", dict(block=64, inner=32, num_warps=4, num_stages=2))]
    assert [s for s, _, _ in module.parse_attention_configs("sweep")] == list(module.JAX_ATTENTION_SWEEP)
    for bad in ("fwd:64/32/4", "fwd:48/32/4/2", "bwd:64/8/4/2", "mid:64/64/4/2", "fwd:64/64/0/2"):
        with pytest.raises(ValueError, match=f"entry '{bad}' is not valid; valid: fwd:BLOCK_M"):
            module.parse_attention_configs(bad)


def test_every_swept_configuration_lowers_for_cuda_at_the_model_shape(monkeypatch):
    import jax
    import jax.numpy as jnp

    from perfladder.jax.fused import attention as fattn
    from perfladder.jax.model import rope_tables

    module = _module()
    H, Dh, T = 8, 64, 128
    cos, sin = rope_tables(T, Dh)
    x = jax.ShapeDtypeStruct((2, T, 3 * H * Dh), jnp.bfloat16)
    for spec, part, launch in module.parse_attention_configs("sweep"):
        for key, value in launch.items():
            monkeypatch.setitem(fattn.FWD if part == "fwd" else fattn.BWD, key, value)

        def loss(q):
            return fattn.rope_attention(q, cos, sin, H, interpret=False).astype(jnp.float32).sum()
        text = jax.jit(jax.grad(loss)).trace(x).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") + text.count("triton_kernel_call") == 2, spec
        monkeypatch.undo()
