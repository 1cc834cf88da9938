"""Training steps: one factory, four switches (compile, bf16, checkpoint lives in the model).

A step is ``zero_grad -> forward -> fp32 loss -> backward -> AdamW``; it returns the loss
as a device tensor (``.detach()``-ed, never read on the host inside the hot loop).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


def autocast(bf16: bool, device_type: str):
    """bf16 autocast on ``device_type`` ('cuda' or 'cpu'), or a no-op context when ``bf16`` is False."""
    if not bf16:
        return contextlib.nullcontext()
    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"device_type={device_type!r} is not valid for bf16 autocast; "
                         "valid choices: ('cuda', 'cpu')")
    return torch.autocast(device_type, dtype=torch.bfloat16)


def compile_model(model: nn.Module) -> nn.Module:
    """``torch.compile`` with static shapes: a new batch shape is a new, visible compile
    (which the timer's recompile guard turns into an error) rather than a silent switch
    to a slower dynamic-shape graph."""
    return torch.compile(model, dynamic=False)


class TrainStep:
    """``step(X, Y) -> loss``: one optimizer step on ``model`` (a GPT, possibly DDP-wrapped).

    ``forward`` is the module actually called (the compiled wrapper when ``compiled``);
    ``logits(X)`` runs it under the step's precision, for gates and receipts.
    """

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, *, compiled: bool = False,
                 bf16: bool = False, device_type: str | None = None):
        self.model, self.opt = model, opt
        self.compiled, self.bf16 = bool(compiled), bool(bf16)
        self.device_type = device_type or next(model.parameters()).device.type
        autocast(self.bf16, self.device_type)          # validate the device type now
        self.vocab_size = getattr(model, "module", model).config.vocab_size
        self.forward = compile_model(model) if compiled else model

    def logits(self, X: torch.Tensor) -> torch.Tensor:
        with autocast(self.bf16, self.device_type):
            return self.forward(X)                                       # (B, T, V)

    def __call__(self, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        logits = self.logits(X)                                          # (B, T, V), bf16 under autocast
        loss = F.cross_entropy(logits.float().reshape(-1, self.vocab_size),  # (B*T, V) in fp32
                               Y.reshape(-1))                            # (B*T,)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def __repr__(self) -> str:
        return (f"TrainStep(compiled={self.compiled}, bf16={self.bf16}, "
                f"device_type={self.device_type!r})")


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr)


def make_step(model: nn.Module, opt: torch.optim.Optimizer, *, compiled: bool = False,
              bf16: bool = False, device_type: str | None = None) -> TrainStep:
    """The training step of a rung: eager or ``torch.compile``-d, fp32 or bf16 autocast."""
    return TrainStep(model, opt, compiled=compiled, bf16=bf16, device_type=device_type)
