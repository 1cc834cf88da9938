"""Gates a broken rung cannot pass (JAX): the model gate, the optimizer gate, the receipt check.

* ``model_gate(reference, candidate, batches)`` -- logits, loss, every parameter's gradient by
  name and every matrix gradient's scale, candidate against reference (no optimizer step), at
  probe weights where every part of the model matters (``perfladder.measure.gates``); the
  candidate's loss and gradients can be its own training step's (``step_fn``). Both models are
  cloned first: the models the rung goes on to time are not touched.
* ``optimizer_gate(model, optimizer, batches, lr=..., step=...)`` -- a few steps of the
  candidate's own step and optimizer against the reference AdamW (``make_optimizer``), on
  clones: every parameter must move as the reference moves it.
* ``check_receipt(...)`` -- the dtype receipt the compiled step recorded while it was traced.

Each rung's own parity checks: ``perfladder.jax.checks``. The metric, the tolerances and
``GateResult`` are framework-free: ``perfladder.measure.gates``.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from perfladder.jax.gate_programs import (
    _grads,
    _grads_jit,
    compile_gradients,
    compile_reference_step,
    gradients,
    named,
    reference_step,
)
from perfladder.jax.step import (
    SplitStep,
    make_optimizer,
    make_split_step,
    make_train_step,
    step_receipt,
    train_step,
)
from perfladder.measure.gates import (
    METRIC,
    OPTIMIZER_TOL,
    REPRO_FACTOR,
    GateResult,
    ModelGateError,
    OptimizerGateError,
    fail_if,
    probe_qk_std,
    rel_diff,
    scale_error,
    tolerances,
)
from perfladder.measure.gates import check_receipt as _check_receipt_dict


# -- what a model computes -------------------------------------------------------------------
def precision_of(model) -> str:
    """'bf16' for a bf16 compute dtype; an fp32 model is 'tf32' on a GPU (XLA's default
    precision lets fp32 matmuls run as TF32 there) and 'fp32' on CPU."""
    if jnp.dtype(model.dtype) == jnp.bfloat16:
        return "bf16"
    return "tf32" if any(d.platform == "gpu" for d in jax.devices()) else "fp32"


def describe(model, view=None) -> str:
    """A short description of a GPT's configuration."""
    return (f"GPT(dtype={jnp.dtype(model.dtype).name}, embed={model.embed_impl!r}, "
            f"embed_fp32={model.embed_fp32}, attn_impl={model.attn_impl!r}, "
            f"checkpoint={model.checkpoint}{', view=' + view.__name__ if view else ''})")


# -- probe weights -------------------------------------------------------------------------------
def clone(model):
    """An independent copy of ``model`` (or of a tuple of graph nodes): same structure, copied arrays."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jnp.copy, state))


def set_probe_weights(model) -> float:
    """Scale ``model``'s query and key projections (in place) so that attention scores have the
    std ``perfladder.measure.gates.PROBE_SCORE_STD``; returns the weight std they now have."""
    D = model.config.num_hiddens
    target = probe_qk_std(D)
    for blk in model.blks:
        W = blk.attn.W_qkv.kernel                                           # (D, 3D): q | k | v
        qk = W[...][:, :2 * D]
        W[...] = W[...].at[:, :2 * D].set(qk * (target / jnp.std(qk)))
    return target


def _same_start(reference, candidate) -> None:
    ref = named(nnx.state(reference, nnx.Param))
    cand = named(nnx.state(candidate, nnx.Param))
    if set(ref) != set(cand):
        raise ModelGateError(f"the candidate's parameters {sorted(set(cand) ^ set(ref))} do not match "
                             "the reference's by name", gate="model gate")
    for k in ref:
        if ref[k].shape != cand[k].shape or not bool(jnp.array_equal(ref[k], cand[k])):
            raise ModelGateError(f"the candidate was not built from the reference's initial weights: "
                                 f"{k} differs", gate="model gate")


def true_fp32(on: bool):
    """Full-precision fp32 matmuls (no TF32) while ``on``: a gate's fp32 side."""
    return jax.default_matmul_precision("highest") if on else contextlib.nullcontext()


# -- the model gate -------------------------------------------------------------------------------
def model_gate(reference, candidate, batches, *, view: Callable | None = None,
               reference_chunks: int = 1, reference_jit: bool = False, candidate_jit: bool = True,
               step_fn: Callable | None = None, name: str = "model gate",
               xla_options=()) -> GateResult:
    """The candidate computes the reference's model: forward and backward, parameter by parameter.

    ``reference``: the plain fp32 GPT (``Ladder.make_model()``); ``candidate``: the rung's model,
    built from the same initial weights (any dtype, embedding, attention, checkpointing);
    ``view`` maps the candidate to the module its step runs (R2a's naive cast); ``batches``:
    a few fixed ``(X, Y)`` at the candidate's batch size. On clones of both, at probe weights,
    it compares the logits and every parameter's gradient (``||diff|| / ||ref||``) against
    ``perfladder.measure.gates.tolerances``; an fp32 reference runs at full fp32 matmul precision.
    ``reference_chunks`` runs the reference on that many equal slices of each batch and
    averages (a batch rung against the reference at the smaller batch). The reference runs op
    by op (the plain eager model) unless ``reference_jit``; the candidate is compiled unless
    ``candidate_jit`` is False. ``step_fn``: the candidate's loss and gradients are those of
    that training step function (the lab's ``train_step``: ``step_gradients``), not the gate's
    own loss; ``xla_options``: XLA debug options the candidate's program compiles with (its
    rung's, ``perfladder.jax.compile_options``). Besides the logits,
    the loss and every gradient, every matrix gradient's scale is compared (``scale/<name>``,
    ``perfladder.measure.gates.SCALE_TOL``: Adam would hide a scaled gradient from the loss gate).
    Raises ``ModelGateError`` (the worst parameter and its numbers); returns the ``GateResult``.
    """
    _same_start(reference, candidate)
    batches = list(batches)
    if not batches:
        raise ValueError("model_gate needs at least one (X, Y) batch")
    ref, cand = clone(reference), clone(candidate)
    scale = set_probe_weights(ref)
    set_probe_weights(cand)
    p_ref, p_cand = precision_of(reference), precision_of(candidate)
    if p_ref == "tf32":
        p_ref = "fp32"                      # run below at full precision
    tol = tolerances(p_ref, p_cand)
    measured: dict = {}
    for X, Y in batches:
        with true_fp32(p_ref == "fp32"):
            ref_loss, ref_logits, ref_grads = gradients(ref, X, Y, chunks=reference_chunks,
                                                        jit=reference_jit, with_loss=True)
        cand_loss, cand_logits, cand_grads = gradients(cand, X, Y, view, jit=candidate_jit,
                                                       step_fn=step_fn, with_loss=True,
                                                       xla_options=xla_options)
        _worse(measured, "logits", _rel(cand_logits, ref_logits))
        _worse(measured, "loss", _rel([cand_loss], [ref_loss]))
        for k, g in ref_grads.items():
            _worse(measured, f"grad/{k}", _rel(cand_grads.get(k), g))
            if g.ndim >= 2:
                _worse(measured, f"scale/{k}", _scale(cand_grads.get(k), g))
    tolerance = {k: tol[_KIND[k.split("/")[0]]] for k in measured}
    result = GateResult.judge(
        name, reference=describe(reference) + (" under jit" if reference_jit else " op by op"),
        candidate=describe(candidate, view) + (" under jit" if candidate_jit else " op by op")
        + ("" if step_fn is None else f", loss and gradients of its {_step_name(step_fn)}"),
        precision={"reference": p_ref, "candidate": p_cand}, measured=measured, tolerance=tolerance,
        details={"metric": METRIC, "batches": len(batches), "batch_shape": list(batches[0][0].shape),
                 "reference_chunks": reference_chunks, "reference_jit": reference_jit,
                 "probe_qk_std": scale, **({"xla_options": dict(xla_options)} if xla_options else {})})
    return fail_if(result, ModelGateError)


def model_gate_programs(reference, candidate, X, Y, *, view: Callable | None = None,
                        step_fn: Callable | None = None, xla_options=()) -> list[Callable[[], None]]:
    """Two jobs that compile, without running anything, the programs ``model_gate(reference,
    candidate, [(X, Y)], reference_jit=True, view=view, step_fn=step_fn)`` runs: the
    reference's gradients at full fp32 precision, and the candidate's (its step's own). A
    program depends on the model's structure and dtypes, not its values, so the probe clones
    the gate makes find them compiled."""
    def the_reference():
        with true_fp32(precision_of(reference) in ("fp32", "tf32")):
            compile_gradients(reference, X, Y)

    def the_candidate():
        compile_gradients(candidate, X, Y, view, step_fn, xla_options)
    return [the_reference, the_candidate]


def _rel(got, want) -> float:
    if got is None or np.shape(got) != np.shape(want):
        return float("inf")
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    return rel_diff(float(np.linalg.norm(got - want)), float(np.linalg.norm(want)))


def _scale(got, want) -> float:
    if got is None or np.shape(got) != np.shape(want):
        return float("inf")
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return scale_error(float(np.vdot(got, want)), float(np.vdot(want, want)))


_KIND = {"logits": "forward", "loss": "forward", "grad": "backward", "scale": "scale"}


def _worse(measured: dict, key: str, value: float) -> None:
    measured[key] = max(measured.get(key, 0.0), value)


# -- the optimizer gate ---------------------------------------------------------------------------
_reference_step = make_train_step()


def optimizer_gate(model, optimizer, batches, *, lr: float, step: Callable | str | None = None,
                   jit: bool = True, same_gradients: bool = True, memo: dict | None = None,
                   name: str = "optimizer gate") -> GateResult:
    """The candidate's optimizer (and step) moves every parameter as the reference AdamW does.

    ``model`` / ``optimizer``: the candidate's, before its first step (the gate runs on clones).
    The reference is ``make_optimizer(lr)`` on a clone of the same model.

    * ``update/<parameter>``: both optimizers apply the reference's gradients of each batch
      (``Optimizer.update``): a parameter group left out, another learning rate, cannot pass.
    * ``step/<parameter>`` (when ``step`` is given): the candidate's step function --
      ``step(model, optimizer, X, Y)``, 'nnx.jit', 'split' (``make_split_step``), or a factory
      marked ``step_form = True`` (``step(model, optimizer)`` -> ``run(X, Y)``, committed
      after: a rung's ``TrainStep.of``) -- against the reference step (``gate_programs.reference_step``): a step that
      drops its optimizer state or writes back stale parameters cannot pass.

    ``same_gradients=False`` leaves ``update/`` out; ``memo`` (a dict the caller keeps for one
    model and one set of batches) runs the reference's steps once for several candidates.
    ``jit=False``: everything op by op (``jax.disable_jit``): the same arithmetic both sides,
    no compile; the ladder runs it on an fp32 model (in bf16, Adam turns the rounding noise of
    a gradient that is zero by symmetry into full-size steps of random sign). Each parameter's
    displacement after ``len(batches)`` steps (several: after one, Adam's bias correction hides
    its betas) must match within ``OPTIMIZER_TOL`` (``||diff|| / ||ref||``), at full fp32 matmul
    precision both sides. The reference's steps run twice: where they do not reproduce (on a
    GPU), a ``step/`` parameter is allowed ``REPRO_FACTOR`` times its own reference-vs-reference
    difference if larger (``details['reproduction']``). ``OptimizerGateError`` otherwise.
    """
    batches = list(batches)
    if not batches:
        raise ValueError("optimizer_gate needs at least one (X, Y) batch")
    count = getattr(optimizer, "step", None)
    if count is not None and int(np.asarray(count[...])) != 0:
        raise ValueError(f"optimizer_gate needs the candidate's optimizer before its first step; "
                         f"it has taken {int(np.asarray(count[...]))}")
    start = {k: np.asarray(v) for k, v in named(nnx.state(model, nnx.Param)).items()}
    if step is None and not same_gradients:
        raise ValueError("optimizer_gate with same_gradients=False needs a step to compare")
    measured, floor = {}, {}
    with true_fp32(jax.default_backend() != "cpu"):          # TF32 exists only on a GPU
        if same_gradients:
            measured = _displacements("update", start,
                                      *_same_gradients(model, optimizer, batches, lr, jit))
        if step is not None:
            ref, again, cand = _own_steps(model, optimizer, batches, lr, step, jit, memo)
            measured.update(_displacements("step", start, ref, cand))
            floor = {k: v for k, v in _displacements("step", start, ref, again).items() if v > 0}
    tolerance = {k: max(OPTIMIZER_TOL, REPRO_FACTOR * floor.get(k, 0.0)) for k in measured}
    result = GateResult.judge(
        name, reference=f"AdamW(lr={lr:g}) from make_optimizer on {describe(model)}"
                        + ("" if jit else ", op by op"),
        candidate=f"its own optimizer{'' if step is None else ' and ' + _step_name(step) + ' step'} "
                  f"on {describe(model)}",
        precision={"reference": "fp32", "candidate": "fp32"}, measured=measured,
        tolerance=tolerance,
        details={"metric": METRIC + " of each parameter's displacement", "steps": len(batches),
                 "batch_shape": list(batches[0][0].shape),
                 "reproduction": {"factor": REPRO_FACTOR, "reference_vs_itself": floor}})
    return fail_if(result, OptimizerGateError)


def compile_optimizer_gate_reference(model, X, Y, lr: float) -> None:
    """Compile, without running, the reference step ``optimizer_gate(model, ..., jit=True)``
    runs on batches like ``(X, Y)`` (a fresh ``make_optimizer(lr)`` of ``model``)."""
    with true_fp32(jax.default_backend() != "cpu"):
        compile_reference_step(model, make_optimizer(model, lr), X, Y)


def _same_gradients(model, optimizer, batches, lr, jit: bool = True):
    """(reference params, candidate params) after both optimizers applied the reference's gradients."""
    cand_model, cand_opt = clone((model, optimizer))
    ref_model = clone(model)
    ref_opt = make_optimizer(ref_model, lr)
    for X, Y in batches:
        grads = (_grads_jit if jit else _grads)(ref_model, X, Y, None)[2]
        ref_opt.update(ref_model, grads)
        cand_opt.update(cand_model, grads)
    return ref_model, cand_model


def _own_steps(model, optimizer, batches, lr, step, jit: bool = True, memo: dict | None = None):
    """(reference params, the reference's second run, candidate params) after each ran its own
    step function (the reference's two runs kept in ``memo`` for the next candidate from the
    same model and batches)."""
    memo = {} if memo is None else memo
    cand_model, cand_opt = clone((model, optimizer))
    run = _runner(step, cand_model, cand_opt)
    with contextlib.nullcontext() if jit else jax.disable_jit():
        for key in ("reference", "reference again"):
            if key not in memo:
                ref_model = clone(model)
                ref_opt = make_optimizer(ref_model, lr)
                for X, Y in batches:
                    (reference_step if jit else train_step)(ref_model, ref_opt, X, Y)
                memo[key] = ref_model
        for X, Y in batches:
            run(X, Y)
        if hasattr(run, "commit"):
            run.commit()
    return memo["reference"], memo["reference again"], cand_model


def _displacements(prefix: str, start: dict, ref_model, cand_model) -> dict:
    ref_now = named(nnx.state(ref_model, nnx.Param))
    cand_now = named(nnx.state(cand_model, nnx.Param))
    out = {}
    for k, p0 in start.items():
        d_ref = np.asarray(ref_now[k], np.float64) - p0
        d_cand = None if k not in cand_now else np.asarray(cand_now[k], np.float64) - p0
        out[f"{prefix}/{k}"] = _rel(d_cand, d_ref)
    return out


def _runner(step, model, optimizer):
    if step == "split":
        return make_split_step(model, optimizer)
    if step == "nnx.jit":
        return lambda X, Y: _reference_step(model, optimizer, X, Y)
    if getattr(step, "step_form", False):          # a factory: step(model, optimizer) -> run
        return step(model, optimizer)
    if callable(step):
        return lambda X, Y: step(model, optimizer, X, Y)
    raise ValueError(f"step={step!r} is not valid; valid choices: a step function "
                     "step(model, optimizer, X, Y), 'nnx.jit', 'split'")


def _step_name(step) -> str:
    return step if isinstance(step, str) else getattr(step, "__name__", type(step).__name__)


# -- receipts ------------------------------------------------------------------------------------
def check_receipt(step, expect: str = "bf16", *, model=None, X=None,
                  allow_fp32_matmuls: int = 0) -> dict:
    """Assert that the compiled program the rung times computes in ``expect`` ('bf16' / 'fp32').

    ``step``: a ``SplitStep`` (the program of its last call), or a jitted step of
    ``make_train_step`` with the ``model`` it steps and a batch ``X`` of the timed shape. The
    receipt was written by that very step object while it traced the program (the returned
    loss's dtype too), so it describes what is timed, not a side path; a step that never
    compiled that program has none, and fails. ``allow_fp32_matmuls``: fp32 matmuls a bf16
    program may hold (1 for an fp32 one-hot lookup). Raises ``ReceiptError``.
    """
    what = "the split/merge step" if isinstance(step, SplitStep) else "the nnx.jit step"
    return _check_receipt_dict(step_receipt(step, model, X), expect, what=what,
                               allow_fp32_matmuls=allow_fp32_matmuls)
