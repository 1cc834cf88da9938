"""perfladder.hardware: peak lookup by the names the frameworks report, MFU arithmetic."""
from __future__ import annotations

import pytest

from perfladder.hardware import achieved_tflops, mfu, peak_for


@pytest.mark.parametrize("name, bf16, tf32", [
    ("NVIDIA H200", 989.5, 494.7),                   # torch.cuda.get_device_name / jax device_kind
    ("NVIDIA GeForce RTX 4090", 165.2, 82.6),
    ("NVIDIA A100-SXM4-80GB", 312.0, 156.0),
    ("NVIDIA A100-PCIE-40GB", 312.0, 156.0),
    ("NVIDIA H100 80GB HBM3", 989.5, 494.7),         # the SXM part
    ("NVIDIA H100 PCIe", 756.5, 378.0),
])
def test_peak_lookup(name, bf16, tf32):
    peak = peak_for(name)
    assert peak is not None
    assert (peak.bf16, peak.tf32) == (bf16, tf32)
    assert peak.tflops("bf16") == bf16 and peak.tflops("tf32") == tf32


@pytest.mark.parametrize("name", ["cpu", "TFRT_CPU_0", "NVIDIA GeForce RTX 3090", "", None])
def test_unknown_device_has_no_peak_and_no_mfu(name):
    assert peak_for(name) is None
    assert mfu(1e6, 1e8, name) is None


def test_mfu_by_hand():
    # 1.2M tokens/s at 114M FLOPs/token = 136.8 TFLOP/s; H200 dense bf16 989.5 -> 13.825...%
    tokens, fpt = 1.2e6, 1.14e8
    assert achieved_tflops(tokens, fpt) == pytest.approx(136.8)
    assert mfu(tokens, fpt, "NVIDIA H200") == pytest.approx(136.8 / 989.5)
    assert mfu(tokens, fpt, "NVIDIA H200", precision="tf32") == pytest.approx(136.8 / 494.7)
    # RTX 4090: 136.8 / 165.2
    assert mfu(tokens, fpt, "NVIDIA GeForce RTX 4090") == pytest.approx(0.828087, rel=1e-5)


def test_no_measured_literal_in_the_peak_table():
    """A rate "against the measured roof" comes from the run's own probe (LadderResult.roofs),
    never from a number written into the table."""
    from perfladder.hardware import PEAKS
    assert all(not hasattr(p, "measured_bf16") for _, p in PEAKS)
    with pytest.raises(TypeError):
        mfu(1e6, 1e8, "NVIDIA H200", measured=True)


def test_bad_precision_lists_choices():
    with pytest.raises(ValueError, match=r"precision='fp16'.*valid choices: \('bf16', 'tf32'\)"):
        mfu(1e6, 1e8, "NVIDIA H200", precision="fp16")
    with pytest.raises(ValueError, match="valid choices"):
        peak_for("NVIDIA H200").tflops("fp8")
