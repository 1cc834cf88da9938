"""Correctness gates: each rung proves it still computes the same model before it is timed.

Every gate raises a ``GateError`` (an ``AssertionError``) naming what differed and by how
much; a faster wrong answer never reaches the timer.

* ``model_gate(reference, candidate, batches)`` -- the candidate step's logits, its own loss,
  the gradient of every parameter by name and the scale of every matrix gradient, against
  the reference step's (the plain eager fp32 model), at probe weights where every part of
  the model matters; no optimizer step.
* ``optimizer_gate(reference, candidate, batches)`` -- both optimizers fed the same gradients
  for a few steps: every parameter must move as the reference AdamW moves it.
* ``check_receipt(step, expect, arithmetic=...)`` -- the dtypes the timed call itself recorded
  (``TrainStep.receipt``), not those of a side path, and the dtypes of its arithmetic
  (every matmul, attention kernel and loss op: ``perfladder.torch.program.arithmetic``).

Each rung's own equivalence checks (R1's compiled vs eager logits, R4's mirror, B4's lookup):
``perfladder.torch.checks``.

The metric, the tolerance table and ``GateResult`` are framework-free: ``perfladder.measure.gates``.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from perfladder.measure.gates import (
    METRIC,
    OPTIMIZER_TOL,
    GateError,
    GateResult,
    ModelGateError,
    OptimizerGateError,
    ReceiptError,
    fail_if,
    probe_qk_std,
    rel_diff,
    scale_error,
    tolerances,
)
from perfladder.measure.gates import check_receipt as _check_receipt_dict

__all__ = ["model_gate", "optimizer_gate", "check_receipt", "check_bf16", "true_fp32",
           "PrecisionError"]     # tolerances: measure.gates


class PrecisionError(ReceiptError):
    """A rung that claims bf16 did not compute in bf16 (no silent fp32)."""


def check_bf16(logits: torch.Tensor, what: str = "logits") -> str:
    """Assert ``logits`` came out bf16 (the receipt of a bf16 rung); return the dtype name."""
    if logits.dtype != torch.bfloat16:
        raise PrecisionError(f"{what} are {logits.dtype} inside the bf16 autocast region, "
                             "expected torch.bfloat16: this rung would measure fp32 and call it bf16")
    return str(logits.dtype)


# -- what a step computes ----------------------------------------------------------------------
def step_precision(step) -> str:
    """'bf16' for a bf16 autocast step; an fp32 step is 'tf32' on CUDA unless fp32 matmuls are
    set to 'highest', and 'fp32' on CPU."""
    if step.bf16:
        return "bf16"
    on_cuda = step.device_type == "cuda"
    return "tf32" if on_cuda and torch.get_float32_matmul_precision() != "highest" else "fp32"


def describe(step) -> str:
    """The step and the model it runs, in one line."""
    m = _module(step.model)
    return (f"{step!r} on GPT(embed={m.embed!r}, attn_backend={m.attn_backend!r}, "
            f"checkpoint={m.checkpoint})")


def _module(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)          # DDP wraps the GPT


def _params(step) -> dict:
    return dict(_module(step.model).named_parameters())


@contextlib.contextmanager
def true_fp32(on: bool = True):
    """fp32 matmuls at full precision (no TF32) inside the block; restored after."""
    before = torch.get_float32_matmul_precision()
    if on:
        torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _same_start(reference, candidate, gate: str, error: type[GateError]) -> None:
    ref, cand = _params(reference), _params(candidate)
    if set(ref) != set(cand):
        raise error(f"the candidate's parameters {sorted(set(ref) ^ set(cand))} do not match the "
                    "reference's by name", gate=gate)
    for k, p in ref.items():
        if p.shape != cand[k].shape or not torch.equal(p.detach(), cand[k].detach()):
            raise error(f"the candidate was not built from the reference's initial weights: {k} "
                        "differs", gate=gate)


def _snapshot(step) -> dict:
    return {k: p.detach().clone() for k, p in _params(step).items()}


@torch.no_grad()
def _load(step, values: dict) -> None:
    """Copy ``values`` into the step's parameters in place (a compiled step or a CUDA graph
    keeps the addresses it captured)."""
    for k, p in _params(step).items():
        p.copy_(values[k])


def probe_weights(step) -> tuple[dict, float]:
    """The step's parameters with the query and key projections scaled so that attention
    scores have the std ``perfladder.measure.gates.PROBE_SCORE_STD`` (see there), and that weight std."""
    values = _snapshot(step)
    D = _module(step.model).config.num_hiddens
    target = probe_qk_std(D)
    for k, W in values.items():
        if k.endswith("attn.W_qkv.weight"):                      # (3D, D): q | k | v rows
            W[:2 * D] *= target / W[:2 * D].std()
    return values, target


def _rel(got, want: torch.Tensor) -> float:
    if got is None or got.shape != want.shape:
        return float("inf")
    got, want = got.double(), want.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return rel_diff((got - want).norm().item(), want.norm().item())


def _scale(got, want: torch.Tensor) -> float:
    """|<got, want> / <want, want> - 1| (``perfladder.measure.gates.SCALE_TOL``)."""
    if got is None or got.shape != want.shape:
        return float("inf")
    got, want = got.double(), want.double()
    return scale_error((got * want).sum().item(), (want * want).sum().item())


def _reference_pass(step, X, Y, chunks: int):
    """Logits (fp32) and ``{name: grad}`` of the reference, its batch in ``chunks`` equal slices
    (gradients averaged: the gradient of the mean over the whole batch)."""
    B = X.shape[0]
    if not isinstance(chunks, int) or chunks < 1 or B % chunks:
        raise ValueError(f"reference_chunks={chunks!r} must be a positive integer dividing the batch {B}")
    n, logits, grads, loss = B // chunks, [], None, 0.0
    for i in range(chunks):
        lo, lg = step.forward_backward(X[i * n:(i + 1) * n], Y[i * n:(i + 1) * n])
        logits.append(lg.float())
        loss += lo.double() / chunks
        g = {k: p.grad.detach().double() for k, p in _params(step).items()}
        grads = g if grads is None else {k: grads[k] + g[k] for k in grads}
    return loss, torch.cat(logits), {k: g / chunks for k, g in grads.items()}


# -- the model gate ----------------------------------------------------------------------------
def model_gate(reference, candidate, batches, *, reference_chunks: int = 1,
               name: str = "model gate") -> GateResult:
    """The candidate step computes the reference's model: forward and backward, parameter by
    parameter, with no optimizer step.

    ``reference``: a ``TrainStep`` of the plain eager fp32 GPT (``Ladder.fresh_step(compiled=False,
    bf16=False)``); ``candidate``: the rung's ``TrainStep``, built from the same initial weights
    (compiled or not, bf16 or not, any embedding / attention backend / checkpointing).
    ``batches``: a few fixed ``(X, Y)`` at the candidate's batch size (its compiled shape).
    Both models get the same probe weights for the gate and their own weights back after
    (in place), gradients cleared, optimizers untouched. The candidate runs
    ``forward_backward`` -- the code its timed ``__call__`` runs; an fp32 reference runs in
    true fp32. ``reference_chunks`` runs the reference on that many equal slices of each
    batch and averages (a batch rung against the smaller batch). Compares the logits, the
    loss the candidate's own ``loss_and_grads`` computed and every gradient (``||diff|| /
    ||ref||``), and every matrix gradient's scale (``scale/<name>``: Adam would hide a
    scaled gradient from the loss gate) with ``perfladder.measure.gates.tolerances``.
    Raises ``ModelGateError`` (the worst parameter and its numbers); returns the ``GateResult``.
    """
    _same_start(reference, candidate, name, ModelGateError)
    batches = list(batches)
    if not batches:
        raise ValueError("model_gate needs at least one (X, Y) batch")
    p_ref = "bf16" if reference.bf16 else "fp32"
    p_cand = step_precision(candidate)
    tol = tolerances(p_ref, p_cand)
    saved = {"reference": _snapshot(reference), "candidate": _snapshot(candidate)}
    probe, scale = probe_weights(reference)
    measured: dict = {}
    try:
        _load(reference, probe)
        _load(candidate, probe)
        for X, Y in batches:
            with true_fp32(p_ref == "fp32"):
                ref_loss, ref_logits, ref_grads = _reference_pass(reference, X, Y, reference_chunks)
            cand_loss, cand_logits = candidate.forward_backward(X, Y)      # the step's own loss
            cand = _params(candidate)
            _worse(measured, "logits", _rel(cand_logits.float(), ref_logits))
            _worse(measured, "loss", _rel(cand_loss.reshape(1), ref_loss.reshape(1)))
            for k, g in ref_grads.items():
                _worse(measured, f"grad/{k}", _rel(cand[k].grad, g))
                if g.dim() >= 2:
                    _worse(measured, f"scale/{k}", _scale(cand[k].grad, g))
    finally:
        for key, step in (("reference", reference), ("candidate", candidate)):
            _load(step, saved[key])
            step.opt.zero_grad(set_to_none=True)
    tolerance = {k: tol[_KIND[k.split("/")[0]]] for k in measured}
    result = GateResult.judge(
        name, reference=describe(reference), candidate=describe(candidate),
        precision={"reference": p_ref, "candidate": p_cand}, measured=measured, tolerance=tolerance,
        details={"metric": METRIC, "batches": len(batches), "batch_shape": list(batches[0][0].shape),
                 "reference_chunks": reference_chunks, "probe_qk_std": scale})
    return fail_if(result, ModelGateError)


_KIND = {"logits": "forward", "loss": "forward", "grad": "backward", "scale": "scale"}


def _worse(measured: dict, key: str, value: float) -> None:
    measured[key] = max(measured.get(key, 0.0), value)


# -- the optimizer gate -------------------------------------------------------------------------
def optimizer_gate(reference, candidate, batches, *, name: str = "optimizer gate") -> GateResult:
    """The candidate's optimizer moves every parameter as the reference's AdamW does.

    ``reference``: the eager fp32 ``TrainStep`` with PyTorch's default AdamW; ``candidate``: the
    rung's step (fused, compiled or default AdamW, any model), from the same initial weights,
    before its first step. For each batch the reference computes the gradients (true fp32) and
    both optimizers step on those same gradients -- the candidate through the optimizer step its
    timed ``__call__`` runs -- so only the optimizers can differ. Each parameter's displacement
    after ``len(batches)`` steps must match (``||diff|| / ||ref||`` within
    ``perfladder.measure.gates.OPTIMIZER_TOL``): a parameter group left out, another learning rate, a
    skipped step cannot. Weights and optimizer state are put back in place afterwards.
    Raises ``OptimizerGateError``; returns the ``GateResult``.
    """
    _same_start(reference, candidate, name, OptimizerGateError)
    batches = list(batches)
    if not batches:
        raise ValueError("optimizer_gate needs at least one (X, Y) batch")
    saved = {id(s): (_snapshot(s), _opt_snapshot(s.opt)) for s in (reference, candidate)}
    start = saved[id(reference)][0]
    try:
        for X, Y in batches:
            with true_fp32(not reference.bf16):
                reference.forward_backward(X, Y)
            cand = _params(candidate)
            for k, p in _params(reference).items():
                cand[k].grad = p.grad.detach().clone()
            reference._opt_step()
            candidate._opt_step()
        ref_now, cand_now = _snapshot(reference), _snapshot(candidate)
    finally:
        for s in (reference, candidate):
            _load(s, saved[id(s)][0])
            _opt_restore(s.opt, saved[id(s)][1])
            s.opt.zero_grad(set_to_none=True)
    measured = {f"update/{k}": _rel(cand_now[k] - p0, ref_now[k] - p0) for k, p0 in start.items()}
    result = GateResult.judge(
        name, reference=f"{type(reference.opt).__name__} {_opt_kind(reference)} of {describe(reference)}",
        candidate=f"{type(candidate.opt).__name__} {_opt_kind(candidate)} of {describe(candidate)}",
        precision={"reference": "fp32", "candidate": "fp32"}, measured=measured,
        tolerance={k: OPTIMIZER_TOL for k in measured},
        details={"metric": METRIC + " of each parameter's displacement", "steps": len(batches),
                 "batch_shape": list(batches[0][0].shape), "same_gradients": True})
    return fail_if(result, OptimizerGateError)


def _opt_kind(step) -> str:
    d = step.opt.defaults
    kind = ("compiled" if step.compile_optimizer else "fused" if d.get("fused")
            else "foreach" if d.get("foreach") else "default")
    return f"({kind}, lr={d.get('lr')})"


def _opt_snapshot(opt) -> dict:
    return {p: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()}
            for p, st in opt.state.items()}


@torch.no_grad()
def _opt_restore(opt, saved: dict) -> None:
    """Optimizer state back as it was, in place: state that existed gets its values back; state
    the gate created is zeroed (AdamW with step 0 and zero moments is a fresh AdamW), so a
    compiled optimizer step keeps the tensors it captured."""
    for p, st in opt.state.items():
        before = saved.get(p)
        for k, v in st.items():
            if torch.is_tensor(v) and before is not None:
                v.copy_(before[k])
            elif torch.is_tensor(v):
                v.zero_()
            else:
                st[k] = before[k] if before is not None else type(v)(0)


# -- receipts -------------------------------------------------------------------------------------
def check_receipt(step, expect: str = "bf16", arithmetic: dict | None = None,
                  allow_fp32_matmuls: int = 0) -> dict:
    """Assert that the step's own last call computed in ``expect`` ('bf16' or 'fp32'), from the
    receipt that call recorded (``TrainStep.receipt``: logits, loss, a gradient) and, when
    given, from ``arithmetic`` (``perfladder.torch.program.arithmetic(step, X, Y)``: every
    matmul's and attention kernel's operands, the loss op's input). ``allow_fp32_matmuls``:
    fp32 matmuls a bf16 step computes by design (2 for the one-hot lookup: its forward and
    its table gradient). ``PrecisionError`` (a ``ReceiptError``) if not, or if the step
    recorded none. Call it after a step of the timed kind ran."""
    receipt = getattr(step, "receipt", None)
    if receipt and arithmetic is not None:
        receipt = {**receipt, **arithmetic}
    try:
        return _check_receipt_dict(receipt, expect, what=repr(step),
                                   allow_fp32_matmuls=allow_fp32_matmuls)
    except ReceiptError as e:
        raise PrecisionError(str(e), gate="receipt") from None
