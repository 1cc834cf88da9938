"""One JAX rung's measurement, in the same order for every rung: ``trial``.

    build the recipe's step (fresh init) -> compile (the step's program, and beside it in a
    helper thread the model gate's: ``perfladder.jax.beside``) -> gates (on the fresh model: the model gate with the
    step's own loss and gradients, the optimizer gate of the step's form, the rung's own
    checks; the loss gate's steps include the first, compiling, call) -> first call ->
    receipt (dtypes written while the step was traced, the returned loss's included) -> the
    compiler's plan -> timed windows until they settle (their tokens checked) -> profile ->
    fp32 masters checked -> ``Evidence`` (the engine records it)

A data-parallel rung also checks that its devices were fed different rows of the stream.

A gate or a receipt that fails raises: the engine records the rung as skipped, with the error.
Every phase's seconds go into the evidence (``details['seconds']``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from perfladder.jax.beside import Beside
from perfladder.jax.checks import assert_fp32_masters, distinct_devices
from perfladder.jax.gates import (
    compile_optimizer_gate_reference,
    model_gate,
    model_gate_programs,
    optimizer_gate,
)
from perfladder.jax.lab import JaxLab
from perfladder.jax.program import embedding_scatters, matmul_dtypes
from perfladder.jax.recipe import Recipe
from perfladder.jax.step import TrainStep, make_optimizer, scatter_add_dtypes
from perfladder.jax.stream import batches
from perfladder.jax.timer import cache_hit_count, compile_count
from perfladder.ladder.rung import Evidence, Given
from perfladder.measure.counts import check_tokens
from perfladder.measure.evidence import Compile, Gate, Receipt, Timing
from perfladder.measure.gates import GATE_STEPS, LOSS_RTOL, LossGateError, loss_gate
from perfladder.measure.gates import check_receipt as check_receipt_dict
from perfladder.measure.timing import Stopwatch, phase

__all__ = ["trial", "loss_gate", "gate_batches", "LOSS_TOL", "LossGateError", "GATE_STEPS"]
GATE_ROWS = 8       # sequences of the fixed batch the model gate compares (its cost, not its power)
LOSS_TOL = LOSS_RTOL            # the loss gate's tolerance: perfladder.measure.gates says why


def model_gated(recipe: Recipe) -> bool:
    """Whether ``model_gates`` gates ``recipe``: not the naive cast, whose bf16-rounded weights
    are a real model change (its lesson is its receipt), nor the plain recipe itself."""
    return not (recipe.naive_cast or recipe.replace(jit="nnx") == Recipe(batch_size=recipe.batch_size))


def gate_programs(lab: JaxLab, recipe: Recipe, step: TrainStep, X, Y) -> list[Callable]:
    """What ``model_gates`` will compile for ``step`` that autotunes nothing, as jobs that
    compile without running (``perfladder.jax.beside.Beside``): the model gate's two programs,
    and the step-form gate's reference step the first time that gate runs compiled. (The
    step form itself is the rung's own code, compiled as the rung compiles it: autotuned.)"""
    if not model_gated(recipe):
        return []
    n = min(GATE_ROWS, X.shape[0])
    reference = lab.model(Recipe(batch_size=recipe.batch_size), plain_code=True)
    jobs = model_gate_programs(reference, step.model, X[:n], Y[:n], step_fn=lab.code["train_step"],
                               xla_options=recipe.xla_options)
    if recipe.jit != "none" and "reference" not in lab.memo.get(_FORM_REFERENCE.format(jit=True), {}):
        model = lab.model(Recipe(batch_size=GATE_ROWS, jit=recipe.jit), plain_code=True)
        Xg, Yg = gate_batches(lab, lab.config.batch_size)[0]
        jobs.append(lambda: compile_optimizer_gate_reference(model, Xg[:GATE_ROWS], Yg[:GATE_ROWS],
                                                             lab.config.lr))
    return jobs


def model_gates(lab: JaxLab, recipe: Recipe, step: TrainStep, X, Y,
                watch: Stopwatch | None = None) -> list[Gate]:
    """The first line, before the step's first call: its model computes the plain fp32 model's
    logits and, through the step's own ``train_step`` (the lab's technique code, compiled),
    its loss and every parameter's gradient (``perfladder.jax.gates.model_gate``, on a few rows
    of a fixed batch); then the optimizer gate of its step form (``step_form_gate``). Not for
    the naive cast, whose bf16-rounded weights are a real model change (its lesson is its
    receipt), nor for the plain recipe itself. ``watch``: each gate's seconds, as
    ``gates/model`` and ``gates/step form``."""
    plain = Recipe(batch_size=recipe.batch_size)
    if not model_gated(recipe):
        return []
    n = min(GATE_ROWS, X.shape[0])
    # both sides compiled: op by op, a ladder's first bf16 gate dispatched and compiled every
    # operation of a forward and backward on its own (27 s of the CPU smoke ladder's R2);
    # compiled, the reference is one program for the whole ladder and
    # the candidate one small program per rung
    with phase(watch, "gates/model"):
        model = model_gate(lab.model(plain, plain_code=True), step.model, [(X[:n], Y[:n])],
                           reference_jit=True, step_fn=lab.code["train_step"],
                           xla_options=recipe.xla_options).evidence()
    with phase(watch, "gates/step form"):
        form = step_form_gate(lab, recipe)
    return [model, form]


_FORM_REFERENCE = "step_form_reference jit={jit}"     # lab.memo: the reference's runs, per jit


def step_form_gate(lab: JaxLab, recipe: Recipe) -> Gate:
    """The optimizer gate of ``recipe``'s step form ('none', 'nnx' or 'split', built by
    ``TrainStep.of`` with the lab's technique code): ``GATE_STEPS`` steps of that form against
    the library's AdamW step, every parameter's displacement (``perfladder.jax.gates.
    optimizer_gate``), on the plain fp32 model at ``GATE_ROWS`` rows -- the form (state
    threading, donation, write-back) does not depend on the model's dtype -- once per form and
    code for the ladder (``lab.memo``). A jitted form runs compiled against the compiled
    reference: op by op, the first gate of a ladder dispatched and compiled every operation
    of three steps on its own (27 s of the CPU smoke ladder's R2 with the model gate);
    the un-jitted form runs op by op against the reference op by op (the same arithmetic)."""
    code = (recipe.jit, lab.code["train_step"], lab.code["jit_step"])
    cache = lab.memo.setdefault("step_form_gates", {})
    if code not in cache:
        plain = Recipe(batch_size=GATE_ROWS, jit=recipe.jit)
        model = lab.model(plain, plain_code=True)

        def form(m, opt):
            return TrainStep.of(m, opt, plain, code=lab.code)
        form.step_form, form.__name__ = True, f"TrainStep(jit={recipe.jit!r})"
        rows = [(X[:GATE_ROWS], Y[:GATE_ROWS]) for X, Y in gate_batches(lab, lab.config.batch_size)]
        jit = recipe.jit != "none"
        cache[code] = optimizer_gate(model, make_optimizer(model, lab.config.lr), rows,
                                     lr=lab.config.lr, step=form, jit=jit, same_gradients=False,
                                     memo=lab.memo.setdefault(_FORM_REFERENCE.format(jit=jit), {})
                                     ).evidence()
    return dataclasses.replace(cache[code])


def distinct_shards(X) -> Gate:
    """A data-parallel batch: every device's shard holds other rows (``distinct_devices``)."""
    digests = distinct_devices(X)
    return Gate(name="distinct batches", passed=True, values={"devices": len(digests)},
                reference="each device's shard of the first batch, by content",
                detail={"digests": digests})


def check_receipt(recipe: Recipe, receipt: Receipt, dots: dict[str, int],
                  loss: str | None = None) -> None:
    """A recipe computes in what it claims (``perfladder.measure.gates.check_receipt``, the one
    rule of both frameworks): every observed dtype and every forward matmul (``dots``; bf16: all
    bf16 but the fp32 one-hot lookup of ``embed_fp32``), and its loss, read from the step itself
    (``loss``: the returned loss's dtype, written while it was traced), in fp32. A naive cast
    claims bf16 and must compute in fp32: the lesson of R2a (the arrays are bf16, the compute
    is not). ``ReceiptError`` if not."""
    expect = "bf16" if recipe.bf16 and not recipe.naive_cast else "fp32"
    lookups = 1 if (recipe.bf16 and recipe.embed == "onehot" and recipe.embed_fp32) else 0
    check_receipt_dict({**receipt.observed, "loss": loss, "matmul_operands": dots}, expect,
                       what=f"{recipe}'s timed step", allow_fp32_matmuls=lookups)


GATE_SEED_OFFSET = 10_000   # the loss gate's fixed batches come from their own shuffle seed


def gate_batches(lab: JaxLab, batch_size: int) -> list:
    """``GATE_STEPS`` fixed (X, Y) batches of ``batch_size``, the same for every configuration."""
    cache = lab.memo.setdefault("gate_batches", {})
    if batch_size not in cache:
        stream = batches(lab.data, batch_size, seed=lab.config.seed + GATE_SEED_OFFSET)
        cache[batch_size] = [next(stream) for _ in range(GATE_STEPS)]
    return cache[batch_size]


def reference_recipe(batch_size: int) -> Recipe:
    """What every beyond rung's losses are held against: the plain model computing in bf16 under
    ``nnx.jit``, built from the library's code (as PyTorch's eager bf16 reference), its blocks
    recomputed in the backward (R4's checkpointing: the same arithmetic in a fraction of the
    memory). Without it the reference's XLA attention plans about 20 GiB at batch 1024, beside
    the candidate it checks: the gate, not the rung, would decide what fits on a 24 GB card."""
    return Recipe(batch_size=batch_size, dtype="bfloat16", checkpoint=True)


def reference_losses(lab: JaxLab, batch_size: int) -> list[float]:
    cache = lab.memo.setdefault("reference_losses", {})
    if batch_size not in cache:
        step = lab.build_step(reference_recipe(batch_size), plain_code=True)
        cache[batch_size] = [float(step(X, Y)) for X, Y in gate_batches(lab, batch_size)]
    return cache[batch_size]


def trial(lab: JaxLab, given: Given, *, recipe: Recipe | None = None, check: Callable | None = None,
          check_programs: Callable | None = None, loss_gate_: bool = False, loss_tol: float = LOSS_RTOL,
          inspect: Callable | None = None, after: Callable | None = None, evidence: bool = False,
          stream=None, place=None, devices: int = 1, eager: bool = False, details=None,
          notes=(), prediction=None) -> Evidence:
    """Gate, compile, plan, time and profile ``recipe`` (default: the given one); see the module
    docstring.

    ``check(step, X, Y) -> [Gate]`` runs on the fresh model; ``check_programs(step, X, Y) ->
    [job]``: what it compiles, compiled beside the step (``perfladder.jax.beside``); ``loss_gate_`` adds the loss gate
    (its first steps on fixed batches against ``reference_recipe``'s); ``inspect(hlo_text,
    details) -> dict`` reads the compiled program before timing; ``after(step, stream, base)
    -> dict`` runs after timing (``base()`` builds the step of the configuration the rung builds
    on); ``evidence`` records the embedding gradient's scatters (jaxpr and HLO).
    ``stream`` / ``place`` / ``devices``: a sharded step's batches, state layout, device count.
    ``eager``: an un-jitted step (no plan, short windows, no profile).
    """
    recipe = given.recipe if recipe is None else recipe
    watch = given.watch
    with watch("build"):
        step = lab.build_step(recipe, place)
    stream = lab.stream(recipe.batch_size) if stream is None else stream
    X, Y = next(stream)
    details = dict(details or {})
    ahead = loaded = 0
    if step.jitted:
        # the step's program (autotuned) here, the gates' (not autotuned) beside it
        with watch("compile"):
            jobs = gate_programs(lab, recipe, step, X, Y) if devices == 1 else []
            beside = Beside(jobs + (list(check_programs(step, X, Y)) if check_programs else []))
            try:
                c0, h0 = compile_count(this_thread=True), cache_hit_count(this_thread=True)
                step.compile_ahead(X, Y)
                ahead = compile_count(this_thread=True) - c0
                loaded = cache_hit_count(this_thread=True) - h0
            finally:     # a step that fails to compile leaves no compile running into the next rung
                details["compiled beside the step"] = beside.join()
        if devices == 1:          # its own plan, before it holds any of it
            lab.admit_plan(step, recipe.batch_size)
    with watch("gates"):
        gates = model_gates(lab, recipe, step, X, Y, watch) if devices == 1 else [distinct_shards(X)]
        if check is not None:
            with watch("gates/checks"):
                gates += list(check(step, X, Y))
        details["matmul_dtypes"] = matmul_dtypes(lab.code["cast_arrays"](step.model)
                                                 if recipe.naive_cast else step.model, X)
        if evidence:             # before the first call: a split step donates the model's arrays
            details["jaxpr_embedding_scatter_add"] = scatter_add_dtypes(step.model, X, Y)
    c0 = compile_count()
    if loss_gate_:
        with watch("gates"):
            with watch("gates/loss reference"):
                want = reference_losses(lab, recipe.batch_size)  # before the candidate's first call
            fixed = gate_batches(lab, recipe.batch_size)
            c0 = compile_count()
            with watch("gates/loss steps"):
                losses = [step(*b) for b in fixed]              # its first call among them
            gates.append(loss_gate(losses, want, f"the plain bf16 recipe ({reference_recipe(recipe.batch_size)}), "
                                   f"same init, same {len(fixed)} batches", loss_tol))
    else:
        with watch("first call"):
            step(X, Y)
    compiled = Compile(first_call_s=(step.compiled_ahead_s or 0.0) + step.first_call_s,
                       compilations=ahead + compile_count() - c0,
                       cache_hits=loaded if step.jitted else None)
    with watch("receipt"):
        receipt = lab.receipt(recipe, step)
        details["loss_dtype"] = step.observed.get("loss")
        check_receipt(recipe, receipt, details["matmul_dtypes"], details["loss_dtype"])
    plan = None
    if not eager:
        with watch("plan"):
            plan = lab.plan(step, X, Y)
            details["traced_flops_per_step"] = plan.traced_flops
            if evidence:
                details["hlo_embedding_scatter"] = embedding_scatters(
                    plan.text, tuple(step.model.token_emb.embedding.shape))
            if inspect is not None:
                details.update(inspect(plan.text, details))
    with watch("time"):
        measured = lab.measure(step, recipe.batch_size, stream=stream, eager=eager)
    t = measured.throughput
    check_tokens(t, f"{given.rung.name}'s timed step")
    if plan is not None:
        details["traced_tflops"] = plan.traced_flops / t.step_time_s / 1e12
    with watch("profile"):
        profile = None if eager else lab.profile(step, stream, plan.text, devices)
    if after is not None:
        with watch("after"):
            details.update(after(step, stream, lambda: lab.build_step(given.base_recipe, plain_code=True)))
    model, optimizer = step.commit()
    if recipe.bf16:
        assert_fp32_masters(model, optimizer)
        gates.append(Gate(name="fp32 masters", passed=True, reference="after the timed steps",
                          detail={"parameters": "float32", "optimizer state": "float32"}))
    details["step_ms"] = 1e3 * t.step_time_s
    details["seconds"] = watch.seconds
    return Evidence(timing=Timing.of(t, measured.remeasured), recipe=recipe, gates=gates, receipt=receipt,
                    compile=compiled, memory=lab.planned(plan), profile=profile,
                    prediction=prediction, details=details, notes=list(notes), devices=devices)
