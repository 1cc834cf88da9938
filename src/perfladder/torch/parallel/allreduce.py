"""R5's all-reduce gate on one PyTorch rank (the rule: ``perfladder.measure.allreduce``).

At the start of a DDP or FSDP2 launch, every rank runs the rank's own step up to the
optimizer (``TrainStep.forward_backward``: the wrapped model, its hooks and collectives) on
one batch of its own stream, and compares the gradient it then holds -- an FSDP2 shard
gathered whole -- with the single-process gradient of all the ranks' batches together,
computed by a plain replica of the model (same seed, same recipe, no wrapper) one rank's
batch at a time. The gradients are then dropped: the timed steps start from the same
weights as without the check.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from perfladder.measure.allreduce import allreduce_gate
from perfladder.measure.evidence import Gate

__all__ = ["flat_grads", "reference_grads", "compare", "check_allreduce"]


def flat_grads(model) -> torch.Tensor:
    """Every parameter's gradient, in ``model.parameters()`` order, as one float64 vector; an
    FSDP2 gradient (a DTensor shard) gathered whole (a collective: every rank calls it)."""
    out = []
    for p in model.parameters():
        g = p.grad
        if g is None:
            g = torch.zeros(p.shape, dtype=torch.float64, device=_local(p).device)
        elif hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out.append(g.detach().double().reshape(-1))
    return torch.cat(out)


def _local(p):
    return p.to_local() if hasattr(p, "to_local") else p


def reference_grads(step, batches) -> torch.Tensor:
    """The single-process gradient of ``batches`` together (equal sizes: the mean of each
    batch's mean-loss gradient), by ``step`` (a plain replica's eager step)."""
    total = None
    for X, Y in batches:
        step.forward_backward(X, Y)
        g = flat_grads(step.model)
        total = g if total is None else total + g
    step.opt.zero_grad(set_to_none=True)
    return total / len(batches)


def compare(got: torch.Tensor, want: torch.Tensor, *, precision: str, ranks: int,
            who: str) -> Gate:
    """``allreduce_gate`` of two flat gradients (``AllReduceGateError`` past tolerance)."""
    return allreduce_gate(float(got @ want), float(want @ want), float((got - want).norm()),
                          precision=precision, ranks=ranks, who=who)


def check_allreduce(step, reference_step, X, Y, *, precision: str) -> Gate:
    """The gate on this rank: ``step`` (the wrapped model's) on this rank's batch ``(X, Y)``
    against ``reference_step`` (a plain replica's) on every rank's batch; the gradients are
    left cleared. Every rank must call it (it gathers the batches)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    Xs, Ys = [torch.empty_like(X) for _ in range(world)], [torch.empty_like(Y) for _ in range(world)]
    dist.all_gather(Xs, X.contiguous())
    dist.all_gather(Ys, Y.contiguous())
    step.forward_backward(X, Y)
    got = flat_grads(step.model)
    step.opt.zero_grad(set_to_none=True)
    want = reference_grads(reference_step, list(zip(Xs, Ys)))
    return compare(got, want, precision=precision, ranks=world, who=f"rank {rank}")
