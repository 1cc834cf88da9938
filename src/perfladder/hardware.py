"""Peak FLOP/s by GPU name, what each card can compute in, and model-FLOPs utilisation (MFU).
No framework imports.

Numbers are *dense* tensor-core peaks (no 2:4 sparsity), in TFLOP/s, from the datasheet or
architecture whitepaper named beside each card in ``PEAKS``; where a datasheet gives only the
with-sparsity figure, the dense one is half of it. GeForce cards are listed at their "with
FP32 accumulate" rate, which is what a bf16 matmul with fp32 accumulation gets. Memory
bandwidth is the datasheet's, in GB/s.

Cards without bf16 tensor cores (compute capability below 8.0: V100, T4) have ``bf16=None``
and ``tf32=None``: their matmuls in bf16 would be emulated, and they have no TF32 mode, so
they get no MFU in either column (``supports_bf16``).

A rung's MFU is divided by the peak of the precision it computes in (``rung_mfu``): the bf16
column for a bf16 rung, the TF32 column for an fp32 or TF32 one (a GPU's fp32 matmuls run as
TF32 where perfladder allows it, and fp32 proper has no tensor-core peak); the record names
that peak (``RungResult.mfu_peak``), and ``perfladder.measure.counts.check_mfu`` holds every
recorded MFU to this table.

An unknown device gets ``None`` -- no MFU -- rather than a guess. The datasheet peak is the
MFU denominator; a rate "against the measured roof" uses the ceilings the same run probed
(``LadderResult.roofs``), never a number from this table.

``nvidia_smi`` asks the driver about the machine without starting CUDA in this process.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, fields

from perfladder.checks import check_positive


def nvidia_smi(*args: str, timeout: float = 30.0) -> str | None:
    """``nvidia-smi ARGS``'s output, or None when there is no nvidia-smi, it fails or it hangs."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


PRECISIONS = ("fp32", "tf32", "bf16")     # what a step's matmuls compute in
# bf16 tensor cores (and TF32) arrived with Ampere, compute capability 8.0
BF16_CAPABILITY = (8, 0)


def check_precision(name: str, valid: tuple[str, ...] = PRECISIONS) -> str:
    if name not in valid:
        raise ValueError(f"precision={name!r} is not valid; valid choices: {valid}")
    return name


def supports_bf16(capability: tuple[int, int] | None) -> bool | None:
    """Has a GPU of this compute capability bf16 tensor cores? ``None``: not a GPU (unknown)."""
    if capability is None:
        return None
    return tuple(capability) >= BF16_CAPABILITY


@dataclass(frozen=True)
class Peak:
    name: str
    bf16: float | None         # dense TFLOP/s; None: no bf16 tensor cores
    tf32: float | None         # dense TFLOP/s; None: no TF32 mode
    capability: tuple[int, int] = (0, 0)   # CUDA compute capability
    memory_gb: float | None = None         # device memory, GB (datasheet)
    bandwidth_gbs: float | None = None     # memory bandwidth, GB/s (datasheet)

    def tflops(self, precision: str) -> float | None:
        return getattr(self, check_precision(precision, PEAK_PRECISIONS))

    @property
    def has_bf16(self) -> bool:
        return bool(supports_bf16(self.capability))


# fp32 proper has no tensor-core peak: the table lists the precisions its columns name
PEAK_PRECISIONS = tuple(f.name for f in fields(Peak) if f.name in PRECISIONS)


def _card(name, bf16, tf32, cc, gb, gbs) -> Peak:
    return Peak(name, bf16=bf16, tf32=tf32, capability=cc, memory_gb=gb, bandwidth_gbs=gbs)


# A device name is matched as a whole model name: after the vendor words, its first words
# must be one of the models below, and any words after them only a memory size, form
# factor or memory type ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"); an entry may also
# require some of those words (its variant: "pcie", "80gb"). So a different card whose name
# merely contains a known one ("NVIDIA RTX A1000", "RTX 4090 D", a laptop "RTX 4090 Laptop GPU",
# a MIG slice "A100-SXM4-40GB MIG 1g.5gb") gets no peak rather than the wrong one. Ordered:
# the more specific entries (NVL, PCIe, a memory size) come first.
H100_SXM = (989.5, 494.7)      # H100 SXM5 datasheet: BF16 1,979 / TF32 989 TFLOP/s with sparsity
NVL = (835.5, 417.5)           # H100 NVL / H200 NVL datasheets: 1,671 / 835 with sparsity
PEAKS: list[tuple[tuple[str, ...], frozenset, Peak]] = [
    # Hopper, compute capability 9.0
    (("h200", "nvl"), frozenset(), _card("NVIDIA H200 NVL", *NVL, (9, 0), 141, 4800)),
    (("h100", "nvl"), frozenset(), _card("NVIDIA H100 NVL", *NVL, (9, 0), 94, 3900)),
    # H200 datasheet: the compute of H100 SXM, 141 GB HBM3e at 4.8 TB/s
    (("h200",), frozenset(), _card("NVIDIA H200", *H100_SXM, (9, 0), 141, 4800)),
    # H100 PCIe datasheet: BF16 1,513 / TF32 756 with sparsity; 80 GB HBM2e at 2.0 TB/s
    (("h100",), frozenset({"pcie"}), _card("NVIDIA H100 PCIe", 756.5, 378.0, (9, 0), 80, 2000)),
    (("h100",), frozenset(), _card("NVIDIA H100 SXM", *H100_SXM, (9, 0), 80, 3350)),
    # GH200 Grace Hopper datasheet: the H100 SXM's tensor cores; 96 GB HBM3 at 4 TB/s (the
    # 144 GB HBM3e part: 4.9 TB/s)
    (("gh200",), frozenset({"hbm3e"}), _card("NVIDIA GH200", *H100_SXM, (9, 0), 144, 4900)),
    (("gh200",), frozenset(), _card("NVIDIA GH200", *H100_SXM, (9, 0), 96, 4000)),
    # Blackwell: HGX B200 datasheet, per GPU: BF16 4.5 / TF32 2.2 PFLOP/s with sparsity;
    # 180 GB HBM3e at 7.7 TB/s (1,440 GB and 62 TB/s over 8 GPUs); compute capability 10.0
    (("b200",), frozenset(), _card("NVIDIA B200", 2250.0, 1100.0, (10, 0), 180, 7700)),
    # Ampere datacenter, 8.0: A100 datasheet (BF16 312 / TF32 156 dense, every variant);
    # bandwidth 1,555 GB/s (40 GB), 1,935 (80 GB PCIe), 2,039 (80 GB SXM)
    (("a100",), frozenset({"80gb", "pcie"}), _card("NVIDIA A100", 312.0, 156.0, (8, 0), 80, 1935)),
    (("a100",), frozenset({"80gb"}), _card("NVIDIA A100", 312.0, 156.0, (8, 0), 80, 2039)),
    (("a100",), frozenset(), _card("NVIDIA A100", 312.0, 156.0, (8, 0), 40, 1555)),
    # Ada, 8.9. L40S datasheet: BF16 362.05 / TF32 183 dense; 48 GB GDDR6 at 864 GB/s
    (("l40s",), frozenset(), _card("NVIDIA L40S", 362.05, 183.0, (8, 9), 48, 864)),
    # L4 datasheet: BF16 242 / TF32 120 with sparsity; 24 GB GDDR6 at 300 GB/s
    (("l4",), frozenset(), _card("NVIDIA L4", 121.0, 60.0, (8, 9), 24, 300)),
    # RTX 6000 Ada Generation datasheet: BF16 (FP32 accumulate) 364.2 / TF32 182.1 dense;
    # 48 GB GDDR6 at 960 GB/s
    (("rtx", "6000", "ada", "generation"), frozenset(),
     _card("NVIDIA RTX 6000 Ada Generation", 364.2, 182.1, (8, 9), 48, 960)),
    # Ada Lovelace architecture whitepaper v2.1, appendix A: "Peak BF16 Tensor TFLOPS with FP32
    # Accumulate" / "Peak TF32 Tensor" dense: RTX 4090 165.2 / 82.6 (24 GB at 1,008 GB/s),
    # RTX 4080 97.5 / 48.7 (16 GB at 716.8 GB/s)
    (("rtx", "4090"), frozenset(), _card("NVIDIA GeForce RTX 4090", 165.2, 82.6, (8, 9), 24, 1008)),
    (("rtx", "4080"), frozenset(), _card("NVIDIA GeForce RTX 4080", 97.5, 48.7, (8, 9), 16, 716.8)),
    # RTX Blackwell GPU architecture whitepaper: RTX 5090 BF16 (FP32 accumulate) 209.5 / TF32
    # 104.8 dense; 32 GB GDDR7 at 1,792 GB/s; compute capability 12.0
    (("rtx", "5090"), frozenset(), _card("NVIDIA GeForce RTX 5090", 209.5, 104.8, (12, 0), 32, 1792)),
    # Ampere GA102, 8.6. Ampere GA102 whitepaper: RTX 3090 BF16 (FP32 accumulate) 71 / TF32
    # 35.6 dense, 24 GB GDDR6X at 936 GB/s; RTX A6000 154.8 / 77.4 dense, 48 GB at 768 GB/s
    (("rtx", "3090"), frozenset(), _card("NVIDIA GeForce RTX 3090", 71.0, 35.6, (8, 6), 24, 936)),
    (("rtx", "a6000"), frozenset(), _card("NVIDIA RTX A6000", 154.8, 77.4, (8, 6), 48, 768)),
    # A10 datasheet: BF16 125 / TF32 62.5 dense; 24 GB GDDR6 at 600 GB/s
    (("a10",), frozenset(), _card("NVIDIA A10", 125.0, 62.5, (8, 6), 24, 600)),
    # A10G (AWS EC2 G5 only; no NVIDIA datasheet): AWS's figures, BF16 70 / TF32 35 dense,
    # 24 GB GDDR6 at 600 GB/s
    (("a10g",), frozenset(), _card("NVIDIA A10G", 70.0, 35.0, (8, 6), 24, 600)),
    # No bf16 tensor cores and no TF32 (their tensor cores do fp16): no MFU column applies.
    # V100 datasheet: 7.0, 16 or 32 GB HBM2 at 900 GB/s; T4 datasheet: 7.5, 16 GB GDDR6 at 320 GB/s
    (("v100",), frozenset(), _card("NVIDIA V100", None, None, (7, 0), 16, 900)),
    (("t4",), frozenset(), _card("NVIDIA T4", None, None, (7, 5), 16, 320)),
]
VENDOR_WORDS = ("nvidia", "geforce", "tesla")
# words that may follow the model: memory size, form factor, memory type
DESCRIPTOR = re.compile(r"\d+gb?|sxm\d*|pcie|hbm\d*e?")


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
    for model, variant, peak in PEAKS:
        rest = words[len(model):]
        if (tuple(words[:len(model)]) == model and all(DESCRIPTOR.fullmatch(w) for w in rest)
                and variant <= set(rest)):
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
    if peak is None or peak.tflops(precision) is None:
        return None
    return achieved / peak.tflops(precision)


def peak_column(precision: str) -> str:
    """The peak-table column a step computing in ``precision`` is divided by: ``'bf16'`` for
    bf16, ``'tf32'`` for tf32 and fp32."""
    return "bf16" if check_precision(precision) == "bf16" else "tf32"


def rung_mfu(tokens_per_s: float, flops_per_token: float, device_name: str | None,
             precision: str) -> dict:
    """``{'mfu', 'mfu_peak'}`` of a rung computing in ``precision`` (a ``RungResult``'s fields):
    the MFU against its own precision's peak, and that peak, ``{'precision', 'tflops'}``;
    both None where the device has no peak in that column."""
    column = peak_column(precision)
    value = mfu(tokens_per_s, flops_per_token, device_name, column)
    peak = peak_for(device_name)
    return {"mfu": value, "mfu_peak": None if value is None else
            {"precision": column, "tflops": peak.tflops(column)}}
