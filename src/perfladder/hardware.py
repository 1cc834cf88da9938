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
  with 141 GB HBM3e at 4.8 TB/s.

An unknown device gets ``None`` -- no MFU -- rather than a guess. The datasheet peak is the
MFU denominator; a rate "against the measured roof" uses the ceilings the same run probed
(``LadderResult.roofs``), never a number from this table.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields

from perfladder.checks import check_positive

PRECISIONS = ("fp32", "tf32", "bf16")     # what a step's matmuls compute in


def check_precision(name: str, valid: tuple[str, ...] = PRECISIONS) -> str:
    if name not in valid:
        raise ValueError(f"precision={name!r} is not valid; valid choices: {valid}")
    return name


@dataclass(frozen=True)
class Peak:
    name: str
    bf16: float            # dense TFLOP/s
    tf32: float            # dense TFLOP/s

    def tflops(self, precision: str) -> float:
        return getattr(self, check_precision(precision, PEAK_PRECISIONS))


# fp32 proper has no tensor-core peak: the table lists the precisions its columns name
PEAK_PRECISIONS = tuple(f.name for f in fields(Peak) if f.name in PRECISIONS)


# A device name is matched as a whole model name: after the vendor words, its first words
# must be one of the models below, and any words after them only a memory size, form
# factor or memory type ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"). So a different
# card whose name merely contains a known one ("NVIDIA RTX A1000", "RTX 4090 D", a MIG
# slice "A100-SXM4-40GB MIG 1g.5gb") gets no peak rather than the wrong one. Ordered: the
# more specific names (NVL, PCIe variants) come first.
PEAKS: list[tuple[tuple[str, ...], Peak]] = [
    # NVL (PCIe-card) variants are clocked lower: datasheet 1,671 / 835 TFLOP/s with sparsity.
    (("h200", "nvl"), Peak("NVIDIA H200 NVL", bf16=835.5, tf32=417.5)),
    (("h100", "nvl"), Peak("NVIDIA H100 NVL", bf16=835.5, tf32=417.5)),
    (("h200",), Peak("NVIDIA H200", bf16=989.5, tf32=494.7)),
    (("h100", "pcie"), Peak("NVIDIA H100 PCIe", bf16=756.5, tf32=378.0)),
    (("h100",), Peak("NVIDIA H100 SXM", bf16=989.5, tf32=494.7)),
    (("a100",), Peak("NVIDIA A100", bf16=312.0, tf32=156.0)),
    (("rtx", "4090"), Peak("NVIDIA GeForce RTX 4090", bf16=165.2, tf32=82.6)),
]
VENDOR_WORDS = ("nvidia", "geforce", "tesla")
# words that may follow the model: memory size, form factor, memory type
DESCRIPTOR = re.compile(r"\d+gb|sxm\d*|pcie|hbm\d*e?")


def model_words(device_name: str) -> list[str]:
    """``'NVIDIA A100-SXM4-80GB'`` -> ``['a100', 'sxm4', '80gb']``: lowercase words, vendor dropped."""
    words = [w for w in re.split(r"[^0-9a-z]+", device_name.lower()) if w]
    while words and words[0] in VENDOR_WORDS:
        words.pop(0)
    return words


def peak_for(device_name: str | None) -> Peak | None:
    """The peak table entry for a device name, or ``None`` if it is not a known GPU."""
    if device_name is None:
        return None
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a str or None, got {type(device_name).__name__} "
                        f"{device_name!r}")
    words = model_words(device_name)
    for model, peak in PEAKS:
        rest = words[len(model):]
        if tuple(words[:len(model)]) == model and all(DESCRIPTOR.fullmatch(w) for w in rest):
            return peak
    return None


def achieved_tflops(tokens_per_s: float, flops_per_token: float) -> float:
    """Model FLOPs actually delivered per second, in TFLOP/s."""
    return check_positive("tokens_per_s", tokens_per_s) * check_positive("flops_per_token", flops_per_token) / 1e12


def mfu(tokens_per_s: float, flops_per_token: float, device_name: str | None,
        precision: str = "bf16") -> float | None:
    """Model-FLOPs utilisation as a fraction of the device's datasheet peak, or ``None`` if
    unknown. ``precision`` picks the peak the rung computes at (``'tf32'`` for fp32 matmuls
    with TF32 allowed, ``'bf16'`` for bf16)."""
    check_precision(precision, PEAK_PRECISIONS)
    achieved = achieved_tflops(tokens_per_s, flops_per_token)   # refuses non-positive rates
    peak = peak_for(device_name)
    if peak is None:
        return None
    return achieved / peak.tflops(precision)
