"""Gates a broken rung cannot pass (JAX): the model gate, the optimizer gate, the receipt check.

* ``model_gate(reference, candidate, batches)`` -- the candidate model's logits and the gradient
  of every parameter, by name, against the reference model's (no optimizer step), at probe
  weights where every part of the model matters (``perfladder.measure.gates``). Both models are
  cloned first: the models the rung goes on to time are not touched.
* ``optimizer_gate(model, optimizer, batches, lr=..., step=...)`` -- a few steps of the
  candidate's own step function and optimizer, on clones, against the reference AdamW
  (``make_optimizer``) under ``nnx.jit`` on a clone of the same model: every parameter must
  move as the reference moves it.
* ``check_receipt(...)`` -- the dtype receipt that the compiled step recorded while it was
  traced (``steps.record_receipt``), not one computed on the side.

The metric, the tolerances and ``GateResult`` are framework-free: ``perfladder.measure.gates``.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from perfladder.jax.program import param_dtypes
from perfladder.jax.step import SplitStep, make_optimizer, make_split_step, make_train_step, step_receipt
from perfladder.measure.gates import (
    OPTIMIZER_TOL,
    GateResult,
    ModelGateError,
    OptimizerGateError,
    fail_if,
    probe_qk_std,
    rel_diff,
    tolerances,
)
from perfladder.measure.gates import check_receipt as _check_receipt_dict

METRIC = "||candidate - reference|| / ||reference|| per tensor (Frobenius norms)"


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


def named(tree) -> dict:
    """``{'blks.0.attn.W_qkv.kernel': array, ...}`` from an ``nnx.State`` of parameters."""
    return {".".join(map(str, path)): v[...] if isinstance(v, nnx.Variable) else v
            for path, v in nnx.to_flat_state(tree)}


def _loss_and_logits(model, X, Y, view):
    net = model if view is None else view(model)
    logits = net(X)                                                        # (B, T, V)
    flat = logits.astype(jnp.float32).reshape(-1, logits.shape[-1])       # (B*T, V) fp32
    loss = optax.softmax_cross_entropy_with_integer_labels(flat, Y.reshape(-1)).mean()
    return loss, logits


def _grads(model, X, Y, view):
    """Loss, logits and the gradient w.r.t. every ``nnx.Param``: the step without its update."""
    (loss, logits), grads = nnx.value_and_grad(_loss_and_logits, has_aux=True)(model, X, Y, view)
    return loss, logits, grads


_grads_jit = nnx.jit(_grads, static_argnums=3)


def gradients(model, X, Y, view=None, chunks: int = 1, jit: bool = True) -> tuple[np.ndarray, dict]:
    """``(logits as fp32 numpy, {parameter name: gradient})`` of the mean cross entropy on
    ``(X, Y)``, compiled (``jit``) or op by op. ``chunks`` > 1 splits the batch into that many
    equal parts and averages their gradients: the same mean over the whole batch, computed at
    a smaller batch."""
    B = X.shape[0]
    if not isinstance(chunks, int) or chunks < 1 or B % chunks:
        raise ValueError(f"chunks={chunks!r} must be a positive integer dividing the batch {B}")
    n = B // chunks
    logits, total = [], None
    run = _grads_jit if jit else _grads
    for i in range(chunks):
        _, lg, g = run(model, X[i * n:(i + 1) * n], Y[i * n:(i + 1) * n], view)      # (n, T, V), ...
        logits.append(np.asarray(lg.astype(jnp.float32)))
        g = {k: np.asarray(v, np.float64) for k, v in named(g).items()}
        total = g if total is None else {k: total[k] + g[k] for k in total}
    return np.concatenate(logits), {k: v / chunks for k, v in total.items()}


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


@contextlib.contextmanager
def _true_fp32(on: bool):
    """Full-precision fp32 matmuls (no TF32) for the reference, when it computes in fp32."""
    if not on:
        yield
        return
    with jax.default_matmul_precision("highest"):
        yield


# -- the model gate -------------------------------------------------------------------------------
def model_gate(reference, candidate, batches, *, view: Callable | None = None,
               reference_chunks: int = 1, reference_jit: bool = False, candidate_jit: bool = True,
               name: str = "model gate") -> GateResult:
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
    ``candidate_jit`` is False (the ladder's trial: the gate checks the model's arithmetic, and
    compiling a second program per rung for it would cost a GPU ladder seconds per rung; the
    compiled step itself is checked by the loss gate, which runs it).
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
        with _true_fp32(p_ref == "fp32"):
            ref_logits, ref_grads = gradients(ref, X, Y, chunks=reference_chunks, jit=reference_jit)
        cand_logits, cand_grads = gradients(cand, X, Y, view, jit=candidate_jit)
        _worse(measured, "logits", _rel(cand_logits, ref_logits))
        for k, g in ref_grads.items():
            _worse(measured, f"grad/{k}", _rel(cand_grads.get(k), g))
    tolerance = {k: tol["forward" if k == "logits" else "backward"] for k in measured}
    result = GateResult.judge(
        name, reference=describe(reference) + (" under jit" if reference_jit else " op by op"),
        candidate=describe(candidate, view) + (" under jit" if candidate_jit else " op by op"),
        precision={"reference": p_ref, "candidate": p_cand}, measured=measured, tolerance=tolerance,
        details={"metric": METRIC, "batches": len(batches), "batch_shape": list(batches[0][0].shape),
                 "reference_chunks": reference_chunks, "reference_jit": reference_jit,
                 "probe_qk_std": scale})
    return fail_if(result, ModelGateError)


def _rel(got, want) -> float:
    if got is None or np.shape(got) != np.shape(want):
        return float("inf")
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    return rel_diff(float(np.linalg.norm(got - want)), float(np.linalg.norm(want)))


def _worse(measured: dict, key: str, value: float) -> None:
    measured[key] = max(measured.get(key, 0.0), value)


# -- the optimizer gate ---------------------------------------------------------------------------
_reference_step = make_train_step()


def optimizer_gate(model, optimizer, batches, *, lr: float, step: Callable | str | None = None,
                   name: str = "optimizer gate") -> GateResult:
    """The candidate's optimizer (and step) moves every parameter as the reference AdamW does.

    ``model`` / ``optimizer``: the candidate's, before its first step (neither is touched: the
    gate runs on clones). The reference is ``make_optimizer(lr)`` on a clone of the same model.

    * ``update/<parameter>``: for each batch the reference computes the gradients and both
      optimizers apply those same gradients (``Optimizer.update``), so only the optimizers
      can differ: a parameter group left out, another learning rate, cannot pass.
    * ``step/<parameter>`` (when ``step`` is given): the candidate's step function --
      ``step(model, optimizer, X, Y)`` such as the ladder's shared ``nnx.jit`` step, or
      'split' for the split/merge ``jax.jit`` step (``make_split_step``) -- runs on the
      candidate's clones, the reference ``nnx.jit`` step on the reference's: a step that drops
      its optimizer state or writes back stale parameters cannot pass. The two compute the same
      gradients up to compilation (on a GPU, the order of atomic adds: ~1e-7 relative).

    Each parameter's displacement after ``len(batches)`` steps must match, ``||diff|| / ||ref||``
    within ``perfladder.measure.gates.OPTIMIZER_TOL``. Raises ``OptimizerGateError``; returns the
    ``GateResult``.
    """
    batches = list(batches)
    if not batches:
        raise ValueError("optimizer_gate needs at least one (X, Y) batch")
    count = getattr(optimizer, "step", None)
    if count is not None and int(np.asarray(count[...])) != 0:
        raise ValueError(f"optimizer_gate needs the candidate's optimizer before its first step; "
                         f"it has taken {int(np.asarray(count[...]))}")
    start = {k: np.asarray(v) for k, v in named(nnx.state(model, nnx.Param)).items()}
    measured = _displacements("update", start, *_same_gradients(model, optimizer, batches, lr))
    if step is not None:
        measured.update(_displacements("step", start, *_own_steps(model, optimizer, batches, lr, step)))
    result = GateResult.judge(
        name, reference=f"AdamW(lr={lr:g}) from make_optimizer on {describe(model)}",
        candidate=f"its own optimizer{'' if step is None else ' and ' + _step_name(step) + ' step'} "
                  f"on {describe(model)}",
        precision={"reference": "fp32", "candidate": "fp32"}, measured=measured,
        tolerance={k: OPTIMIZER_TOL for k in measured},
        details={"metric": METRIC + " of each parameter's displacement", "steps": len(batches),
                 "batch_shape": list(batches[0][0].shape)})
    return fail_if(result, OptimizerGateError)


def _same_gradients(model, optimizer, batches, lr):
    """(reference params, candidate params) after both optimizers applied the reference's gradients."""
    cand_model, cand_opt = clone((model, optimizer))
    ref_model = clone(model)
    ref_opt = make_optimizer(ref_model, lr)
    for X, Y in batches:
        grads = _grads_jit(ref_model, X, Y, None)[2]
        ref_opt.update(ref_model, grads)
        cand_opt.update(cand_model, grads)
    return ref_model, cand_model


def _own_steps(model, optimizer, batches, lr, step):
    """(reference params, candidate params) after each ran its own step function."""
    cand_model, cand_opt = clone((model, optimizer))
    ref_model = clone(model)
    ref_opt = make_optimizer(ref_model, lr)
    run = _runner(step, cand_model, cand_opt)
    for X, Y in batches:
        _reference_step(ref_model, ref_opt, X, Y)
        run(X, Y)
    if isinstance(run, SplitStep):
        run.commit()
    return ref_model, cand_model


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
    receipt was written by that very step object while it traced the program
    (``steps.record_receipt``), so it describes what is timed, not a side path; a step that
    never compiled that program has none, and fails. ``allow_fp32_matmuls``: fp32 matmuls a
    bf16 program may hold (1 for an fp32 one-hot lookup). Raises ``ReceiptError``.
    """
    what = "the split/merge step" if isinstance(step, SplitStep) else "the nnx.jit step"
    return _check_receipt_dict(step_receipt(step, model, X), expect, what=what,
                               allow_fp32_matmuls=allow_fp32_matmuls)


# Logit agreement is judged relative to the logits' scale: max |a - b| / max |b| <= tol
# (a tiny fresh model has logits of order 0.1, so an absolute tolerance would be toothless).
# Jit vs op-by-op: fusion re-associates sums (and on a GPU fp32 matmuls run as TF32), so
# agreement is loose. A checkpointed mirror runs the same arithmetic as its reference, so
# its agreement must be (nearly) exact.
PARITY_TOL = {"float32": 1e-2, "bfloat16": 5e-2}
MIRROR_TOL = {"float32": 1e-5, "bfloat16": 1e-2}


def assert_fp32_masters(model, optimizer) -> None:
    """Parameters and AdamW moments must still be fp32 after a mixed-precision step."""
    params = nnx.state(model, nnx.Param)
    opt_state = nnx.state(optimizer, nnx.OptState) if hasattr(nnx, "OptState") else nnx.state(optimizer)
    for name, tree in (("parameters", params), ("optimizer state", opt_state)):
        dts = param_dtypes(tree)
        if dts != {"float32"}:
            raise AssertionError(f"fp32 masters broken: {name} hold dtypes {sorted(dts)}")


# -- correctness gates --------------------------------------------------------------------------
def _tol(dtype, table) -> float:
    return table.get(str(jnp.dtype(dtype)), table["bfloat16"])


def _compare(got, want, tol, what) -> float:
    """Relative disagreement ``max|got - want| / max|want|``; raises above ``tol``."""
    g, w = jnp.asarray(got, jnp.float32), jnp.asarray(want, jnp.float32)
    if g.shape != w.shape:
        raise AssertionError(f"{what}: logits shapes differ, {g.shape} vs {w.shape}")
    rel = float(jnp.max(jnp.abs(g - w)) / jnp.maximum(jnp.max(jnp.abs(w)), 1e-30))
    if not rel <= tol:
        raise AssertionError(f"{what}: logits differ, max|diff| / max|logits| = {rel:.3g} "
                             f"> allowed {tol:g}")
    return rel


def check_jit_parity(model, X, *, reference=None, tol: float | None = None) -> float:
    """R1's gate: ``nnx.jit``-compiled logits of ``model`` == op-by-op logits of ``reference``.

    ``reference`` defaults to ``model`` itself (a test passes a different, planted one).
    Returns ``max|diff| / max|logits|``; raises ``AssertionError`` above ``tol``
    (default by compute dtype, ``PARITY_TOL``).
    """
    reference = model if reference is None else reference
    compiled = nnx.jit(lambda m, X: m(X))(model, X)
    eager = reference(X)
    return _compare(compiled, eager, _tol(model.dtype, PARITY_TOL) if tol is None else tol,
                    "jit parity gate")


def with_checkpointing(model):
    """A mirror of ``model`` sharing its parameter values, with every block under remat."""
    graphdef, state = nnx.split(model)
    mirror = nnx.merge(graphdef, state)
    mirror.use_checkpoint(True)
    return mirror


def _two_forwards(a, b, X):
    return a(X), b(X)


_two_forwards_jit = nnx.jit(_two_forwards)


def check_mirror(reference, mirror, X, *, tol: float | None = None) -> float:
    """R4's gate: the checkpointed model must compute the reference's logits.

    Both forwards run in one ``nnx.jit`` program (one compilation); remat must not change
    what the forward computes. Returns ``max|diff| / max|logits|``; raises above ``tol``.
    """
    got, want = _two_forwards_jit(mirror, reference, X)
    return _compare(got, want, _tol(reference.dtype, MIRROR_TOL) if tol is None else tol,
                    "checkpoint mirror")


