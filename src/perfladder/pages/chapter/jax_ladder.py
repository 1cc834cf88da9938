"""The JAX ladder page's checked claims and its own numbers (see ``perfladder.pages.story``).

Each check is one qualitative claim of the prose in ``notebooks/02_jax_ladder.ipynb``, by the
glue key placed after the sentence that makes it, and holds on every complete committed run
(``tests/pages/test_checked_prose.py``). What differs between runs is told per kind of run
(``Story``: ``perfladder.pages.chapter.machine``) or inserted as a phrase with its tally over
the runs (``v_<rung>``, ``sp_...``).
"""
from __future__ import annotations

from perfladder.measure.timing import DEFAULT_TARGET_SPREAD
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
    _rung,
    all_of,
    beats,
    credited_ratio,
    keep_words,
    learned,
    less,
    loses_to,
    more,
    pays,
    ratio_of,
    recorded,
    regime,
    roofline_numbers,
    settled,
    small_change,
    verdict,
)

NOT_FASTER = ("slower", "within noise", "unsettled")
MISSING_WHY = ("B9 to B12 need a GPU (XLA's GPU options, Pallas kernels compiled for it), runs "
               "committed before they existed lack them, and B12 changes B8's kernels, which a run "
               "that did not keep B8 does not run")


SMALL = DEFAULT_TARGET_SPREAD   # "little": within the spread a settled window may have
FRAMEWORK = "jax"


def gain_of(name: str):
    """The glue value of a rung's gain over its base as the page may state it
    (``story.credited_ratio``: the ratio, or "at least" the bound when its base did not settle)."""
    def value(result):
        r = result.rung(name)
        return credited_ratio(result, r, result.rung(r.builds_on))
    return value


def detail_of(name: str, key: str):
    """The glue value of one entry of a rung's recorded details."""
    def value(result):
        return str((_rung(result, name).details or {})[key])
    return value


def plain_epilogues(name: str):
    """The rung's compiled step calls cuBLASLt for its GEMMs, every call with the plain epilogue
    (the product alone: no bias or GELU moved into it), as read from its HLO (B9's details)."""
    def test(result):
        d = _rung(result, name).details or {}
        eps = d.get("gemm_epilogues") or {}
        return (d.get("cublaslt_calls", 0) > 0 and set(eps) == {"DEFAULT"},
                f"{name}: {d.get('cublaslt_calls')} cuBLASLt calls, epilogues {eps}")
    return test


def only_dtype(name: str, key: str, dtype: str):
    """The rung's recorded ``details[key]`` (a count per dtype) names ``dtype`` alone."""
    def test(result):
        got = _rung(result, name).details.get(key) or {}
        return set(got) == {dtype}, f"{name} recorded {key} = {got}"
    return test


def top_kernel_is(name: str, word: str):
    """The profiled kernel that takes the most of the rung's step has ``word`` in its name."""
    def test(result):
        r = _rung(result, name)
        if r.profile is None or not r.profile.rows:
            raise ValueError(f"{name} recorded no kernel rows")
        rows = r.profile.rows
        top = max(rows, key=lambda row: row.get("device_ms") or 0.0)
        return word in top.get("name", ""), (f"{name}'s costliest kernel: {top.get('name')} "
                                             f"({top.get('device_ms'):.1f} ms)")
    return test


def less_than_base(metric: str, name: str):
    """``metric`` of the rung is below that of the rung it builds on."""
    def test(result):
        return less(metric, name, _rung(result, name).builds_on)(result)
    return test


CHECKS = [
    Check("c_R1_faster", "jit pays", pays("R1")),
    Check("c_R1_spread_host", "across the runs the jitted step's kernels take the same time and its "
          "step does not", spread.host_sets_the_spread(FRAMEWORK, "R1")),
    Check("c_R2a_fp32", "every matmul of R2a's step runs on fp32 operands",
          only_dtype("R2a", "matmul_dtypes", "float32")),
    Check("c_R2a_spread_host", "across the runs R2a's kernels take the same time and its step does not",
          spread.host_sets_the_spread(FRAMEWORK, "R2a")),
    Check("c_R2_not_faster", "bf16 at batch 64 does not pay", verdict("R2", *NOT_FASTER)),
    Check("c_R2_device_more", "R2's bf16 kernels take more device time than R1's fp32 ones",
          more("device_ms", "R2", "R1")),
    Check("c_R2_spread_device", "R2's own kernel time wanders across the runs",
          spread.device_wanders(FRAMEWORK, "R2")),
    Check("c_R3_loses", "bf16 loses to its fp32 control at the big batch", loses_to("R3", "R3c")),
    Check("c_R3_scatter", "R3's embedding gradient is a bf16 scatter-add",
          recorded("R3", "jaxpr_embedding_scatter_add", "bfloat16")),
    Check("c_R3_scatter_top", "the scatter is the costliest kernel of R3's step",
          top_kernel_is("R3", "scatter")),
    Check("c_R4_memory", "checkpointing cuts the planned temporaries", less("memory", "R4", "R3")),
    Check("c_R4_not_faster", "checkpointing is no faster", verdict("R4", *NOT_FASTER)),
    Check("c_B1_faster", "the fp32 embedding gradient pays", pays("B1")),
    Check("c_B1_beats_R3c", "and beats the fp32 control", beats("B1", "R3c")),
    Check("c_B2_small", "the one-hot lookup changes the rate by little", small_change("B2", SMALL)),
    Check("c_B3_host_less", "the split step issues faster", less("host_ms", "B3", "B1")),
    Check("c_B3_small", "the split step changes the rate by little", small_change("B3", SMALL)),
    Check("c_B4_faster", "cuDNN attention pays", verdict("B4", "faster")),
    Check("c_B4_memory", "cuDNN attention plans fewer temporaries", less_than_base("memory", "B4")),
    Check("c_B5_faster", "doubling the batch pays", verdict("B5", "faster")),
    Check("c_B7_small", "the Pallas add+LayerNorm changes the rate by little", small_change("B7", SMALL)),
    Check("c_B8_faster", "attention as one kernel pays", verdict("B8", "faster")),
    Check("c_learned", "the fastest configuration learns", learned()),
]

BASE_NUMBERS = {
    **roofline_numbers(), **config_numbers(), **gradient_numbers(), **hardware_numbers(),
    **multi_gpu_numbers(FRAMEWORK), **spread.spread_numbers(FRAMEWORK),
    **spread.across_numbers(FRAMEWORK, ("R3", "B2", "B6")), **verdict_phrases("B2", "B6"),
    "shown_rule": shown_rule(FRAMEWORK), "R1_vs_R0": gain_of("R1"), "R3_vs_R3c": ratio_of("R3", "R3c"),
    "B3_keep": keep_words("B3"), "B7_keep": keep_words("B7"),
    "B9_ratio": rung_value("B9", "ratio"), "B10_ratio": rung_value("B10", "ratio"),
    "B11_ratio": rung_value("B11", "ratio"), "B9_lt_calls": detail_of("B9", "cublaslt_calls"),
    "B12_ratio": rung_value("B12", "ratio"),
    "s_B9_B12_missing": unmeasured_sentence(("B9", "B10", "B11", "B12"), MISSING_WHY),
}


_values = values_of(BASE_NUMBERS)      # what the stories fill their fields from


STORIES = [
    Story("s_R1", (
        (regime("R1", HOST),
         "At the chapter's batch its step waits on the host: its kernels are busy {R1_busy} of the "
         "{R1_step_ms} step."),
        (regime("R1", *DEVICE),
         "At the chapter's batch its kernels are already busy {R1_busy} of the {R1_step_ms} step: "
         "on this run the device, not the host, sets R1's pace."),
    ), "This run recorded no profile of the jitted step.", _values),
    Story("s_R2", (
        (all_of(regime("R2", *DEVICE), regime("R1", HOST)),
         "so many more that the device, not the host, now sets the pace: they are busy {R2_busy} "
         "of the {R2_step_ms} step."),
        (regime("R2", *DEVICE),
         "and the device sets the pace, as it did for R1: they are busy {R2_busy} of the "
         "{R2_step_ms} step."),
        (regime("R2", HOST),
         "yet on this run the host still sets the pace: the kernels are busy only {R2_busy} of the "
         "{R2_step_ms} step, which is how the chapter read this rung on its RTX 4090, a step "
         "overhead-bound at batch {cfg_batch}."),
    ), "This run recorded no profile of the bf16 step.", _values),
    Story("s_R3", (
        (settled("R3", False),
         "Its windows, between {R3_windows}, never settle, so no ratio to R2 is credited."),
        (settled("R3", True),
         "Its windows settled on this run ({R3_ratio} R2), which they do not on every run."),
    ), "R3 runs at {R3_rate} tokens/s.", _values),

    # B9-B12 need a GPU: where a run lacks one, its story says nothing and s_B9_B12_missing
    # names it
    Story("s_B9", (
        (all_of(verdict("B9", *NOT_FASTER), plain_epilogues("B9")),
         "Asking for cuBLASLt changes nothing measurable ({B9_ratio}): the compiled step's "
         "{B9_lt_calls} GEMMs are cuBLASLt calls, each with the plain epilogue, so XLA moved no bias "
         "add or GELU into them and FC1's elementwise work stays in kernels of its own."),
        (verdict("B9", "faster"), "XLA's cuBLASLt GEMMs pay ({B9_ratio})."),
        (verdict("B9", *NOT_FASTER), "XLA's cuBLASLt GEMMs do not pay ({B9_ratio})."),
    ), "", _values),
    Story("s_B10", (
        (verdict("B10", "faster"), "Our GELU backward with the bias sums pays ({B10_ratio})."),
        (verdict("B10", *NOT_FASTER), "Our GELU backward with the bias sums is no faster than XLA's "
         "own kernels for the same work ({B10_ratio})."),
    ), "", _values),
    Story("s_B11", (
        (verdict("B11", "faster"), "Recording the step's kernels into CUDA graphs pays ({B11_ratio})."),
        (verdict("B11", *NOT_FASTER), "Recording the step's kernels into CUDA graphs buys nothing "
         "measurable ({B11_ratio})."),
    ), "", _values),
    Story("s_B12", (
        (verdict("B12", "faster"), "Adding the QKV bias inside the attention kernels pays "
         "({B12_ratio})."),
        (verdict("B12", *NOT_FASTER), "Adding the QKV bias inside the attention kernels buys "
         "nothing measurable ({B12_ratio})."),
    ), "", _values),
    roofline_story(_values, "ours recomputes each live tile of the backward twice, once for dK and dV "
                            "and once for dQ"),
]

NUMBERS = {**BASE_NUMBERS, **{s.key: s for s in STORIES}}
