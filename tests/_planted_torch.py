"""Planted bugs for the PyTorch gates: each breaks the model (or its training) in one way that
a rung could plausibly introduce, while looking right from the outside. Used by
tests/test_planted_torch.py; nothing here is imported by the library."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from perfladder.torch.model import FFN, GPT, Block, CausalAttention
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


# -- Gates II: the arithmetic, the precision a check runs in, scale errors, the optimizer --------
def autocast_then_fp32(forward, device_type):
    """An ``autocast_bf16`` that computes the forward in fp32 and casts the logits to bf16 at
    the end: the logits say bf16, every matmul ran fp32."""
    def forward_bf16(X):
        with torch.autocast(device_type, enabled=False):
            return forward(X).to(torch.bfloat16)
    return forward_bf16


def bf16_loss_and_grads(forward, X, Y):
    """``loss_and_grads`` with the cross entropy left in bf16 (no ``.float()``), returned as fp32."""
    logits = forward(X)
    loss = F.cross_entropy(logits.flatten(0, 1), Y.flatten())
    loss.backward()
    return loss.detach().float(), logits.detach()


class _GeluOff(torch.autograd.Function):
    """tanh GELU whose derivative is ``factor`` times the true one (a fused kernel's backward)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.save_for_backward(x)
        ctx.factor = factor
        return F.gelu(x, approximate="tanh")

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        with torch.enable_grad():
            xx = x.detach().requires_grad_()
            d, = torch.autograd.grad(F.gelu(xx, approximate="tanh"), xx, g)
        return d * ctx.factor, None


class GeluDerivativeOffFFN(FFN):
    factor = 1.05

    def forward(self, X):
        return self.dense2(_GeluOff.apply(self.dense1(X), self.factor))


def gelu_derivative_off(model: GPT, factor: float = 1.05) -> GPT:
    for blk in model.blks:
        blk.ffn.__class__ = GeluDerivativeOffFFN
        blk.ffn.factor = factor
    return model


class DroppedResidualBlock(Block):
    """The attention branch's output never reaches the stream (what a fused add+LayerNorm that
    returns its input instead of the sum does): the FFN still sees norm2(H + attn)."""

    def forward(self, H):
        H2 = H + self.attn(self.norm1(H))
        return H + self.ffn(self.norm2(H2))


def drop_residual(model: GPT) -> GPT:
    for blk in model.blks:
        blk.__class__ = DroppedResidualBlock
    return model


class WrongScaleAttention(CausalAttention):
    """Attention scaled by 1/Dh instead of 1/sqrt(Dh) (one backend's bug)."""

    def forward(self, X):
        B, T, D = X.shape
        H = self.num_heads
        q, k, v = self.W_qkv(X).split(D, dim=-1)
        q, k, v = (u.reshape(B, T, H, D // H) for u in (q, k, v))
        q, k = self.rope(q), self.rope(k)
        q, k, v = (u.transpose(1, 2) for u in (q, k, v))
        Y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / (D // H))
        return self.W_o(Y.transpose(1, 2).reshape(B, T, D))


def with_attention(model: GPT, cls):
    """``model``'s forward with its attention class swapped for the call only (the same
    parameters: what a compiled graph of another backend computes from them)."""
    def forward(X):
        before = [blk.attn.__class__ for blk in model.blks]
        swap_attention(model, cls)
        try:
            return model(X)
        finally:
            for blk, c in zip(model.blks, before):
                blk.attn.__class__ = c
    return forward


def onehot_left_to_autocast(model: GPT) -> GPT:
    """The one-hot lookup without its ``autocast(enabled=False)``: inside a bf16 step the table
    is rounded to bf16 (exact in fp32, so a check with autocast off cannot see it)."""
    class OneHotBF16(type(model)):
        def embed_tokens(self, X):
            W = self.token_emb.weight
            return F.one_hot(X, W.shape[0]).to(W.dtype) @ W
    model.__class__ = OneHotBF16
    return model


def checkpoint_in_fp32(block, *inputs):
    """A ``checkpoint_block`` that runs the block with autocast off: exact in fp32 (the old
    mirror check), another model inside a bf16 step."""
    from torch.utils.checkpoint import checkpoint

    def fp32_block(*xs):
        with torch.autocast(xs[0].device.type, enabled=False):
            return block(*(x.float() for x in xs))
    return checkpoint(fp32_block, *inputs, use_reentrant=False)


def adamw_other_beta1(model: GPT, lr: float) -> torch.optim.Optimizer:
    """AdamW with beta1 = 0.8: after one step Adam's bias correction makes it the default's."""
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.8, 0.999))
