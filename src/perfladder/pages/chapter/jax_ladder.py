"""The JAX ladder page's checked claims and its own numbers (see ``perfladder.pages.story``).

Each check is one qualitative claim of the prose in ``notebooks/02_jax_ladder.ipynb``, by the
glue key placed after the sentence that makes it.
"""
from __future__ import annotations

from perfladder.measure.verdict import above_unsettled_base
from perfladder.pages.claims import call
from perfladder.pages.story import (
    DEVICE,
    HOST,
    Check,
    beats,
    credited_ratio,
    fastest_is,
    keep_words,
    largest_gap,
    learned,
    less,
    loses_to,
    more,
    ratio_of,
    recorded,
    regime,
    roofline_numbers,
    settled,
    small_change,
    verdict,
)
from perfladder.pages.words import rate

NOT_FASTER = ("slower", "within noise", "unsettled")


def pays(name: str):
    """The rung is faster than the rung it builds on: its verdict is 'faster', or, against a
    base whose windows did not settle, every window of it is above every window the base ever
    showed (``verdict.above_unsettled_base``: the sign is certain; no ratio is credited)."""
    def test(result):
        r = result.rung(name)
        c = call(result, r)
        return (c.word == "faster" or above_unsettled_base(r.verdict),
                f"{name} {rate(r.tokens_per_s)} tokens/s, {c.word} against {c.against}")
    return test


SMALL = 0.03      # "little": within 3% of the base, about the spread a window may have


def gain_of(name: str):
    """The glue value of a rung's gain over its base as the page may state it
    (``story.credited_ratio``: the ratio, or "at least" the bound when its base did not settle)."""
    def value(result):
        r = result.rung(name)
        return credited_ratio(result, r, result.rung(r.builds_on))
    return value


CHECKS = [
    Check("c_R1_faster", "jit pays", verdict("R1", "faster")),
    Check("c_R1_host", "the jitted step waits on the host", regime("R1", HOST)),
    Check("c_R2_not_faster", "bf16 at batch 64 does not pay", verdict("R2", *NOT_FASTER)),
    Check("c_R2_device", "R2's device, not its host, sets the pace", regime("R2", *DEVICE)),
    Check("c_R2_device_more", "R2's bf16 kernels take more device time than R1's fp32 ones",
          more("device_ms", "R2", "R1")),
    Check("c_R3_unsettled", "R3's windows do not settle", settled("R3", False)),
    Check("c_R3_loses", "bf16 loses to its fp32 control at the big batch", loses_to("R3", "R3c")),
    Check("c_R3_scatter", "R3's embedding gradient is a bf16 scatter-add",
          recorded("R3", "jaxpr_embedding_scatter_add", "bfloat16")),
    Check("c_R4_memory", "checkpointing cuts the planned temporaries", less("memory", "R4", "R3")),
    Check("c_R4_not_faster", "checkpointing is no faster", verdict("R4", *NOT_FASTER)),
    Check("c_B1_faster", "the fp32 embedding gradient pays", pays("B1")),
    Check("c_B1_beats_R3c", "and beats the fp32 control", beats("B1", "R3c")),
    Check("c_B2_not_faster", "the one-hot lookup buys nothing more", verdict("B2", *NOT_FASTER)),
    Check("c_B3_host_less", "the split step issues faster", less("host_ms", "B3", "B1")),
    Check("c_B3_small", "the split step changes the rate by little", small_change("B3", SMALL)),
    Check("c_B4_faster", "cuDNN attention pays", verdict("B4", "faster")),
    Check("c_B5_faster", "doubling the batch pays", verdict("B5", "faster")),
    Check("c_B6_faster", "quadrupling pays a little more", verdict("B6", "faster")),
    Check("c_B7_small", "the Pallas add+LayerNorm changes the rate by little", small_change("B7", SMALL)),
    Check("c_B8_faster", "attention as one kernel pays", verdict("B8", "faster")),
    Check("c_B8_fastest", "it is the fastest configuration", fastest_is("B8")),
    Check("c_attention_gap", "attention stands furthest above its roofline floor", largest_gap("attention")),
    Check("c_learned", "the fastest configuration learns", learned()),
]

NUMBERS = {**roofline_numbers(), "R1_vs_R0": gain_of("R1"), "R3_vs_R3c": ratio_of("R3", "R3c"),
           "B3_keep": keep_words("B3"), "B7_keep": keep_words("B7")}
