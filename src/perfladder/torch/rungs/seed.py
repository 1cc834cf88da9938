"""The seed's PyTorch rungs, R0 .. R4, each declared once (``perfladder.ladder.engine.Rung``).

    R0  eager fp32 (TF32 matmuls)        the baseline, profiled
    R1  + torch.compile                  gate: compiled logits == eager logits
    R2  + bf16 autocast (fp32 loss)      receipt from the timed step: logits bf16
    R3c fp32 eager at the big batch      control: what the batch costs without bf16
    R3  + big batch                      re-profiled, peak memory
    R4  + activation checkpointing       gate: the checkpointed model is an exact mirror

Every rung is ``fn(lab, recipe, base) -> RungResult``: the engine hands it the recipe its
declaration's ``change`` made from the rung it builds on.
"""
from __future__ import annotations

import time

from perfladder.ladder.engine import Rung
from perfladder.measure.evidence import Compile
from perfladder.torch.gates import (
    COMPILE_ATOL,
    COMPILE_RTOL,
    MIRROR_ATOL,
    check_compiled,
    check_mirror,
)
from perfladder.torch.lab import TorchLab, passed_gate
from perfladder.torch.loss_gate import model_gates
from perfladder.torch.recipe import Recipe
from perfladder.torch.timer import sync


def first_call(lab: TorchLab, step, batch_size: int, optimizer: bool = True) -> Compile:
    """The first (compiling, for a compiled step) call, outside any timed window. Without
    ``optimizer``, only the forward and backward run and the gradients are dropped, so the
    weights stay where they were."""
    X, Y = next(lab.stream(batch_size))
    sync()
    t0 = time.perf_counter()
    if optimizer:
        step(X, Y)
    else:
        step.forward_backward(X, Y)
    sync()
    if not optimizer:
        step.opt.zero_grad(set_to_none=True)
    return Compile(first_call_s=time.perf_counter() - t0)


def gated_step(lab: TorchLab, recipe: Recipe, optimizer_gate: bool = False):
    """``(step, gates, compile)``: a fresh step of ``recipe``, gated against the plain model
    before it takes any step (the gates need both models at the same initial weights). Its
    first forward and backward -- where a compiled step compiles -- is timed before the gates
    run it, so the compile time is recorded where it is paid, not hidden inside a gate."""
    step = lab.build_step(recipe)
    comp = first_call(lab, step, recipe.batch_size, optimizer=False)
    return step, model_gates(lab, step, recipe, optimizer=optimizer_gate), comp


def measured(lab: TorchLab, name: str, label: str, recipe: Recipe, step, *, kind: str = "rung",
             gates=(), compile=None, profile: bool = True, details=None):
    """Profile ``step`` (outside the timed windows), time it, record the rung."""
    prof = lab.profile(step, recipe.batch_size) if profile else None
    t, again, mem = lab.measure(step, recipe.batch_size)
    receipt = lab.receipt(step, "bf16") if recipe.bf16 else None
    return lab.record(name, label, recipe, t, again, mem, kind=kind, gates=gates, receipt=receipt,
                      compile=compile, profile=prof, details=details)


def r0_eager(lab: TorchLab, recipe: Recipe, base) -> object:
    """Eager fp32 at the seed's batch: the baseline, profiled before it is timed."""
    step = lab.build_step(recipe)
    return measured(lab, "R0", "eager", recipe, step, compile=first_call(lab, step, recipe.batch_size))


def r1_compile(lab: TorchLab, recipe: Recipe, base) -> object:
    """+ torch.compile: first-call compile time, the parity gate, then the profile and the time."""
    step, gates, comp = gated_step(lab, recipe)
    X, _ = next(lab.stream(recipe.batch_size))
    diff = check_compiled(step.model, step.forward, X)
    gate = passed_gate("compiled vs eager logits", "the same model, eager",
                       {"max_abs_diff": diff}, {"atol": COMPILE_ATOL, "rtol": COMPILE_RTOL})
    return measured(lab, "R1", "compile", recipe, step, gates=[*gates, gate], compile=comp)


def r2_bf16(lab: TorchLab, recipe: Recipe, base) -> object:
    """+ bf16 autocast, compiled, at the seed's batch (the receipt comes from the timed calls)."""
    step, gates, comp = gated_step(lab, recipe)
    return measured(lab, "R2", "+bf16", recipe, step, gates=gates, compile=comp)


def r3c_fp32_control(lab: TorchLab, recipe: Recipe, base) -> object:
    """Control: fp32 eager (as in the seed) at the big batch -- its speed and peak memory."""
    step, gates, _ = gated_step(lab, recipe)
    return measured(lab, "R3c", "fp32 eager @ big batch", recipe, step, kind="control",
                    gates=gates, profile=False)


def r3_batch(lab: TorchLab, recipe: Recipe, base) -> object:
    """+ the big batch (compiled, bf16): more tokens per fixed per-step cost; re-profiled."""
    step, gates, comp = gated_step(lab, recipe)
    return measured(lab, "R3", "+batch", recipe, step, gates=gates, compile=comp)


def r4_checkpoint(lab: TorchLab, recipe: Recipe, base) -> object:
    """+ activation checkpointing per block (memory is not the binding constraint here)."""
    plain = lab.make_model(recipe.replace(checkpoint=False))
    step, gates, comp = gated_step(lab, recipe)
    X, _ = next(lab.stream(recipe.batch_size))
    diff = check_mirror(plain, step.model, X)
    del plain
    gate = passed_gate("checkpointed mirror", "the same model without checkpointing, fp32",
                       {"max_abs_diff": diff}, {"atol": MIRROR_ATOL})
    return measured(lab, "R4", "+checkpoint", recipe, step, gates=[*gates, gate], compile=comp)


SEED = [
    Rung("R0", "eager", "eager", r0_eager, builds_on=None, change=None,
         gate="none: the reference every later gate compares with",
         section="13.1 measurement and profiling", attacks="nothing: the baseline"),
    Rung("R1", "compile", "compile", r1_compile, builds_on="R0",
         change=lambda r, c: r.replace(compiled=True),
         gate="compiled logits == eager logits", section="13.3 compilation",
         attacks="launch overhead and the unfused elementwise tail"),
    Rung("R2", "bf16", "+bf16", r2_bf16, builds_on="R1",
         change=lambda r, c: r.replace(bf16=True),
         gate="receipt: the timed step's logits are bf16", section="13.4 mixed precision",
         attacks="matmul time and activation bytes"),
    Rung("R3c", "fp32_control", "fp32 eager @ big batch", r3c_fp32_control, kind="control",
         builds_on="R0", change=lambda r, c: r.replace(batch_size=c.big_batch),
         gate="none: a control", section="13.4 memory anatomy",
         attacks="nothing: prices the big batch without bf16"),
    Rung("R3", "batch_up", "+batch", r3_batch, builds_on="R2",
         change=lambda r, c: r.replace(batch_size=c.big_batch),
         gate="receipt: the timed step's logits are bf16", section="13.1 roofline: arithmetic intensity",
         attacks="fixed per-step cost and small GEMMs"),
    Rung("R4", "checkpoint", "+checkpoint", r4_checkpoint, builds_on="R3",
         change=lambda r, c: r.replace(checkpoint=True),
         gate="checkpointed logits == plain logits (fp32, exact)",
         section="13.4 activation checkpointing", attacks="activation memory (trading time)"),
]
