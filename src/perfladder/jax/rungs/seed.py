"""The chapter's JAX rungs: one declaration and one small function each.

Each rung's technique is a function of ``perfladder.jax.step`` or ``perfladder.jax.model``
(what its notebook cell shows); a function here says what its measurement checks and hands
it to ``perfladder.jax.trial.trial``, which returns the evidence the engine records. Ratios
are taken against R1, the jitted step: un-jitted JAX is not a training mode.
"""
from __future__ import annotations

from perfladder.jax.checks import (
    check_jit_parity,
    check_mirror,
    checkpoint_saves,
    jit_parity_program,
    two_forwards_program,
)
from perfladder.jax.lab import EAGER_MAX_WINDOWS, EAGER_WINDOWS, JaxLab
from perfladder.jax.rungs import changes as ch
from perfladder.jax.trial import trial
from perfladder.ladder.rung import Evidence, Given, Rung
from perfladder.measure.evidence import Gate
from perfladder.measure.gates import MIRROR_TOL, PARITY_TOL


def r0_eager(lab: JaxLab, given: Given) -> Evidence:
    """The un-jitted step, measured briefly: what forgetting ``jit`` costs."""
    c = lab.config
    return trial(lab, given, eager=True,
                 notes=[f"measured briefly: 1 warm-up step, windows of {c.eager_timed} steps, "
                        f"settled over {EAGER_WINDOWS} (at most {EAGER_MAX_WINDOWS} per attempt)"])


def r1_compile(lab: JaxLab, given: Given) -> Evidence:
    """The whole step (forward, gradients, AdamW) under one ``nnx.jit``."""
    recipe = given.recipe

    def parity(step, X, Y):
        tol = PARITY_TOL[recipe.dtype]
        diff = check_jit_parity(step.model, X, tol=tol)
        return [Gate(name="jit parity", passed=True, values={"rel_diff": diff},
                     tolerances={"rel_diff": tol},
                     reference="the same model's op-by-op logits, at probe weights")]

    B, T = recipe.batch_size, lab.config.num_steps
    return trial(lab, given, check=parity,
                 check_programs=lambda step, X, Y: [jit_parity_program(step.model, X)],
                 details={"model_flops_per_step": lab.flops_per_token(T) * B * T})


def r2a_naive_cast(lab: JaxLab, given: Given) -> Evidence:
    """Cast every floating array to bf16 and run: the modules cast them straight back (its
    receipt check raises if the cast did compute in bf16)."""
    ev = trial(lab, given)
    ev.notes.append(f"receipt: claimed bf16, observed {ev.receipt.observed}")
    return ev


def r2_bf16(lab: JaxLab, given: Given) -> Evidence:
    """bf16 threaded for real: compute dtype bf16 in every module, fp32 masters, fp32 loss."""
    return trial(lab, given)


def r3c_fp32_control(lab: JaxLab, given: Given) -> Evidence:
    """Control: the big batch without bf16."""
    return trial(lab, given, evidence=True)


def r3_batch_up(lab: JaxLab, given: Given) -> Evidence:
    """bf16 at the big batch: the fixed per-step cost is divided over more tokens."""
    return trial(lab, given, evidence=True)


def r4_checkpoint(lab: JaxLab, given: Given) -> Evidence:
    """Every block through ``checkpoint_block`` (``nnx.remat``): activations recomputed in the
    backward pass."""
    recipe = given.recipe

    def mirror(step, X, Y):
        tol = MIRROR_TOL[recipe.dtype]
        reference = lab.model(recipe.replace(checkpoint=False), plain_code=True)   # the same init
        diff = check_mirror(reference, step.model, X, tol=tol)
        return [Gate(name="checkpoint mirror", passed=True, values={"rel_diff": diff},
                     tolerances={"rel_diff": tol},
                     reference="the same recipe without checkpointing, same init, probe weights"),
                # the mirror passes a remat that recomputes nothing: the residuals tell
                checkpoint_saves(reference, step.model, X)]

    def programs(step, X, Y):
        reference = lab.model(recipe.replace(checkpoint=False), plain_code=True)
        return [two_forwards_program(step.model, reference, X)]

    return trial(lab, given, check=mirror, check_programs=programs)


R0 = Rung("R0", "eager", "un-jitted", r0_eager,
          gate="none: the reference model, run op by op")
R1 = Rung("R1", "compile", "jit (whole step)", r1_compile, builds_on="R0",
          change=lambda r, c: r.replace(jit="nnx"),
          gate="jitted logits == the same model's op-by-op logits")
R2a = Rung("R2a", "bf16_naive_cast", "naive bf16 cast", r2a_naive_cast, kind="control",
           builds_on="R1", change=lambda r, c: r.replace(naive_cast=True),
           gate="receipt: the timed step computed in fp32 (the lesson), asserted")
R2 = Rung("R2", "bf16", "+bf16 (threaded)", r2_bf16, builds_on="R1",
          change=lambda r, c: r.replace(dtype="bfloat16"),
          gate="receipt: activations and logits bf16, every forward matmul bf16; fp32 masters")
R3c = Rung("R3c", "fp32_control", "fp32 @ big batch", r3c_fp32_control, kind="control",
           builds_on="R1", change=ch.big_batch,
           gate="R1's step; only the batch changes")
R3 = Rung("R3", "batch_up", "+big batch", r3_batch_up, builds_on="R2",
          change=ch.big_batch,
          gate="R2's step; only the batch changes")
R4 = Rung("R4", "checkpoint", "+checkpoint", r4_checkpoint, builds_on="R3",
          change=lambda r, c: r.replace(checkpoint=True),
          gate="checkpointed logits == the same model's without remat")

SEED = [R0, R1, R2a, R2, R3c, R3, R4]
