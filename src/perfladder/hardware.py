"""Peak FLOP/s by GPU name, and model-FLOPs utilisation (MFU). No framework imports.

Numbers are *dense* tensor-core peaks (no 2:4 sparsity), in TFLOP/s, from the vendors'
datasheets / architecture whitepapers:

* RTX 4090: NVIDIA Ada Lovelace architecture whitepaper v2.1, Appendix A, table 9
  ("Peak BF16 Tensor TFLOPS with FP32 Accumulate" 165.2; "Peak TF32 Tensor" 82.6).
* A100 SXM4 / PCIe (40 and 80 GB): NVIDIA A100 datasheet (BF16 312, TF32 156).
* H100 SXM5: NVIDIA H100 datasheet (BF16 989.5, TF32 494.7 dense; the datasheet's
  headline figures are with sparsity, i.e. doubled). H100 PCIe: 756.5 / 378.
* H100 NVL / H200 NVL: their datasheets (BF16 1,671 and TF32 835 with sparsity, so
  835.5 / 417.5 dense).
* H200 (SXM): NVIDIA H200 datasheet -- the same compute as H100 SXM (989.5 / 494.7),
  with 141 GB HBM3e at 4.8 TB/s. ``measured_bf16`` is an 8192^3 bf16 matmul on random
  data measured on this project's H200 (788-798 TFLOP/s, see benchmarks/results).

An unknown device gets ``None`` -- no MFU -- rather than a guess.
"""
from __future__ import annotations

from dataclasses import dataclass

PRECISIONS = ("bf16", "tf32")


@dataclass(frozen=True)
class Peak:
    name: str
    bf16: float            # dense TFLOP/s
    tf32: float            # dense TFLOP/s
    measured_bf16: float | None = None   # TFLOP/s measured with a large matmul

    def tflops(self, precision: str) -> float:
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r} is not valid; valid choices: {PRECISIONS}")
        return getattr(self, precision)


# Ordered: the first pattern that occurs in the (lowercased) device name wins, so the
# more specific names come first.
PEAKS: list[tuple[str, Peak]] = [
    # NVL (PCIe-card) variants are clocked lower: datasheet 1,671 / 835 TFLOP/s with sparsity.
    ("h200 nvl", Peak("NVIDIA H200 NVL", bf16=835.5, tf32=417.5)),
    ("h100 nvl", Peak("NVIDIA H100 NVL", bf16=835.5, tf32=417.5)),
    ("h200", Peak("NVIDIA H200", bf16=989.5, tf32=494.7, measured_bf16=790.0)),
    ("h100 pcie", Peak("NVIDIA H100 PCIe", bf16=756.5, tf32=378.0)),
    ("h100", Peak("NVIDIA H100 SXM", bf16=989.5, tf32=494.7)),
    ("a100", Peak("NVIDIA A100", bf16=312.0, tf32=156.0)),
    ("rtx 4090", Peak("NVIDIA GeForce RTX 4090", bf16=165.2, tf32=82.6)),
]


def peak_for(device_name: str | None) -> Peak | None:
    """The peak table entry for a device name, or ``None`` if it is not a known GPU."""
    if not device_name:
        return None
    low = device_name.lower()
    for pattern, peak in PEAKS:
        if pattern in low:
            return peak
    return None


def achieved_tflops(tokens_per_s: float, flops_per_token: float) -> float:
    """Model FLOPs actually delivered per second, in TFLOP/s."""
    return tokens_per_s * flops_per_token / 1e12


def mfu(tokens_per_s: float, flops_per_token: float, device_name: str | None,
        precision: str = "bf16", measured: bool = False) -> float | None:
    """Model-FLOPs utilisation as a fraction of the device's peak, or ``None`` if unknown.

    ``precision`` picks the peak the rung computes at (``'tf32'`` for fp32 matmuls with
    TF32 allowed, ``'bf16'`` for bf16). ``measured=True`` divides by the measured bf16
    matmul rate instead of the datasheet (only where one is recorded).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not valid; valid choices: {PRECISIONS}")
    peak = peak_for(device_name)
    if peak is None:
        return None
    if measured:
        if precision != "bf16" or peak.measured_bf16 is None:
            return None
        denom = peak.measured_bf16
    else:
        denom = peak.tflops(precision)
    return achieved_tflops(tokens_per_s, flops_per_token) / denom
