"""The PyTorch ladder page's checked claims and its own numbers (see ``perfladder.pages.story``).

Each check is one qualitative claim of the prose in ``notebooks/01_pytorch_ladder.ipynb``, by
the glue key placed after the sentence that makes it, and holds on every complete committed run
(``tests/pages/test_checked_prose.py``). What differs between runs is not claimed by a check:
the batch-64 rungs' passages are ``Story``s (a version for a step the host paces, one for a
step the device paces, ``perfladder.pages.chapter.machine``), and a verdict that differs
between runs is inserted as a phrase (``v_<rung>``) with its tally over the runs (``sp_...``).
"""
from __future__ import annotations

from perfladder.pages import spread
from perfladder.pages.chapter.machine import Story, hardware_numbers, roofline_story, values_of
from perfladder.pages.chapter.phrases import (
    config_numbers,
    gradient_numbers,
    multi_gpu_numbers,
    rung_value,
    shown_rule,
    unmeasured_sentence,
    verdict_phrases,
)
from perfladder.pages.story import (
    DEVICE,
    HOST,
    Check,
    all_of,
    beats,
    category_ms_of,
    chapter_ratios,
    difference_of,
    differs_in,
    largest_step,
    learned,
    less,
    more,
    pays,
    ratio_of,
    regime,
    roofline_numbers,
    verdict,
)

NOT_FASTER = ("slower", "within noise")
MISSING_WHY = ("B16 to B18 need a CUDA GPU, B17 and B18 nvmath-python too, and runs committed "
               "before they existed lack them")


FRAMEWORK = "torch"

CHECKS = [
    Check("c_R2_device_less", "R2's kernels take less device time than R1's",
          less("device_ms", "R2", "R1")),
    Check("c_R0_spread_host", "across the runs the eager step's kernels take the same time and its step "
          "does not: the host makes the difference", spread.host_sets_the_spread(FRAMEWORK, "R0")),
    Check("c_R1_spread_host", "... and the same for the compiled step",
          spread.host_sets_the_spread(FRAMEWORK, "R1")),
    Check("c_R2_spread_host", "... and for the bf16 step", spread.host_sets_the_spread(FRAMEWORK, "R2")),
    Check("c_R3_faster", "the big batch pays", pays("R3")),
    Check("c_R3_largest", "the big batch is the ladder's largest step", largest_step("R3")),
    Check("c_R3_device", "at the big batch the device is busy", regime("R3", *DEVICE)),
    Check("c_R3c_bf16", "the control differs from R3 in bf16 alone", differs_in("R3c", "R3", "bf16")),
    Check("c_R3_beats_R3c", "at the big batch bf16 beats the fp32 control", beats("R3", "R3c")),
    Check("c_R3c_beats_R1", "the batch alone pays in fp32", beats("R3c", "R1")),
    Check("c_R3_memory", "bf16 needs less memory than the fp32 control", less("memory", "R3", "R3c")),
    Check("c_R4_slower", "checkpointing costs time", verdict("R4", "slower")),
    Check("c_R4_memory", "checkpointing saves memory", less("memory", "R4", "R3")),
    Check("c_B1_device", "at batch 512 the device no longer waits", regime("B1", *DEVICE)),
    Check("c_B3_noise", "CUDA graphs buy nothing measurable", verdict("B3", *NOT_FASTER)),
    Check("c_B4_not_faster", "the one-hot lookup is no faster", verdict("B4", *NOT_FASTER)),
    Check("c_B5_faster", "doubling the batch pays", verdict("B5", "faster")),
    Check("c_B8_faster", "the fused RoPE pays", verdict("B8", "faster")),
    Check("c_B10_not_faster", "the fused add+LayerNorm does not pay", verdict("B10", *NOT_FASTER)),
    Check("c_B12_faster", "attention as one kernel pays", verdict("B12", "faster")),
    Check("c_B13_not_faster", "the FFN as Triton GEMMs does not pay", verdict("B13", *NOT_FASTER)),
    Check("c_B13_elementwise_less", "its fused epilogues remove elementwise time",
          less("elementwise_ms", "B13", "B12")),
    Check("c_B13_matmul_more", "its GEMMs take longer than cuBLAS's", more("matmul_ms", "B13", "B12")),
    Check("c_B14_faster", "the bf16 residual stream pays", verdict("B14", "faster")),
    Check("c_learned", "the fastest configuration learns", learned()),
]

BASE_NUMBERS = {
    **roofline_numbers(), **config_numbers(), **gradient_numbers(), **hardware_numbers(),
    **multi_gpu_numbers(FRAMEWORK), **spread.spread_numbers(FRAMEWORK),
    **spread.across_numbers(FRAMEWORK, ("B1", "B2", "B6", "B9")),
    **verdict_phrases("R1", "R2", "B1", "B2", "B6", "B9"), "shown_rule": shown_rule(FRAMEWORK),
    "R3_vs_R3c": ratio_of("R3", "R3c"), "R3_vs_R2": ratio_of("R3", "R2"),
    "R3c_vs_R1": ratio_of("R3c", "R1"), "R3c_differs": difference_of("R3c", "R3"),
    "B12_matmul_ms": category_ms_of("B12", "matmul"), "B13_matmul_ms": category_ms_of("B13", "matmul"),
    "B12_elementwise_ms": category_ms_of("B12", "elementwise"),
    "B13_elementwise_ms": category_ms_of("B13", "elementwise"),
    "B14_matmul_ms": category_ms_of("B14", "matmul"), "B15_matmul_ms": category_ms_of("B15", "matmul"),
    "B14_elementwise_ms": category_ms_of("B14", "elementwise"),
    "B15_elementwise_ms": category_ms_of("B15", "elementwise"), "B15_ratio": rung_value("B15", "ratio"),
    "B16_ratio": rung_value("B16", "ratio"), "B16_busy": rung_value("B16", "busy"),
    "B17_ratio": rung_value("B17", "ratio"), "B18_ratio": rung_value("B18", "ratio"),
    "B17_matmul_ms": category_ms_of("B17", "matmul"), "B18_matmul_ms": category_ms_of("B18", "matmul"),
    "s_B16_B18_missing": unmeasured_sentence(("B16", "B17", "B18"), MISSING_WHY),
    **chapter_ratios(FRAMEWORK, ("R1", "R0"), ("R2", "R1"), ("R3", "R2")),
}


_values = values_of(BASE_NUMBERS)      # what the stories fill their fields from


HOST_PACED = "The device then waits while Python issues the next of several hundred small kernels:"
STORIES = [
    Story("s_R0", (
        (regime("R0", HOST),
         f"{HOST_PACED} on this run the host, not the GPU, sets the pace of the eager step. The "
         "chapter's RTX 4090 (this GPU has {hw_bf16_vs_chapter} its dense bf16 peak) was not waiting "
         "on its host, in the chapter's own words: slower kernels hide the same host work."),
        (regime("R0", *DEVICE),
         "The kernels keep the device busy for most of the step, so the GPU, not the host, sets the "
         "pace of the eager step, as the chapter reports for its RTX 4090."),
    ), "This run recorded no profile of the eager step, so what set its pace is not known here.",
        _values),
    Story("s_R1", (
        (regime("R1", *DEVICE),
         "With fewer kernels to issue the host now keeps up: the kernels are busy {R1_busy} of the "
         "{R1_step_ms} step, so the device sets the pace at the chapter's batch, as on its RTX 4090."),
        (regime("R1", HOST),
         "Fusion cut the launches, but not enough to hide the host: the kernels are busy only "
         "{R1_busy} of the {R1_step_ms} step, which still waits on its host at the chapter's batch."),
    ), "This run recorded no profile of the compiled step.", _values),
    Story("s_R2", (
        (all_of(regime("R2", HOST), more("step_ms", "R2", "R1")),
         "But the step grew, from {R1_step_ms} to {R2_step_ms}: its kernels are busy only {R2_busy} "
         "of it, waiting on the host work autocast adds, which at batch {cfg_batch} the short kernels "
         "cannot hide. On the chapter's RTX 4090, whose kernels hid its host, the same rung paid "
         "{ch_R2_ratio}. The cure for a host-bound step is more work per launch: the next rung."),
        (all_of(regime("R2", *DEVICE), verdict("R2", "faster")),
         "The device sets the pace of this step (its kernels are busy {R2_busy} of it), so cheaper "
         "kernels make a faster step, as on the chapter's RTX 4090 ({ch_R2_ratio})."),
        (all_of(regime("R2", HOST), less("step_ms", "R2", "R1")),
         "The step still waits on the host (its kernels are busy {R2_busy} of it), but it took "
         "{R2_step_ms} against R1's {R1_step_ms}: bf16 did not cost time at batch {cfg_batch}. On the "
         "chapter's RTX 4090 the same rung paid {ch_R2_ratio}. The cure for a host-bound step is "
         "more work per launch: the next rung."),
    ), "The step took {R2_step_ms} against R1's {R1_step_ms}, its kernels busy {R2_busy} of it.",
        _values),
    # B15 needs nvmath-python and a CUDA GPU: a run without them records why, in its result line
    Story("s_B15", (
        (all_of(verdict("B15", "faster"), less("elementwise_ms", "B15", "B14")),
         "cuBLASLt's epilogues pay ({B15_ratio}): the elementwise kernels take {B15_elementwise_ms} "
         "per step where they took {B14_elementwise_ms}."),
        (all_of(verdict("B15", *NOT_FASTER), more("matmul_ms", "B15", "B14")),
         "cuBLASLt's epilogues do not pay ({B15_ratio}): the elementwise kernels take "
         "{B15_elementwise_ms} per step where they took {B14_elementwise_ms}, but the GEMMs that carry "
         "the epilogues take {B15_matmul_ms} where cuBLAS's plain GEMMs took {B14_matmul_ms}."),
        (verdict("B15", "faster"), "cuBLASLt's epilogues pay ({B15_ratio}) on this run."),
        (verdict("B15", *NOT_FASTER), "cuBLASLt's epilogues do not pay ({B15_ratio}) on this run."),
    ), "This run has no measurement of B15: its epilogues run through nvmath-python on a CUDA GPU, "
       "and runs committed before it existed lack it.", _values),
    # B16-B18 need a CUDA GPU, B17 and B18 nvmath-python too: where a run lacks one, its story
    # says nothing and ``s_B16_B18_missing`` names it
    Story("s_B16", (
        (all_of(verdict("B16", *NOT_FASTER), regime("B16", *DEVICE)),
         "CUDA graphs buy nothing measurable on the fused step either ({B16_ratio}): its kernels keep "
         "the device busy {B16_busy} of the step, so there is little launch time left to remove."),
        (verdict("B16", "faster"),
         "Replaying the fused step as CUDA graphs pays ({B16_ratio}): launches still cost this step "
         "time."),
        (verdict("B16", *NOT_FASTER), "CUDA graphs buy nothing measurable on the fused step either "
         "({B16_ratio})."),
    ), "", _values),
    Story("s_B17", (
        (all_of(verdict("B17", "faster"), less("matmul_ms", "B17", "B14")),
         "Choosing each GEMM's algorithm by timing pays ({B17_ratio}): the GEMMs take {B17_matmul_ms} "
         "per step where cuBLAS's own choices took {B14_matmul_ms}."),
        (verdict("B17", "faster"), "Choosing each GEMM's algorithm by timing pays ({B17_ratio})."),
        (verdict("B17", *NOT_FASTER), "Choosing each GEMM's algorithm by timing does not pay on this "
         "run ({B17_ratio})."),
    ), "", _values),
    Story("s_B18", (
        (all_of(verdict("B18", *NOT_FASTER), more("matmul_ms", "B18", "B17")),
         "The bias gradients inside the weight-gradient GEMMs do not pay ({B18_ratio}): the step's "
         "GEMMs take {B18_matmul_ms} where B17's took {B17_matmul_ms}."),
        (verdict("B18", "faster"), "The bias gradients inside the weight-gradient GEMMs pay "
         "({B18_ratio})."),
        (verdict("B18", *NOT_FASTER), "The bias gradients inside the weight-gradient GEMMs do not pay "
         "({B18_ratio})."),
    ), "", _values),
    roofline_story(_values, "ours computes one head of one sequence per program"),
]

NUMBERS = {**BASE_NUMBERS, **{s.key: s for s in STORIES}}
