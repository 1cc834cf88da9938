"""The second line of the beyond rungs' gate: a few optimizer steps must follow the seed recipe.

Before timing, the rung's own step runs ``GATE_STEPS`` optimizer steps from the ladder's
initial weights on fixed batches; its losses must equal those of the seed recipe (bf16
autocast, gather embedding, PyTorch's default AdamW and attention) run eagerly on the same
batches, within ``LOSS_ATOL``. (The first line, logits and every gradient against the
configuration the rung builds on, is ``perfladder.torch.gates``.) Also here: the one-hot
embedding's own mirror check.
"""
from __future__ import annotations

import contextlib
import time

import torch

from perfladder.measure.evidence import Gate
from perfladder.torch.gates import GateError, MirrorError, model_gate, optimizer_gate
from perfladder.torch.recipe import Recipe
from perfladder.torch.stream import batches
from perfladder.torch.timer import sync

GATE_STEPS = 3             # optimizer steps the loss gate runs from the initial weights
# Absolute, on a loss of ~3.3: switches that only reorder bf16 kernels (compiled vs eager,
# fused vs foreach AdamW) move these first losses by about 1e-3 on the full-width model; a
# step that skips or garbles the update moves them by tenths.
LOSS_ATOL = 2e-2
EMBED_ATOL = 1e-6          # one-hot vs gather logits, true fp32: every product is 1*w or 0*w
EMBED_GRAD_RTOL = 1e-4     # their table gradients: the same sums in a different order
GATE_SEED_OFFSET = 10_000  # the gate's batches come from their own shuffle seed


class LossGateError(GateError):
    """A configuration's first losses differ from the seed recipe's on the same batches."""


def gate_batches(lab, batch_size: int) -> list:
    """``GATE_STEPS`` fixed (X, Y) batches of ``batch_size``, the same for every configuration."""
    cache = lab.memo.setdefault("gate_batches", {})
    if batch_size not in cache:
        stream = batches(lab.data, batch_size, lab.device, seed=lab.config.seed + GATE_SEED_OFFSET)
        cache[batch_size] = [next(stream) for _ in range(GATE_STEPS)]
    return cache[batch_size]


def gate_losses(step, fixed) -> tuple[list[float], float]:
    """Losses of ``step`` over ``fixed`` (read once at the end) and the seconds of its first call."""
    losses, first_s = [], 0.0
    t0 = time.perf_counter()
    for i, (X, Y) in enumerate(fixed):
        losses.append(step(X, Y))
        if i == 0:
            sync()
            first_s = time.perf_counter() - t0
    return torch.stack(losses).float().cpu().tolist(), first_s


def reference_losses(lab, batch_size: int) -> list[float]:
    """The seed recipe run eagerly in bf16 from the initial weights over ``gate_batches``."""
    cache = lab.memo.setdefault("reference_losses", {})
    if batch_size not in cache:
        step = lab.build_step(Recipe(batch_size=batch_size, bf16=True))
        cache[batch_size] = gate_losses(step, gate_batches(lab, batch_size))[0]
        del step
        lab.free(graphs=False)
    return cache[batch_size]


def loss_gate(lab, step, batch_size: int, atol: float = LOSS_ATOL) -> tuple[Gate, float]:
    """``(Gate, first_call_s)``: ``step``'s losses over the fixed batches against the eager seed
    recipe's. ``LossGateError`` past ``atol``."""
    ref = reference_losses(lab, batch_size)
    losses, first_s = gate_losses(step, gate_batches(lab, batch_size))
    diff = max(abs(a - b) for a, b in zip(losses, ref))
    if not diff <= atol:                                   # NaN fails too
        raise LossGateError(
            f"losses over the first {GATE_STEPS} steps {[round(x, 5) for x in losses]} differ "
            f"from the eager seed recipe's {[round(x, 5) for x in ref]} by {diff:.3g} > "
            f"atol={atol}: not timing a configuration that trains a different model")
    gate = Gate(name="loss over steps", passed=True, values={"max_abs_diff": diff},
                tolerances={"atol": atol}, reference="the seed recipe, eager bf16",
                detail={"steps": GATE_STEPS, "losses": losses, "reference_losses": ref})
    return gate, first_s


@contextlib.contextmanager
def true_fp32():
    """fp32 matmuls without TF32 for the block (restored after)."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def embed_gate(lab, X: torch.Tensor, atol: float = EMBED_ATOL,
               grad_rtol: float = EMBED_GRAD_RTOL) -> Gate:
    """One-hot and gather embeddings compute the same model: fp32 logits of two eager models
    with the same weights agree to ``atol``, the shared table's gradients to ``grad_rtol``."""
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
    return Gate(name="one-hot vs gather embedding", passed=True,
                values={"logits_max_abs_diff": diff, "grad_max_rel_diff": gdiff},
                tolerances={"atol": atol, "grad_rtol": grad_rtol}, reference="gather embedding, true fp32")


def model_gates(lab, step, recipe: Recipe, optimizer: bool = False) -> list[Gate]:
    """The first line: ``step`` computes the plain model's logits and every parameter's gradient
    (``perfladder.torch.gates.model_gate``) against the eager fp32 model of the same weights, on
    a fixed batch of its own shape; with ``optimizer``, its AdamW moves every parameter as the
    default AdamW does on the same gradients. Raises a ``GateError``; returns the evidence."""
    plain = Recipe(batch_size=recipe.batch_size)
    if recipe == plain:
        return []
    fixed = gate_batches(lab, recipe.batch_size)[:1]
    out = [model_gate(lab.build_step(plain), step, fixed).evidence()]
    if optimizer:
        out.append(optimizer_gate(lab.build_step(plain), step, fixed).evidence())
    lab.free(graphs=False)
    return out
