"""Planted bugs for the PyTorch gates: each breaks the model (or its training) in one way that
a rung could plausibly introduce, while looking right from the outside. Used by
tests/test_planted_torch.py; nothing here is imported by the library."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from perfladder.torch.model import GPT, CausalAttention
from perfladder.torch.step import TrainStep


class NonCausalAttention(CausalAttention):
    """Attention that also sees the future (``is_causal=False``): the next token leaks in."""

    def forward(self, X):
        B, T, D = X.shape
        H = self.num_heads
        q, k, v = self.W_qkv(X).split(D, dim=-1)
        q, k, v = (u.reshape(B, T, H, D // H) for u in (q, k, v))
        q, k = self.rope(q), self.rope(k)
        q, k, v = (u.transpose(1, 2) for u in (q, k, v))
        Y = F.scaled_dot_product_attention(q, k, v, is_causal=False, scale=1.0 / math.sqrt(D // H))
        return self.W_o(Y.transpose(1, 2).reshape(B, T, D))


class NoRopeOnKAttention(CausalAttention):
    """RoPE applied to q only: k keeps no position."""

    def forward(self, X):
        B, T, D = X.shape
        H = self.num_heads
        q, k, v = self.W_qkv(X).split(D, dim=-1)
        q, k, v = (u.reshape(B, T, H, D // H) for u in (q, k, v))
        q = self.rope(q)
        q, k, v = (u.transpose(1, 2) for u in (q, k, v))
        Y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(D // H))
        return self.W_o(Y.transpose(1, 2).reshape(B, T, D))


def swap_attention(model: GPT, cls) -> GPT:
    for blk in model.blks:
        blk.attn.__class__ = cls
    return model


class _ScaleGrad(torch.autograd.Function):
    """Identity forward (bit-exact), gradient times ``scale`` backward."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


class ScaledLookupGPT(GPT):
    """The embedding lookup's gradient scaled by ``lookup_grad_scale`` (0.5: halved; 0: dropped);
    the tied output projection's share of ``token_emb.weight.grad`` is untouched."""
    lookup_grad_scale = 0.5

    def embed_tokens(self, X):
        return _ScaleGrad.apply(super().embed_tokens(X), self.lookup_grad_scale)


def scaled_lookup(model: GPT, scale: float) -> GPT:
    model.__class__ = ScaledLookupGPT
    model.lookup_grad_scale = scale
    return model


def freeze_blocks(model: GPT) -> GPT:
    for p in model.blks.parameters():
        p.requires_grad_(False)
    return model


def adamw_skipping_norms(model: GPT, lr: float) -> torch.optim.Optimizer:
    """AdamW over every parameter but the LayerNorms' (a parameter group left out)."""
    return torch.optim.AdamW([p for n, p in model.named_parameters() if "norm" not in n], lr=lr)


class SilentFP32Step(TrainStep):
    """Labelled bf16, and its ``logits()`` side path does run under bf16 autocast, but the step
    that is timed runs its forward in fp32 (a copy of ``forward_backward`` that lost the
    autocast region). It keeps the receipt bookkeeping it copied along."""

    def forward_backward(self, X, Y):
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(X)                                      # no autocast: fp32
        loss = F.cross_entropy(logits.float().flatten(0, 1), Y.flatten())
        loss.backward()
        self._record_receipt(logits, loss)
        return loss.detach(), logits.detach()


class ReceiptlessFP32Step(SilentFP32Step):
    """The same bug, with the receipt bookkeeping dropped too."""

    def _record_receipt(self, logits, loss):
        pass
