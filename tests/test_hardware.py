"""perfladder.hardware: peak lookup by the names the frameworks report, what each card computes
in, MFU arithmetic."""
from __future__ import annotations

import pytest

from perfladder.hardware import PEAKS, achieved_tflops, mfu, peak_for, supports_bf16


@pytest.mark.parametrize("name, bf16, tf32", [
    ("NVIDIA H200", 989.5, 494.7),                   # torch.cuda.get_device_name / jax device_kind
    ("NVIDIA GeForce RTX 4090", 165.2, 82.6),
    ("NVIDIA A100-SXM4-80GB", 312.0, 156.0),
    ("NVIDIA A100-PCIE-40GB", 312.0, 156.0),
    ("NVIDIA H100 80GB HBM3", 989.5, 494.7),         # the SXM part
    ("NVIDIA H100 PCIe", 756.5, 378.0),
    ("NVIDIA GeForce RTX 3090", 71.0, 35.6),
    ("NVIDIA L4", 121.0, 60.0),
    ("NVIDIA A10G", 70.0, 35.0),
    ("NVIDIA A10", 125.0, 62.5),
])
def test_peak_lookup(name, bf16, tf32):
    peak = peak_for(name)
    assert peak is not None
    assert (peak.bf16, peak.tf32) == (bf16, tf32)
    assert peak.tflops("bf16") == bf16 and peak.tflops("tf32") == tf32


@pytest.mark.parametrize("name", ["cpu", "TFRT_CPU_0", "NVIDIA GeForce RTX 3080", "", None])
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
    assert all(not hasattr(p, "measured_bf16") for _, _, p in PEAKS)
    with pytest.raises(TypeError):
        mfu(1e6, 1e8, "NVIDIA H200", measured=True)


def test_bad_precision_lists_choices():
    with pytest.raises(ValueError, match=r"precision='fp16'.*valid choices: \('bf16', 'tf32'\)"):
        mfu(1e6, 1e8, "NVIDIA H200", precision="fp16")
    with pytest.raises(ValueError, match="valid choices"):
        peak_for("NVIDIA H200").tflops("fp8")


# The cards readers have, as torch.cuda.get_device_name and JAX's device_kind spell them.
CARDS = [
    ("NVIDIA L4", "NVIDIA L4", (8, 9)),
    ("NVIDIA L40S", "NVIDIA L40S", (8, 9)),
    ("NVIDIA A10G", "NVIDIA A10G", (8, 6)),
    ("NVIDIA A10", "NVIDIA A10", (8, 6)),
    ("Tesla T4", "NVIDIA T4", (7, 5)),
    ("Tesla V100-SXM2-16GB", "NVIDIA V100", (7, 0)),
    ("Tesla V100-PCIE-32GB", "NVIDIA V100", (7, 0)),
    ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090", (8, 6)),
    ("NVIDIA GeForce RTX 4080", "NVIDIA GeForce RTX 4080", (8, 9)),
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", (8, 9)),
    ("NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090", (12, 0)),
    ("NVIDIA RTX A6000", "NVIDIA RTX A6000", (8, 6)),
    ("NVIDIA RTX 6000 Ada Generation", "NVIDIA RTX 6000 Ada Generation", (8, 9)),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100", (8, 0)),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100", (8, 0)),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100", (8, 0)),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100", (8, 0)),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM", (9, 0)),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", (9, 0)),
    ("NVIDIA H100 NVL", "NVIDIA H100 NVL", (9, 0)),
    ("NVIDIA H200", "NVIDIA H200", (9, 0)),
    ("NVIDIA GH200 480GB", "NVIDIA GH200", (9, 0)),
    ("NVIDIA GH200 144G HBM3e", "NVIDIA GH200", (9, 0)),
    ("NVIDIA B200", "NVIDIA B200", (10, 0)),
]


@pytest.mark.parametrize("name, model, capability", CARDS)
def test_the_cards_readers_have(name, model, capability):
    peak = peak_for(name)
    assert peak is not None and peak.name == model and peak.capability == capability
    assert peak.bandwidth_gbs > 0 and peak.memory_gb > 0
    if peak.has_bf16:                 # dense bf16 is twice dense TF32 on every such card
        assert peak.bf16 == pytest.approx(2 * peak.tf32, rel=0.03)
    else:                             # no bf16 tensor cores, no TF32: no MFU in either column
        assert (peak.bf16, peak.tf32) == (None, None)
        assert mfu(1e6, 1e8, name, "bf16") is None and mfu(1e6, 1e8, name, "tf32") is None


def test_variants_of_one_card_differ_in_memory_not_compute():
    assert peak_for("NVIDIA GH200 144G HBM3e").memory_gb > peak_for("NVIDIA GH200 480GB").memory_gb
    a40, a80, a80p = (peak_for(n) for n in ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB",
                                             "NVIDIA A100 80GB PCIe"))
    assert a40.bf16 == a80.bf16 == a80p.bf16
    assert a40.memory_gb < a80.memory_gb and a80p.bandwidth_gbs < a80.bandwidth_gbs


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 4080 SUPER",
                                  "NVIDIA L40", "Tesla V100S-PCIE-32GB", "Quadro RTX 6000"])
def test_other_cards_are_not_taken_for_known_ones(name):
    assert peak_for(name) is None


def test_bf16_needs_compute_capability_8():
    assert supports_bf16((8, 0)) and supports_bf16((12, 0))
    assert supports_bf16((7, 5)) is False and supports_bf16((7, 0)) is False
    assert supports_bf16(None) is None                       # a CPU: not a GPU question
    assert all(p.has_bf16 == (p.bf16 is not None) for _, _, p in PEAKS)


def test_nvidia_smi_gives_its_output_or_none(tmp_path, monkeypatch):
    """The one way the package asks the driver: the output when nvidia-smi answers, None when
    it is missing, fails or hangs (the callers then say what they could not read)."""
    from perfladder import hardware
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\ncase "$1" in\n  -L) echo "GPU 0: NVIDIA H200 (UUID: x)";;\n'
                    '  hang) exec /bin/sleep 5;;\n  *) echo "bad option" >&2; exit 3;;\nesac\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert hardware.nvidia_smi("-L") == "GPU 0: NVIDIA H200 (UUID: x)\n"
    assert hardware.nvidia_smi("--nope") is None
    assert hardware.nvidia_smi("hang", timeout=0.2) is None
    from perfladder.book.execute import gpu_count
    assert gpu_count() == 1                                  # a caller reads it through the helper
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert hardware.nvidia_smi("-L") is None and gpu_count() == 0
