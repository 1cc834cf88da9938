"""The PyTorch ladder page's checked claims and its own numbers (see ``perfladder.pages.story``).

Each check is one qualitative claim of the prose in ``notebooks/01_pytorch_ladder.ipynb``, by
the glue key placed after the sentence that makes it.
"""
from __future__ import annotations

from perfladder.pages.story import (
    DEVICE,
    HOST,
    Check,
    beats,
    category_ms_of,
    chapter_ratios,
    difference_of,
    differs_in,
    fastest_is,
    largest_gap,
    largest_step,
    learned,
    less,
    more,
    ratio_of,
    regime,
    roofline_numbers,
    verdict,
)

NOT_FASTER = ("slower", "within noise")

CHECKS = [
    Check("c_R0_host", "the eager step waits on the host", regime("R0", HOST)),
    Check("c_R1_faster", "compiling pays", verdict("R1", "faster")),
    Check("c_R1_device", "the compiled step keeps the device busy", regime("R1", *DEVICE)),
    Check("c_R2_slower", "bf16 at the chapter's batch costs time", verdict("R2", "slower")),
    Check("c_R2_host", "R2's step waits on the host", regime("R2", HOST)),
    Check("c_R2_device_less", "R2's kernels take less device time than R1's",
          less("device_ms", "R2", "R1")),
    Check("c_R2_step_longer", "yet R2's step is longer than R1's", more("step_ms", "R2", "R1")),
    Check("c_R3_faster", "the big batch pays", verdict("R3", "faster")),
    Check("c_R3_largest", "the big batch is the ladder's largest step", largest_step("R3")),
    Check("c_R3_device", "at the big batch the device is busy", regime("R3", *DEVICE)),
    Check("c_R3c_bf16", "the control differs from R3 in bf16 alone", differs_in("R3c", "R3", "bf16")),
    Check("c_R3_beats_R3c", "at the big batch bf16 beats the fp32 control", beats("R3", "R3c")),
    Check("c_R3c_beats_R1", "the batch alone pays in fp32", beats("R3c", "R1")),
    Check("c_R3_memory", "bf16 needs less memory than the fp32 control", less("memory", "R3", "R3c")),
    Check("c_R4_slower", "checkpointing costs time", verdict("R4", "slower")),
    Check("c_R4_memory", "checkpointing saves memory", less("memory", "R4", "R3")),
    Check("c_B1_faster", "the fused AdamW pays", verdict("B1", "faster")),
    Check("c_B2_noise", "the compiled AdamW buys nothing beyond the noise", verdict("B2", *NOT_FASTER)),
    Check("c_B1_device", "at batch 512 the device no longer waits", regime("B1", *DEVICE)),
    Check("c_B3_noise", "CUDA graphs buy nothing measurable", verdict("B3", *NOT_FASTER)),
    Check("c_B4_not_faster", "the one-hot lookup is no faster", verdict("B4", *NOT_FASTER)),
    Check("c_B5_faster", "doubling the batch pays", verdict("B5", "faster")),
    Check("c_B6_faster", "quadrupling it pays a little more", verdict("B6", "faster")),
    Check("c_B8_faster", "the fused RoPE pays", verdict("B8", "faster")),
    Check("c_B9_faster", "the fused GELU pays", verdict("B9", "faster")),
    Check("c_B10_not_faster", "the fused add+LayerNorm does not pay", verdict("B10", *NOT_FASTER)),
    Check("c_B12_faster", "attention as one kernel pays", verdict("B12", "faster")),
    Check("c_B13_not_faster", "the FFN as Triton GEMMs does not pay", verdict("B13", *NOT_FASTER)),
    Check("c_B13_elementwise_less", "its fused epilogues remove elementwise time",
          less("elementwise_ms", "B13", "B12")),
    Check("c_B13_matmul_more", "its GEMMs take longer than cuBLAS's", more("matmul_ms", "B13", "B12")),
    Check("c_B14_faster", "the bf16 residual stream pays", verdict("B14", "faster")),
    Check("c_B14_fastest", "it is the fastest configuration", fastest_is("B14")),
    Check("c_attention_gap", "attention stands furthest above its roofline floor", largest_gap("attention")),
    Check("c_learned", "the fastest configuration learns", learned()),
]

NUMBERS = {**roofline_numbers(), "R3_vs_R3c": ratio_of("R3", "R3c"), "R3_vs_R2": ratio_of("R3", "R2"),
           "R3c_vs_R1": ratio_of("R3c", "R1"), "R3c_differs": difference_of("R3c", "R3"),
           "B12_matmul_ms": category_ms_of("B12", "matmul"),
           "B13_matmul_ms": category_ms_of("B13", "matmul"),
           "B12_elementwise_ms": category_ms_of("B12", "elementwise"),
           "B13_elementwise_ms": category_ms_of("B13", "elementwise"),
           **chapter_ratios("torch", ("R1", "R0"), ("R2", "R1"), ("R3", "R2"))}
