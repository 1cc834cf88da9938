"""The JAX ladder, one small function per rung: ``rung(ladder) -> RungResult``.

Every rung gates what it must (parity, precision receipts, mirrors) *before* it times,
measures with ``Ladder.time`` (warm-up past compilation, sync-closed windows, recompile
guard), records the compiler's planned temporaries, and appends to ``ladder.result``.
Ratios are taken against ``R1`` (the jitted step): un-jitted JAX is not a training mode.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from functools import partial

import jax
import jax.numpy as jnp

from ..driver import drive
from ..results import LearningCheck, smoothed_check
from .beyond import BEYOND, Runner, embedding_scatters, fastest, kernel_report
from .ladder import EAGER_WINDOWS, Ladder, first_batch
from .parallel import DP_BANDWIDTH, batch_sharding, dp_floor, make_data_mesh, place_state
from .steps import (assert_fp32_masters, check_jit_parity, check_mirror, make_optimizer,
                    make_train_step,
                    matmul_dtypes, naive_bf16, receipt, with_checkpointing)
from .stream import batches
from .timer import compile_count


def _with_plan(ladder: Ladder, name: str, model, opt, X, Y, step=None, evidence=None):
    """The compiled step's FLOPs and planned temporaries (remembered per rung).

    ``evidence`` (a dict) also receives the embedding-gradient scatters of the compiled
    program (``hlo_embedding_scatter``: how many, element types) -- the B rungs' story.
    """
    if evidence is None:
        flops, temp = ladder.plan(model, opt, X, Y, step)
    else:
        flops, temp, text = ladder.plan(model, opt, X, Y, step, text=True)
        evidence["hlo_embedding_scatter"] = embedding_scatters(
            text, tuple(model.token_emb.embedding.shape))
    ladder.plans[name] = temp
    return flops, temp


def _vs(ladder: Ladder, temp, other: str) -> dict:
    """Planned temp bytes against another rung's (when that rung ran)."""
    ref = ladder.plans.get(other)
    if temp is None or not ref:
        return {}
    return {f"temp_bytes_{other}": ref, f"temp_ratio_vs_{other}": temp / ref}


# -- R0 -------------------------------------------------------------------------------------
def r0_unjitted(ladder: Ladder):
    """The un-jitted step, measured briefly: what forgetting ``jit`` costs (not the baseline)."""
    model, opt = ladder.build(jnp.float32)
    step = make_train_step(jit=False)
    t = ladder.time(lambda X, Y: step(model, opt, X, Y), ladder.stream(ladder.config.batch_size),
                    eager=True)
    return ladder.record(
        "R0", "un-jitted", t, model=model, dtype=jnp.float32,
        notes=["every operation dispatched one at a time from Python (nnx.value_and_grad + "
               "optax, no jit); ratios in this ladder are to R1, the jitted step",
               "peak_mem_bytes not applicable: an un-jitted step has no single compiled plan",
               f"measured briefly: 1 warm-up step, {EAGER_WINDOWS} windows of "
               f"{ladder.config.eager_timed} steps"])


# -- R1 -------------------------------------------------------------------------------------
def r1_jit(ladder: Ladder):
    """The whole step (forward, gradients, AdamW) under one ``nnx.jit``."""
    model, opt = ladder.model("fp32")
    stream = ladder.stream(ladder.config.batch_size)
    X, Y = first_batch(stream)
    diff = check_jit_parity(model, X)                     # same answer first ...
    c0, t0 = compile_count(), time.perf_counter()
    jax.block_until_ready(ladder.step(model, opt, X, Y))   # ... then the first (compiling) call
    compile_s, compiles = time.perf_counter() - t0, compile_count() - c0
    t = ladder.time(lambda X, Y: ladder.step(model, opt, X, Y), stream)
    flops, temp = _with_plan(ladder, "R1", model, opt, X, Y)
    extra = {"first_call_s": compile_s, "first_call_compilations": compiles,
             "parity_rel_diff": diff, "traced_flops_per_step": flops,
             "model_flops_per_step": model.flops_per_token(X.shape[1]) * X.size,
             "planned_temp_bytes": temp}
    if flops:
        extra["traced_tflops"] = flops / t.step_time_s / 1e12
    r = ladder.record("R1", "jit (whole step)", t, model=model, dtype=jnp.float32, mem=temp,
                      notes=[f"parity gate: jitted logits == op-by-op logits (max|diff| / max|logits| {diff:.2g})",
                             "traced_tflops: the matmul FLOPs of the traced step (jaxpr "
                             "dot_general count) per measured step time"], extra=extra)
    try:   # R0 ran before the baseline existed: give it its ratio now
        r0 = ladder.result.rung("R0")
        if r0.ratio_base is None and r0.tokens_per_s:
            r0.ratio_base = r0.tokens_per_s / r.tokens_per_s
    except KeyError:
        pass
    return r


# -- R2a ------------------------------------------------------------------------------------
def r2a_naive_cast(ladder: Ladder):
    """Cast every floating array to bf16 and run: the modules cast them straight back."""
    model, opt = ladder.model("fp32")
    stream = ladder.stream(ladder.config.batch_size)
    X, Y = first_batch(stream)
    got = receipt(naive_bf16(model), X)
    if got != "float32":
        raise AssertionError(f"the naive cast computed in {got}, not float32: the R2a lesson "
                             "(modules remember their fp32 compute dtype) no longer holds here")
    dots = matmul_dtypes(naive_bf16(model), X)
    step = make_train_step(view=naive_bf16)
    t = ladder.time(lambda X, Y: step(model, opt, X, Y), stream)
    _, temp = _with_plan(ladder, "R2a", model, opt, X, Y, step)
    return ladder.record(
        "R2a", "naive bf16 cast", t, model=model, dtype=jnp.float32, kind="control", mem=temp,
        notes=[f"receipt: first activation is {got} -- the bf16 arrays were promoted back to "
               "fp32 by modules built with dtype=float32; this rung silently computed in fp32",
               f"matmul operand dtypes in the forward: {dots}"],
        extra={"receipt": got, "matmul_dtypes": dots, **_vs(ladder, temp, "R1")})


# -- R2 -------------------------------------------------------------------------------------
def r2_bf16(ladder: Ladder):
    """bf16 threaded for real: compute dtype bf16 in every module, fp32 masters, fp32 loss."""
    model, opt = ladder.model("bf16")
    stream = ladder.stream(ladder.config.batch_size)
    X, Y = first_batch(stream)
    got, dots = receipt(model, X), matmul_dtypes(model, X)
    if got != "bfloat16" or set(dots) != {"bfloat16"}:
        raise AssertionError(f"bf16 rung is not computing in bf16: first activation {got}, "
                             f"matmul operands {dots}")
    t = ladder.time(lambda X, Y: ladder.step(model, opt, X, Y), stream)
    assert_fp32_masters(model, opt)
    _, temp = _with_plan(ladder, "R2", model, opt, X, Y)
    return ladder.record(
        "R2", "+bf16 (threaded)", t, model=model, dtype=jnp.bfloat16, mem=temp,
        notes=[f"receipt: first activation {got}; matmul operands {dots}",
               "parameters and AdamW moments asserted fp32 after the timed steps; "
               "loss computed in fp32"],
        extra={"receipt": got, "matmul_dtypes": dots, **_vs(ladder, temp, "R1")})


# -- R3c / R3 -------------------------------------------------------------------------------
def r3c_fp32_control(ladder: Ladder):
    """Control: the big batch without bf16."""
    model, opt = ladder.build(jnp.float32)
    stream = ladder.stream(ladder.config.big_batch)
    X, Y = first_batch(stream)
    t = ladder.time(lambda X, Y: ladder.step(model, opt, X, Y), stream)
    evidence = {}
    flops, temp = _with_plan(ladder, "R3c", model, opt, X, Y, evidence=evidence)
    return ladder.record(
        "R3c", f"fp32 @ batch {ladder.config.big_batch}", t, model=model, dtype=jnp.float32, kind="control", mem=temp,
        notes=["control: what the big batch does without bf16"],
        extra={"traced_flops_per_step": flops, **evidence, **_vs(ladder, temp, "R1")})


def r3_batch(ladder: Ladder):
    """bf16 at the big batch: the fixed per-step cost is divided over more tokens."""
    model, opt = ladder.model("bf16")
    stream = ladder.stream(ladder.config.big_batch)
    X, Y = first_batch(stream)
    t = ladder.time(lambda X, Y: ladder.step(model, opt, X, Y), stream)
    evidence = {}
    flops, temp = _with_plan(ladder, "R3", model, opt, X, Y, evidence=evidence)
    extra = {"traced_flops_per_step": flops, **evidence, **_vs(ladder, temp, "R3c")}
    if flops:
        extra["traced_tflops"] = flops / t.step_time_s / 1e12
    notes = []
    try:
        ctl = ladder.result.rung("R3c")
        extra["ratio_vs_R3c"] = t.tokens_per_s / ctl.tokens_per_s
        notes.append(f"bf16 pays {extra['ratio_vs_R3c']:.2f}x over the fp32 control at this batch")
    except KeyError:
        notes.append("R3c (the fp32 control) did not run: no bf16-vs-fp32 comparison at this batch")
    return ladder.record("R3", f"+batch {ladder.config.big_batch}", t, model=model,
                         dtype=jnp.bfloat16, mem=temp, notes=notes, extra=extra)


# -- R4 -------------------------------------------------------------------------------------
def r4_checkpoint(ladder: Ladder):
    """Per-block activation checkpointing on top of R3. Expected to cost time."""
    model, _ = ladder.model("bf16")
    stream = ladder.stream(ladder.config.big_batch)
    X, Y = first_batch(stream)
    mirror = with_checkpointing(model)          # shares R3's parameters
    diff = check_mirror(model, mirror, X)
    opt = make_optimizer(mirror, ladder.config.lr)
    t = ladder.time(lambda X, Y: ladder.step(mirror, opt, X, Y), stream)
    flops, temp = _with_plan(ladder, "R4", mirror, opt, X, Y)
    extra = {"mirror_rel_diff": diff, "traced_flops_per_step": flops, **_vs(ladder, temp, "R3")}
    try:
        r3_flops = ladder.result.rung("R3").extra.get("traced_flops_per_step")
        if flops and r3_flops:
            extra["flops_ratio_vs_R3"] = flops / r3_flops     # > 1: the recomputation
    except KeyError:
        pass
    return ladder.record(
        "R4", "+checkpoint", t, model=mirror, dtype=jnp.bfloat16, mem=temp,
        notes=[f"mirror gate: checkpointed logits == R3 model's (max|diff| / max|logits| {diff:.2g})",
               "every block under nnx.remat: activations recomputed in the backward pass; "
               "model FLOPs (and so TFLOP/s, MFU) do not count the recomputation; "
               "flops_ratio_vs_R3 shows it in the traced step's matmul count"],
        extra=extra)


# -- R5 -------------------------------------------------------------------------------------
def r5_data_parallel(ladder: Ladder, k: int | None = None, fsdp: bool = False,
                     bandwidth: float = DP_BANDWIDTH):
    """k-way data parallelism by sharding, fast config (bf16, big batch per device).

    ``k`` defaults to every visible device. The cost-model floor is computed, printed and
    stored before anything is measured.
    """
    n = jax.device_count()
    k = n if k is None else k
    mesh = make_data_mesh(k)                     # k > devices -> ValueError
    label = f"{'FSDP' if fsdp else 'data parallel'} x{k}"
    name = "R5" if not fsdp else "R5f"
    if k == 1:
        return ladder.skip(name, label, "one device visible: data parallelism needs at least two "
                           "(nothing measured; see the cost model in the notebook)")
    B, T = ladder.config.big_batch, ladder.config.num_steps
    try:
        single = ladder.result.rung("R3").tokens_per_s
        source = "R3"
    except KeyError:
        m1, o1 = ladder.build(jnp.bfloat16)
        single = ladder.time(lambda X, Y: ladder.step(m1, o1, X, Y), ladder.stream(B)).tokens_per_s
        source = "measured here (R3 did not run)"
    model, opt = ladder.build(jnp.bfloat16)
    cost = dp_floor(k=k, num_params=model.num_params(), tokens_per_step=B * T,
                    t_compute=B * T / single, bandwidth=bandwidth)
    cost["single_device_source"] = source
    print(f"R5 cost model (k={k}): t_compute {1e3 * cost['t_compute_s']:.2f} ms/step, "
          f"t_comm {1e3 * cost['t_comm_s']:.2f} ms/step at {bandwidth / 1e9:.0f} GB/s -> "
          f"floor {cost['floor_tokens_per_s']:,.0f} tokens/s, linear ceiling "
          f"{cost['ceiling_tokens_per_s']:,.0f}", flush=True)
    place_state(mesh, model, opt, fsdp=fsdp)
    stream = batches(ladder.data, k * B, seed=ladder.config.seed + 100, sharding=batch_sharding(mesh))
    t = ladder.time(lambda X, Y: ladder.step(model, opt, X, Y), stream)
    notes = [f"{k} devices, per-device batch {B} (global {k * B}); state "
             f"{'sharded (FSDP)' if fsdp else 'replicated'}, batch sharded on 'data'; the jitted "
             "step is unchanged",
             f"cost model before measuring: floor {cost['floor_tokens_per_s']:,.0f} tokens/s "
             f"(no overlap, allreduce at {bandwidth / 1e9:.0f} GB/s), linear ceiling "
             f"{cost['ceiling_tokens_per_s']:,.0f}"]
    if not ladder.gpu:
        notes.append("CPU host devices: the numbers exercise the code path, not an interconnect")
    extra = {"cost_model": cost, "efficiency_vs_linear": t.tokens_per_s / cost["ceiling_tokens_per_s"]}
    return ladder.record(name, label, t, model=model, dtype=jnp.bfloat16, kind="multi-gpu",
                         notes=notes, extra=extra)


def r5_fsdp(ladder: Ladder, k: int | None = None, bandwidth: float = DP_BANDWIDTH):
    """The FSDP variant (parameters and optimizer state sharded too), recorded as ``R5f``."""
    return r5_data_parallel(ladder, k=k, fsdp=True, bandwidth=bandwidth)


# -- learning check, registry, driver -------------------------------------------------------
LEARN_NOTE = "learning check: trained "


def learning_check(ladder: Ladder, steps: int | None = None, window: int = 20) -> LearningCheck:
    """Train the fastest configuration so far from a fresh init (R3's until a B rung beats it).

    Losses stay on the device until the end (no host read per step). Raises if the
    smoothed loss does not fall. The result's notes say which configuration was trained.
    """
    steps = ladder.config.learn_steps if steps is None else steps
    name, recipe = fastest(ladder)
    runner = Runner(ladder, recipe)
    stream = batches(ladder.data, recipe.batch_size, seed=ladder.config.seed + 1000)
    losses = []
    for _ in range(steps):
        X, Y = next(stream)
        losses.append(runner.step(X, Y))
    losses = jax.device_get(jnp.stack(losses))
    runner.commit()
    return ladder.result.set_learning(
        smoothed_check(losses, window=window),
        f"{LEARN_NOTE}{name}'s configuration ({recipe}), {steps} steps from a fresh init")


RUNGS = OrderedDict([
    ("R0", r0_unjitted),
    ("R1", r1_jit),
    ("R2a", r2a_naive_cast),
    ("R2", r2_bf16),
    ("R3c", r3c_fp32_control),
    ("R3", r3_batch),
    ("R4", r4_checkpoint),
    ("R5", r5_data_parallel),
    *BEYOND.items(),
])


def check_rung_names(rungs) -> list[str]:
    names = list(RUNGS) if rungs is None else list(rungs)
    unknown = [n for n in names if n not in RUNGS]
    if unknown:
        raise ValueError(f"unknown rung(s) {', '.join(map(repr, unknown))}; "
                         f"valid choices: {', '.join(RUNGS)}")
    return names


def run_ladder(config, rungs=None, learn: bool = True, progress=None, command: str = "",
               ladder: Ladder | None = None, kernels: bool = True):
    """Run ``rungs`` (default: all, in order), then the learning check; returns the LadderResult.

    When a B rung ran and ``kernels`` is true, the fastest configuration's kernel breakdown
    (``kernel_report``) is stored in its rung's ``extra['kernels']`` before the learning check.
    """
    names = check_rung_names(rungs)
    ladder = Ladder(config, command=command) if ladder is None else ladder
    drive([(name, partial(RUNGS[name], ladder)) for name in names], progress)
    if kernels and any(n in BEYOND for n in names):
        kernel_report(ladder)
    if learn:
        drive([("learning", partial(learning_check, ladder))], progress)
    return ladder.result
