"""The chapter's PyTorch rungs, R0 .. R4, each declared once (``perfladder.ladder.rung.Rung``).

    R0  eager fp32 (TF32 matmuls)        the first measurement, profiled
    R1  + torch.compile                  gate: compiled logits == eager logits
    R2  + bf16 autocast (fp32 loss)      receipt from the timed step: logits bf16
    R3c fp32 compiled at the big batch   control: R3 without bf16, what the batch buys alone
    R3  + big batch                      re-profiled, peak memory
    R4  + activation checkpointing       gate: the checkpointed model is an exact mirror

Each rung's technique is a function of ``perfladder.torch.step`` or ``perfladder.torch.model``
(what its notebook cell shows); a rung function here only says what its measurement checks.
"""
from __future__ import annotations

import torch

from perfladder.ladder.rung import Evidence, Given, Rung
from perfladder.measure.evidence import Gate
from perfladder.measure.gates import COMPILE_ATOL, COMPILE_RTOL, MIRROR_ATOL
from perfladder.torch.checks import check_compiled, check_mirror, checkpoint_saves
from perfladder.torch.rungs import changes as ch
from perfladder.torch.trial import trial


def compiled_vs_eager(lab, step, recipe) -> Gate:
    """R1's own gate: the compiled module's logits against the same module run eagerly, at
    probe weights (R1 is fp32: the precision it times)."""
    X, _ = next(lab.stream(recipe.batch_size))
    diff = check_compiled(step.model, step.forward, X)
    return Gate(name="compiled vs eager logits", passed=True, values={"max_abs_diff": diff},
                tolerances={"atol": COMPILE_ATOL, "rtol": COMPILE_RTOL},
                reference="the same model, eager, at probe weights")


def checkpoint_mirror(lab, step, recipe) -> Gate:
    """R4's own gate: the checkpointed model is an exact mirror of the plain one, at probe
    weights, in the rung's precision through the step's own ``autocast_bf16`` (eager modules:
    a compiled plain model for the comparison would be a second compile; the compiled
    checkpointed step itself is the model gate's)."""
    plain = lab.make_model(recipe.replace(checkpoint=False))
    X, _ = next(lab.stream(recipe.batch_size))
    X = X[:lab.config.batch_size]                     # exactness does not depend on the batch
    wrap = (lambda m: lab.code["autocast_bf16"](m, lab.device.type)) if recipe.bf16 else None
    with torch.no_grad():
        diff = check_mirror(plain, step.model, X, wrap=wrap,
                            dtype=torch.bfloat16 if recipe.bf16 else torch.float32)
    return Gate(name="checkpointed mirror", passed=True, values={"max_abs_diff": diff},
                tolerances={"atol": MIRROR_ATOL},
                reference=f"the same model without checkpointing, {lab.precision(recipe)}, "
                          "at probe weights")


def checkpoint_recomputes(lab, step, recipe) -> Gate:
    """R4's checkpoint gate: the rung's forward saves at most ``CHECKPOINT_SAVED_RATIO`` of the
    activation bytes the same recipe without checkpointing saves (a checkpoint that calls each
    block directly passes the mirror, and saves them all)."""
    plain = lab.make_model(recipe.replace(checkpoint=False))
    X, _ = next(lab.stream(recipe.batch_size))
    wrap = (lambda m: lab.code["autocast_bf16"](m, lab.device.type)) if recipe.bf16 else None
    return checkpoint_saves(plain, step, X[:lab.config.batch_size], wrap=wrap)


def r0_eager(lab, given: Given) -> Evidence:
    """Eager fp32 at the chapter's batch: the ladder's first measurement, profiled."""
    return trial(lab, given)


def r1_compile(lab, given: Given) -> Evidence:
    return trial(lab, given, checks=(compiled_vs_eager,))


def r2_bf16(lab, given: Given) -> Evidence:
    return trial(lab, given)


def r3c_fp32_control(lab, given: Given) -> Evidence:
    return trial(lab, given, profile=False)


def r3_batch(lab, given: Given) -> Evidence:
    return trial(lab, given)


def r4_checkpoint(lab, given: Given) -> Evidence:
    return trial(lab, given, checks=(checkpoint_mirror, checkpoint_recomputes))


SEED = [
    Rung("R0", "eager", "eager", r0_eager, builds_on=None, change=None,
         gate="none: the reference every later gate compares with"),
    Rung("R1", "compile", "compile", r1_compile, builds_on="R0",
         change=lambda r, c: r.replace(compiled=True), gate="compiled logits == eager logits"),
    Rung("R2", "bf16", "+bf16", r2_bf16, builds_on="R1", change=lambda r, c: r.replace(bf16=True),
         gate="receipt: the timed step's logits are bf16"),
    Rung("R3c", "fp32_control", "fp32 compiled @ big batch", r3c_fp32_control, kind="control",
         builds_on="R1", change=ch.big_batch,
         gate="none: a control (R3 without bf16)"),
    Rung("R3", "batch_up", "+batch", r3_batch, builds_on="R2",
         change=ch.big_batch,
         gate="receipt: the timed step's logits are bf16"),
    Rung("R4", "checkpoint", "+checkpoint", r4_checkpoint, builds_on="R3",
         change=lambda r, c: r.replace(checkpoint=True),
         gate="checkpointed logits == plain logits (in its precision, exact)"),
]
