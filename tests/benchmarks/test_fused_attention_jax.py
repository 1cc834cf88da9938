"""benchmarks/fused_attention_jax.py: its sweep's candidates each lower for CUDA at the model's
shape (so that the one GPU call times them all), and the pick of the fastest of each kernel."""
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


def test_best_is_the_fastest_measured_of_each_kernel():
    rows = {"fwd-a": {"side": "fwd", "launch": {"block_m": 64}, "fwd_ms": 2.0},
            "fwd-b": {"side": "fwd", "launch": {"block_m": 128}, "fwd_ms": 1.5},
            "fwd-c": {"side": "fwd", "launch": {"block_m": 32}, "error": "out of shared memory"},
            "bwd-a": {"side": "bwd", "launch": {"block": 64}, "fwd_ms": 0.5, "fwd_bwd_ms": 3.0},
            "bwd-b": {"side": "bwd", "launch": {"block": 128}, "fwd_ms": 0.4, "fwd_bwd_ms": 4.0}}
    best = _module().best_attention_configs(rows)
    assert best == {"FWD": {"name": "fwd-b", "launch": {"block_m": 128}, "fwd_ms": 1.5},
                    "BWD": {"name": "bwd-a", "launch": {"block": 64}, "fwd_bwd_ms": 3.0}}
    assert _module().best_attention_configs({"fwd-c": rows["fwd-c"]}) == {}


def test_every_candidate_lowers_for_cuda_at_the_model_shape(monkeypatch):
    import jax
    import jax.numpy as jnp

    from perfladder.jax.fused import attention as fattn
    from perfladder.jax.model import rope_tables

    module = _module()
    assert module.check_attention_configs("all") == list(module.ATTENTION_CONFIGS)
    H, Dh, T = 8, 64, 128
    cos, sin = rope_tables(T, Dh)
    x = jax.ShapeDtypeStruct((2, T, 3 * H * Dh), jnp.bfloat16)
    for name, (side, launch) in module.ATTENTION_CONFIGS.items():
        for key, value in launch.items():
            monkeypatch.setitem(fattn.FWD if side == "fwd" else fattn.BWD, key, value)

        def loss(q):
            return fattn.rope_attention(q, cos, sin, H, interpret=False).astype(jnp.float32).sum()
        text = jax.jit(jax.grad(loss)).trace(x).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") + text.count("triton_kernel_call") == 2, name
        monkeypatch.undo()


@pytest.mark.parametrize("value", ["fwd-64x64-w4-s2,nope", "fwd-7x7"])
def test_unknown_names_are_refused_with_the_choices(value):
    with pytest.raises(ValueError, match="not valid; valid choices: all, fwd-64x64-w4-s2"):
        _module().check_attention_configs(value)
