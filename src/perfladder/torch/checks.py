"""Each PyTorch rung's own equivalence checks, at probe weights and in the rung's precision:
R1's compiled-vs-eager logits (``check_compiled``), R4's checkpointed mirror (``check_mirror``)
and what its checkpoint saves for the backward (``checkpoint_saves``), and B4's one-hot lookup against the gather (``onehot_check``: true fp32, and inside the rung's
own step). Tolerances: ``perfladder.measure.gates``. The model and optimizer gates every rung
passes: ``perfladder.torch.gates``. The JAX side's counterpart: ``perfladder.jax.checks``.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from perfladder.measure.checkpointing import checkpoint_gate
from perfladder.measure.evidence import Gate
from perfladder.measure.gates import (
    COMPILE_ATOL,
    COMPILE_RTOL,
    EMBED_ATOL,
    EMBED_GRAD_RTOL,
    LOOKUP_TOL,
    MIRROR_ATOL,
    GateError,
    probe_qk_std,
)
from perfladder.torch.gates import true_fp32
from perfladder.torch.recipe import Recipe
from perfladder.torch.trial import gate_batches

__all__ = ["CorrectnessError", "MirrorError", "probed", "check_compiled", "check_mirror",
           "saved_activation_bytes", "checkpoint_saves", "onehot_check", "embed_gate", "lookup_in_step"]


class CorrectnessError(GateError):
    """The compiled model does not compute what the eager model computes."""


class MirrorError(GateError):
    """A re-wired model (e.g. checkpointed) is not an exact mirror of the plain one."""


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@contextlib.contextmanager
def probed(*modules: nn.Module):
    """Inside the block, each GPT of ``modules`` (the same weights, or the very same module)
    holds its probe weights (``probe_qk_std``: attention scores of std ``PROBE_SCORE_STD``),
    in place; its own weights come back after. A parity check at the initial weights, where
    attention is a near-uniform average, would pass a wrong attention scale."""
    saved = []
    # a compiled module is its original's wrapper; a plain forward function shares its model's
    # parameters (nothing to scale twice)
    gpts = [_gpt(getattr(m, "_orig_mod", m)) for m in modules if isinstance(m, nn.Module)]
    with torch.no_grad():
        for m in {id(m): m for m in gpts}.values():
            D = m.config.num_hiddens
            for name, W in m.named_parameters():
                if name.endswith("attn.W_qkv.weight"):                  # (3D, D): q | k | v
                    saved.append((W, W[:2 * D].clone()))
                    W[:2 * D] *= probe_qk_std(D) / W[:2 * D].std()
    try:
        yield
    finally:
        with torch.no_grad():
            for W, qk in saved:
                W[:qk.shape[0]].copy_(qk)


def check_compiled(eager: nn.Module, compiled: nn.Module, X: torch.Tensor,
                   atol: float = COMPILE_ATOL, rtol: float = COMPILE_RTOL) -> float:
    """Assert ``compiled(X)`` is allclose to ``eager(X)`` at probe weights (``probed``; the
    compiled module shares the eager one's parameters); return the max abs difference.

    Runs with autograd on, as in training, so the compiled module reuses its training
    graph instead of compiling a second (inference) graph just for the gate.
    """
    with probed(eager, compiled):
        ref = eager(X).detach()                               # (B, T, V)
        got = compiled(X).detach()                            # (B, T, V)
    if got.shape != ref.shape:
        raise CorrectnessError(f"compiled logits have shape {tuple(got.shape)}, eager {tuple(ref.shape)}")
    diff = _max_diff(got, ref)
    if not torch.allclose(got.float(), ref.float(), atol=atol, rtol=rtol):
        raise CorrectnessError(f"compiled logits differ from eager: max |diff| = {diff:.3g} "
                               f"(allowed atol={atol}, rtol={rtol}); not timing a wrong model")
    return diff


def check_mirror(plain: nn.Module, mirror: nn.Module, X: torch.Tensor,
                 atol: float = MIRROR_ATOL, *, wrap=None, dtype=torch.float32) -> float:
    """Assert ``mirror(X)`` equals ``plain(X)`` to ``atol``, both at probe weights; return
    max |diff|. ``wrap(module) -> forward``: how the rung's step runs a module (its own
    ``autocast_bf16``, for a bf16 rung); the logits must come out ``dtype``. Without ``wrap``:
    fp32, autocast off."""
    off = torch.autocast(X.device.type, enabled=False) if wrap is None else contextlib.nullcontext()
    with probed(plain, mirror), off:
        ref = (plain if wrap is None else wrap(plain))(X).detach()          # (B, T, V)
        got = (mirror if wrap is None else wrap(mirror))(X).detach()        # (B, T, V)
    if ref.dtype != dtype or got.dtype != dtype:
        raise MirrorError(f"the mirror check must run in the rung's precision ({dtype}); got "
                          f"{ref.dtype} and {got.dtype}")
    diff = _max_diff(got, ref)
    if got.shape != ref.shape or not torch.allclose(got, ref, atol=atol, rtol=0.0):
        raise MirrorError(f"the checkpointed model is not an exact mirror of the plain one: "
                          f"max |diff| = {diff:.3g} > atol={atol}")
    return diff


def saved_activation_bytes(forward, X: torch.Tensor, params=()) -> int:
    """Bytes one ``forward(X)`` leaves saved for the backward: every tensor autograd packs
    (``saved_tensors_hooks``), each storage counted once, the storages of ``params`` left out
    (every form of the model keeps its weights). Inside ``torch.utils.checkpoint`` the
    checkpoint's own hook packs instead, so what a checkpointed block recomputes is not
    counted -- a block called directly is."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen.setdefault(s.data_ptr(), s.nbytes())
        return t
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward(X)                                                        # (B, T, V)
    return sum(seen.values())


def checkpoint_saves(plain: nn.Module, step, X: torch.Tensor, *, wrap=None) -> Gate:
    """R4's checkpoint gate (``perfladder.measure.checkpointing``): the bytes the rung's own
    forward (``step``'s, eagerly: ``TrainStep.uncompiled``) saves for the backward against
    ``plain``'s, the same recipe without checkpointing run through ``wrap`` (the step's
    ``autocast_bf16``, for a bf16 rung). ``CheckpointGateError`` unless at most
    ``CHECKPOINT_SAVED_RATIO`` of the base's."""
    model = _gpt(step.model)
    with step.uncompiled():
        saved = saved_activation_bytes(step.logits, X, model.parameters())
    base = saved_activation_bytes(plain if wrap is None else wrap(plain), X, plain.parameters())
    return checkpoint_gate(saved, base, reference="the same recipe without checkpointing, "
                           f"one forward of {tuple(X.shape)}")


def _gpt(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)          # DDP wraps the GPT


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
