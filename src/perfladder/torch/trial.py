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

Also here: the loss gate and the one-hot embedding's own check.
"""
from __future__ import annotations

from typing import Callable

import torch

from perfladder.ladder.rung import Evidence, Given
from perfladder.measure.counts import check_tokens
from perfladder.measure.evidence import Compile, Gate, Timing
from perfladder.measure.gates import (
    EMBED_ATOL,
    EMBED_GRAD_RTOL,
    GATE_STEPS,
    LOOKUP_TOL,
    LOSS_ATOL,
)
from perfladder.measure.timing import Stopwatch
from perfladder.torch.gates import (
    GateError,
    MirrorError,
    model_gate,
    optimizer_gate,
    true_fp32,
)
from perfladder.torch.program import arithmetic
from perfladder.torch.recipe import Recipe
from perfladder.torch.stream import batches
from perfladder.torch.timer import compile_count

__all__ = ["trial", "loss_gate", "embed_gate", "LOSS_ATOL", "EMBED_ATOL", "EMBED_GRAD_RTOL"]
GATE_SEED_OFFSET = 10_000  # the gate's batches come from their own shuffle seed
GATE_ROWS = 8              # rows of each fixed batch the optimizer gate's reference runs on


class LossGateError(GateError):
    """A configuration's first losses differ from the reference recipe's on the same batches."""


def trial(lab, given: Given, *, recipe: Recipe | None = None, optimizer_gate_: bool = True,
          loss_gate_: bool = False, checks: tuple[Callable, ...] = (), profile: bool = True,
          details: dict | None = None, notes=()) -> Evidence:
    """Gate, time and profile ``recipe`` (default: the one the rung was given); see the module
    docstring. ``checks``: ``check(lab, step, recipe) -> Gate`` run with the gates, on the
    fresh step."""
    recipe = given.recipe if recipe is None else recipe
    B, watch = recipe.batch_size, Stopwatch()
    if loss_gate_:
        with watch("reference"):
            reference_losses(lab, B)       # its memory is gone before the candidate is built
    c0 = compile_count()
    with watch("build"):
        step = lab.build_step(recipe)
    with watch("gates"):
        gates = model_gates(lab, step, recipe, optimizer=optimizer_gate_)
        gates += [check(lab, step, recipe) for check in checks]
        if loss_gate_:
            gates.append(loss_gate(lab, step, B))
    with watch("first call"):
        if "optimizer" not in step.first_call_s:       # nothing above took a whole step
            step(*next(lab.stream(B)))
    compiled = Compile(first_call_s=sum(step.first_call_s.values()),
                       compilations=compile_count() - c0)
    with watch("receipt"):
        X, Y = gate_batches(lab, B)[0]
        arith = arithmetic(step, X[:GATE_ROWS], Y[:GATE_ROWS])   # dtypes do not depend on B
        receipt = lab.receipt(step, recipe, arith)
    with watch("time"):
        t, again, mem = lab.measure(step, B)
    check_tokens(t, f"{given.rung.name}'s timed step")
    lab.receipt(step, recipe)                       # the timed calls computed the same way
    with watch("profile"):
        prof = lab.profile(step, B) if profile else None
    return Evidence(timing=Timing.of(t, again), recipe=recipe, gates=gates, receipt=receipt,
                    compile=compiled, memory=mem, profile=prof,
                    details={**(details or {}), "arithmetic": arith, "seconds": watch.seconds},
                    notes=list(notes))


# -- the gates run before timing -------------------------------------------------------------------
def gate_batches(lab, batch_size: int) -> list:
    """``GATE_STEPS`` fixed (X, Y) batches of ``batch_size``, the same for every configuration."""
    cache = lab.memo.setdefault("gate_batches", {})
    if batch_size not in cache:
        stream = batches(lab.data, batch_size, lab.device, seed=lab.config.seed + GATE_SEED_OFFSET)
        cache[batch_size] = [next(stream) for _ in range(GATE_STEPS)]
    return cache[batch_size]


def model_gates(lab, step, recipe: Recipe, optimizer: bool = True) -> list[Gate]:
    """The first line: ``step`` computes the plain model's logits, loss and every parameter's
    gradient (``perfladder.torch.gates.model_gate``) against the eager fp32 model of the same
    weights, on a fixed batch of its own shape; with ``optimizer`` (every step form: fused,
    compiled or default AdamW, CUDA graphs), its optimizer step moves every parameter as the
    default AdamW does on the same gradients, over ``GATE_STEPS`` steps (one would hide the
    betas behind Adam's bias correction) on ``GATE_ROWS`` rows. Raises a ``GateError``;
    returns the evidence."""
    plain = Recipe(batch_size=recipe.batch_size)
    if recipe == plain:
        return []
    fixed = gate_batches(lab, recipe.batch_size)
    out = [model_gate(lab.build_step(plain, plain_code=True), step, fixed[:1]).evidence()]
    if optimizer:
        rows = [(X[:GATE_ROWS], Y[:GATE_ROWS]) for X, Y in fixed]
        out.append(optimizer_gate(lab.build_step(plain, plain_code=True), step, rows).evidence())
    lab.free(graphs=False)
    return out


def gate_losses(step, fixed) -> list[float]:
    """Losses of ``step`` over ``fixed`` (read once at the end)."""
    return torch.stack([step(X, Y) for X, Y in fixed]).float().cpu().tolist()


def reference_losses(lab, batch_size: int) -> list[float]:
    """The reference recipe (eager, bf16 autocast, the library's own code) from the initial
    weights over ``gate_batches``."""
    cache = lab.memo.setdefault("reference_losses", {})
    if batch_size not in cache:
        step = lab.build_step(Recipe(batch_size=batch_size, bf16=True), plain_code=True)
        cache[batch_size] = gate_losses(step, gate_batches(lab, batch_size))
        del step
        lab.free(graphs=False)
    return cache[batch_size]


def loss_gate(lab, step, batch_size: int, atol: float = LOSS_ATOL) -> Gate:
    """``step``'s losses over the fixed batches against the eager bf16 reference's.
    ``LossGateError`` past ``atol``."""
    ref = reference_losses(lab, batch_size)
    losses = gate_losses(step, gate_batches(lab, batch_size))
    diff = max(abs(a - b) for a, b in zip(losses, ref))
    if not diff <= atol:                                   # NaN fails too
        raise LossGateError(
            f"losses over the first {GATE_STEPS} steps {[round(x, 5) for x in losses]} differ "
            f"from the eager bf16 reference's {[round(x, 5) for x in ref]} by {diff:.3g} > "
            f"atol={atol}: not timing a configuration that trains a different model")
    return Gate(name="loss over steps", passed=True, values={"max_abs_diff": diff},
                tolerances={"atol": atol}, reference="the reference recipe, eager bf16",
                detail={"steps": GATE_STEPS, "losses": losses, "reference_losses": ref})


def onehot_check(lab, step, recipe: Recipe) -> Gate:
    """B4's own gate (``embed_gate``) on rows of the gate's fixed batch, and in ``step``'s path."""
    return embed_gate(lab, gate_batches(lab, recipe.batch_size)[0][0][: lab.config.batch_size],
                      step=step)


def embed_gate(lab, X, atol: float = EMBED_ATOL, grad_rtol: float = EMBED_GRAD_RTOL,
               step=None) -> Gate:
    """One-hot and gather embeddings compute the same model: fp32 logits of two eager models
    with the same weights agree to ``atol``, the shared table's gradients to ``grad_rtol``;
    with ``step`` (the rung's, one-hot), also in the precision and code path the rung times
    (``lookup_in_step``)."""
    gather = lab.make_model(Recipe(batch_size=X.shape[0]))
    onehot = lab.make_model(Recipe(batch_size=X.shape[0], embed="onehot"))
    onehot.load_state_dict(gather.state_dict())
    out = {}
    with true_fp32(), torch.autocast(lab.device.type, enabled=False):
        for name, m in (("gather", gather), ("onehot", onehot)):
            logits = m(X)                                                   # (B, T, V)
            logits.float().logsumexp(-1).mean().backward()
            out[name] = (logits.detach(), m.token_emb.weight.grad.detach())
    (lg, gg), (lo, go) = out["gather"], out["onehot"]
    diff = (lg - lo).abs().max().item()
    gdiff = (gg - go).abs().max().item() / max(gg.abs().max().item(), 1e-30)
    if lg.dtype != torch.float32 or not diff <= atol:
        raise MirrorError(f"one-hot embedding logits differ from the gather's: max |diff| "
                          f"{diff:.3g} > atol={atol} (dtype {lg.dtype})")
    if not gdiff <= grad_rtol:
        raise MirrorError(f"one-hot embedding's table gradient differs from the gather's: "
                          f"max |diff| / max |grad| = {gdiff:.3g} > {grad_rtol}")
    values = {"logits_max_abs_diff": diff, "grad_max_rel_diff": gdiff}
    tols = {"atol": atol, "grad_rtol": grad_rtol}
    if step is not None:
        in_step, tol = lookup_in_step(step, X)
        values.update(in_step)
        tols.update({k: tol for k in in_step})
    return Gate(name="one-hot vs gather embedding", passed=True, values=values, tolerances=tols,
                reference="gather embedding, true fp32; and the gathered rows in the rung's path")


def lookup_in_step(step, X) -> tuple[dict, float]:
    """The one-hot rows and their table gradient as the rung's step computes them -- its own
    forward (through its ``autocast_bf16``, eagerly: ``TrainStep.uncompiled``) under the lab's
    matmul precision -- against the gathered fp32 rows and their scatter-add, ``||diff|| /
    ||ref||`` within ``LOOKUP_TOL`` of the precision the fp32 lookup matmul runs in. The rows
    must come out fp32 (the lookup is fp32 by design). ``MirrorError`` otherwise."""
    model = getattr(step.model, "module", step.model)
    real, seen = model.embed_tokens, {}

    def capture(ids):
        seen["rows"] = real(ids)
        return seen["rows"]
    model.embed_tokens = capture                       # what the step's forward calls
    try:
        with step.uncompiled():
            step.logits(X)                             # (B, T, V); the rows keep their graph
    finally:
        del model.embed_tokens
    rows = seen["rows"]                                # (B, T, D)
    W = model.token_emb.weight
    G = torch.randn(rows.shape, generator=torch.Generator().manual_seed(0)).to(rows.device)
    got_grad, = torch.autograd.grad((rows.float() * G).sum(), W)
    want = W.detach()[X]                                                  # (B, T, D) fp32
    want_grad = torch.zeros_like(W).index_add_(0, X.flatten(), G.flatten(0, 1))
    fp32 = step.device_type != "cuda" or torch.get_float32_matmul_precision() == "highest"
    tol = LOOKUP_TOL["fp32" if fp32 else "tf32"]
    values = {"rows_rel_diff_in_step": _rel(rows.detach(), want),
              "grad_rel_diff_in_step": _rel(got_grad, want_grad)}
    if rows.dtype != torch.float32 or not max(values.values()) <= tol:
        raise MirrorError(f"inside the rung's step ({step!r}) the one-hot rows come out "
                          f"{rows.dtype} and differ from the gathered fp32 rows by {values} "
                          f"(allowed {tol:.3g}): the lookup is not the gather's in the precision "
                          "that is timed")
    return values, tol


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.double()
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-300)).item()
