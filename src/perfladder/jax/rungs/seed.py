"""The seed rungs of the JAX ladder: one declaration and one small function each.

Each function gets the lab, its recipe (its base's recipe with its ``change`` applied) and
its base's name, gates before it times, and returns its ``RungResult``. Ratios are taken
against R1, the jitted step: un-jitted JAX is not a training mode.
"""
from __future__ import annotations

from perfladder.jax.lab import EAGER_MAX_WINDOWS, EAGER_WINDOWS, JaxLab
from perfladder.jax.recipe import Recipe
from perfladder.jax.step import (
    MIRROR_TOL,
    PARITY_TOL,
    check_jit_parity,
    check_mirror,
    matmul_dtypes,
)
from perfladder.jax.trial import check_receipt, trial
from perfladder.ladder.engine import Rung
from perfladder.measure.evidence import Gate


def r0_eager(lab: JaxLab, recipe: Recipe, base):
    """The un-jitted step, measured briefly: what forgetting ``jit`` costs."""
    step = lab.build_step(recipe)
    X, _ = next(lab.stream(recipe.batch_size))
    dots = matmul_dtypes(step.model, X)
    t, remeasured = lab.measure(step, recipe.batch_size, eager=True)
    receipt = lab.receipt(recipe, step)
    check_receipt(recipe, receipt, dots)
    c = lab.config
    return lab.record(R0, recipe, t, remeasured=remeasured, receipt=receipt,
                      memory=lab.planned(None), details={"matmul_dtypes": dots},
                      notes=[f"measured briefly: 1 warm-up step, windows of {c.eager_timed} steps, "
                             f"settled over {EAGER_WINDOWS} (at most {EAGER_MAX_WINDOWS} per attempt)"])


def r1_compile(lab: JaxLab, recipe: Recipe, base):
    """The whole step (forward, gradients, AdamW) under one ``nnx.jit``."""
    def parity(step, X, Y):
        tol = PARITY_TOL[recipe.dtype]
        diff = check_jit_parity(step.model, X, tol=tol)
        return [Gate(name="jit parity", passed=True, values={"rel_diff": diff},
                     tolerances={"rel_diff": tol}, reference="the same model's op-by-op logits")]

    tr = trial(lab, recipe, check=parity)
    B, T = tr.t.batch_shape
    return tr.record(lab, R1, details={"model_flops_per_step": lab.model_flops_per_token(T) * B * T})


def r2a_naive_cast(lab: JaxLab, recipe: Recipe, base):
    """Cast every floating array to bf16 and run: the modules cast them straight back."""
    tr = trial(lab, recipe)          # its receipt check raises if the cast did compute in bf16
    return tr.record(lab, R2a, kind="control",
                     notes=[f"receipt: claimed bf16, observed {tr.receipt.observed}"])


def r2_bf16(lab: JaxLab, recipe: Recipe, base):
    """bf16 threaded for real: compute dtype bf16 in every module, fp32 masters, fp32 loss."""
    return trial(lab, recipe).record(lab, R2)


def r3c_fp32_control(lab: JaxLab, recipe: Recipe, base):
    """Control: the big batch without bf16."""
    return trial(lab, recipe, evidence=True).record(lab, R3c, kind="control")


def r3_batch_up(lab: JaxLab, recipe: Recipe, base):
    """bf16 at the big batch: the fixed per-step cost is divided over more tokens."""
    return trial(lab, recipe, evidence=True).record(lab, R3)


def r4_checkpoint(lab: JaxLab, recipe: Recipe, base):
    """Every block under ``nnx.remat``: activations recomputed in the backward pass."""
    def mirror(step, X, Y):
        tol = MIRROR_TOL[recipe.dtype]
        reference = lab.model(recipe.replace(checkpoint=False))      # the same init
        diff = check_mirror(reference, step.model, X, tol=tol)
        return [Gate(name="checkpoint mirror", passed=True, values={"rel_diff": diff},
                     tolerances={"rel_diff": tol},
                     reference="the same recipe without checkpointing, same init")]

    return trial(lab, recipe, check=mirror).record(lab, R4)


R0 = Rung("R0", "eager", "un-jitted", r0_eager, section="13.3 overhead",
          gate="none: the reference model, run op by op",
          attacks="nothing yet: every operation dispatched one at a time from Python")
R1 = Rung("R1", "compile", "jit (whole step)", r1_compile, builds_on="R0",
          change=lambda r, c: r.replace(jit="nnx"), section="13.3 compilation",
          gate="jitted logits == the same model's op-by-op logits",
          attacks="per-op dispatch and the unfused elementwise kernels")
R2a = Rung("R2a", "bf16_naive_cast", "naive bf16 cast", r2a_naive_cast, kind="control",
           builds_on="R1", change=lambda r, c: r.replace(naive_cast=True),
           section="13.4 mixed precision",
           gate="receipt: the timed step computed in fp32 (the lesson), asserted",
           attacks="matmul time, which it does not reach")
R2 = Rung("R2", "bf16", "+bf16 (threaded)", r2_bf16, builds_on="R1",
          change=lambda r, c: r.replace(dtype="bfloat16"), section="13.4 mixed precision",
          gate="receipt: activations and logits bf16, every forward matmul bf16; fp32 masters",
          attacks="matmul (bf16 tensor cores) and activation bytes")
R3c = Rung("R3c", "fp32_control", "fp32 @ big batch", r3c_fp32_control, kind="control",
           builds_on="R1", change=lambda r, c: r.replace(batch_size=c.big_batch),
           section="13.1 roofline: arithmetic intensity",
           gate="R1's step; only the batch changes",
           attacks="fixed per-step costs, without bf16")
R3 = Rung("R3", "batch_up", "+big batch", r3_batch_up, builds_on="R2",
          change=lambda r, c: r.replace(batch_size=c.big_batch),
          section="13.1 roofline: arithmetic intensity",
          gate="R2's step; only the batch changes",
          attacks="fixed per-step costs (launches, the AdamW update, dispatch)")
R4 = Rung("R4", "checkpoint", "+checkpoint", r4_checkpoint, builds_on="R3",
          change=lambda r, c: r.replace(checkpoint=True), section="13.4 activation checkpointing",
          gate="checkpointed logits == the same model's without remat",
          attacks="activation memory, paid for in recomputed FLOPs")

SEED = [R0, R1, R2a, R2, R3c, R3, R4]
