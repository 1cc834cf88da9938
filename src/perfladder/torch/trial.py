"""One PyTorch rung's measurement, in the same order for every rung: ``trial``.

    build the recipe's step (fresh weights) -> gates -> first call -> receipt -> timed windows
    until they settle -> profile -> ``Evidence`` (the engine records it)

The gates run before the step has taken any optimizer step, because they compare it with the
plain model at the same initial weights: the model gate (logits, the step's own loss, every
parameter's gradient and every matrix gradient's scale against the eager fp32 model,
``perfladder.torch.gates.model_gate``), the optimizer gate (every step form, several steps),
the rung's own checks, then the loss gate (a few optimizer steps whose losses must follow
the eager bf16 reference recipe's). The receipt reads the step's arithmetic (every matmul's
and attention kernel's operand dtypes, ``perfladder.torch.program``); the timed windows'
tokens are checked against batch shape x steps (``perfladder.measure.counts``). A compiled step
compiles on its first call, wherever that call happens; the step times that call itself, so
the compile time is recorded where it is paid. Every phase's seconds go into the evidence
(``details['seconds']``): where a rung's time went, outside its timed windows.

Also here: the loss gate's steps (its rule: ``perfladder.measure.gates.loss_gate``, the same in
both frameworks). Each rung's own equivalence checks: ``perfladder.torch.checks``.
"""
from __future__ import annotations

from typing import Callable

import torch

from perfladder.ladder.rung import Evidence, Given
from perfladder.measure.counts import check_tokens
from perfladder.measure.evidence import Compile, Gate, Timing
from perfladder.measure.gates import GATE_STEPS, LOSS_RTOL, LossGateError
from perfladder.measure.gates import loss_gate as loss_rule
from perfladder.measure.timing import Stopwatch, phase
from perfladder.torch.gates import model_gate, optimizer_gate
from perfladder.torch.lab import TorchLab
from perfladder.torch.program import arithmetic
from perfladder.torch.recipe import Recipe
from perfladder.torch.stream import batches
from perfladder.torch.timer import cache_events, compile_count, loaded

__all__ = ["trial", "loss_gate", "gate_batches", "reference_chunks", "LOSS_TOL", "LossGateError"]
GATE_SEED_OFFSET = 10_000  # the gate's batches come from their own shuffle seed
GATE_ROWS = 8              # rows of each fixed batch the optimizer gate's reference runs on
LOSS_TOL = LOSS_RTOL       # the loss gate's tolerance: perfladder.measure.gates says why
REFERENCE = "the reference recipe, eager bf16"


def trial(lab: TorchLab, given: Given, *, recipe: Recipe | None = None, optimizer_gate_: bool = True,
          loss_gate_: bool = False, checks: tuple[Callable, ...] = (), profile: bool = True,
          details: dict | None = None, notes=()) -> Evidence:
    """Gate, time and profile ``recipe`` (default: the one the rung was given); see the module
    docstring. ``checks``: ``check(lab, step, recipe) -> Gate`` run with the gates, on the
    fresh step."""
    recipe = given.recipe if recipe is None else recipe
    B, watch = recipe.batch_size, given.watch
    if loss_gate_:
        with watch("reference"):
            reference_losses(lab, B)       # its memory is gone before the candidate is built
    c0 = compile_count()
    with cache_events() as caches:                    # wherever the step compiles, up to here
        with watch("build"):
            step = lab.build_step(recipe)
        with watch("gates"):
            gates = model_gates(lab, step, recipe, optimizer=optimizer_gate_, watch=watch)
            if checks:
                with watch("gates/checks"):
                    gates += [check(lab, step, recipe) for check in checks]
            if loss_gate_:
                with watch("gates/loss steps"):
                    gates.append(loss_gate(lab, step, B))
        with watch("first call"):
            if "optimizer" not in step.first_call_s:       # nothing above took a whole step
                step(*next(lab.stream(B)))
    compiled = Compile(first_call_s=sum(step.first_call_s.values()),
                       compilations=compile_count() - c0, cache_hits=loaded(caches))
    with watch("receipt"):
        X, Y = gate_batches(lab, B)[0]
        arith = arithmetic(step, X[:GATE_ROWS], Y[:GATE_ROWS])   # dtypes do not depend on B
        receipt = lab.receipt(step, recipe, arith)
    with watch("time"):
        measured = lab.measure(step, B)
    check_tokens(measured.throughput, f"{given.rung.name}'s timed step")
    lab.receipt(step, recipe)                       # the timed calls computed the same way
    with watch("profile"):
        prof = lab.profile(step, B) if profile else None
    return Evidence(timing=Timing.of(measured.throughput, measured.remeasured), recipe=recipe,
                    gates=gates, receipt=receipt, compile=compiled, memory=measured.memory, profile=prof,
                    details={**(details or {}), "arithmetic": arith, "seconds": watch.seconds,
                             **({"compile_cache": caches} if caches else {})},
                    notes=list(notes))


# -- the gates run before timing -------------------------------------------------------------------
def gate_batches(lab: TorchLab, batch_size: int) -> list:
    """``GATE_STEPS`` fixed (X, Y) batches of ``batch_size``, the same for every configuration."""
    cache = lab.memo.setdefault("gate_batches", {})
    if batch_size not in cache:
        stream = batches(lab.data, batch_size, lab.device, seed=lab.config.seed + GATE_SEED_OFFSET)
        cache[batch_size] = [next(stream) for _ in range(GATE_STEPS)]
    return cache[batch_size]


def model_gates(lab: TorchLab, step, recipe: Recipe, optimizer: bool = True,
                watch: Stopwatch | None = None) -> list[Gate]:
    """The first line: ``step`` computes the plain model's logits, loss and every parameter's
    gradient (``perfladder.torch.gates.model_gate``) against the eager fp32 model of the same
    weights, on a fixed batch of its own shape; with ``optimizer`` (every step form: fused,
    compiled or default AdamW, CUDA graphs), its optimizer step moves every parameter as the
    default AdamW does on the same gradients, over ``GATE_STEPS`` steps (one would hide the
    betas behind Adam's bias correction) on ``GATE_ROWS`` rows. Raises a ``GateError``;
    returns the evidence. ``watch``: each gate's seconds (``gates/model``, ``gates/optimizer``;
    a compiled step compiles inside the model gate)."""
    plain = Recipe(batch_size=recipe.batch_size)
    if recipe == plain:
        return []
    fixed = gate_batches(lab, recipe.batch_size)
    with phase(watch, "gates/model"):
        out = [model_gate(lab.build_step(plain, plain_code=True), step, fixed[:1],
                          reference_chunks=reference_chunks(lab, recipe.batch_size)).evidence()]
    if optimizer:
        rows = [(X[:GATE_ROWS], Y[:GATE_ROWS]) for X, Y in fixed]
        with phase(watch, "gates/optimizer"):
            out.append(optimizer_gate(lab.build_step(plain, plain_code=True), step, rows).evidence())
    lab.free(graphs=False)
    return out


def reference_chunks(lab: TorchLab, batch_size: int) -> int:
    """How many slices the model gate's fp32 reference takes a batch in: slices of the seed's
    batch, so that the reference's activations stay those of R0's step. Run whole, an fp32
    reference at a doubled batch holds about twice R3c's memory beside the candidate (15 GiB
    per 512 rows): the gate, not the rung, would decide what fits on a 24 GB card."""
    seed = lab.config.batch_size
    return batch_size // seed if batch_size > seed and batch_size % seed == 0 else 1


def gate_losses(step, fixed) -> list[float]:
    """Losses of ``step`` over ``fixed`` (read once at the end)."""
    return torch.stack([step(X, Y) for X, Y in fixed]).float().cpu().tolist()


def reference_losses(lab: TorchLab, batch_size: int) -> list[float]:
    """The reference recipe (eager, bf16 autocast, the library's own code) from the initial
    weights over ``gate_batches``."""
    cache = lab.memo.setdefault("reference_losses", {})
    if batch_size not in cache:
        step = lab.build_step(Recipe(batch_size=batch_size, bf16=True), plain_code=True)
        cache[batch_size] = gate_losses(step, gate_batches(lab, batch_size))
        del step
        lab.free(graphs=False)
    return cache[batch_size]


def loss_gate(lab: TorchLab, step, batch_size: int, rtol: float = LOSS_TOL) -> Gate:
    """``step``'s losses over the fixed batches against the eager bf16 reference's
    (``perfladder.measure.gates.loss_gate``: ``LossGateError`` past ``rtol``)."""
    ref = reference_losses(lab, batch_size)
    return loss_rule(gate_losses(step, gate_batches(lab, batch_size)), ref, REFERENCE, rtol)
