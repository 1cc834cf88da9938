"""Training steps: one factory, a few switches (compile and its mode, bf16, the optimizer;
checkpointing and the embedding live in the model).

A step is ``zero_grad -> forward -> fp32 loss -> backward -> AdamW``; it returns the loss
as a device tensor (``.detach()``-ed, never read on the host inside the hot loop).
"""
from __future__ import annotations

import contextlib
import logging

import torch
import torch.nn.functional as F
from torch import nn

from perfladder.measure.evidence import dtype_name

# torch.compile modes a step may use (None: the default mode). The two that capture CUDA
# graphs need a CUDA device: on CPU inductor would skip the graphs and compile the default
# mode instead, which must not be measured under their name.
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
# AdamW implementations: PyTorch's default (foreach kernels on CUDA, a per-tensor loop on
# CPU), the fused kernel (``fused=True``), or the default one with its step torch.compile-d.
OPTIMIZERS = ("default", "fused", "compiled")
# The profiler range of a compiled optimizer step: ``perfladder.torch.kernels`` counts the
# kernels launched inside any ``Optimizer.step#...`` range as optimizer time.
COMPILED_OPT_RANGE = "Optimizer.step#AdamW.compiled"


def autocast(bf16: bool, device_type: str):
    """bf16 autocast on ``device_type`` ('cuda' or 'cpu'), or a no-op context when ``bf16`` is False."""
    if not bf16:
        return contextlib.nullcontext()
    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"device_type={device_type!r} is not valid for bf16 autocast; "
                         "valid choices: ('cuda', 'cpu')")
    return torch.autocast(device_type, dtype=torch.bfloat16)


def check_mode(mode, device_type: str | None = None):
    """A valid ``torch.compile`` mode; CUDA-graph modes only on a CUDA device."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"mode={mode!r} is not valid; valid choices: {COMPILE_MODES}")
    if mode in CUDAGRAPH_MODES and device_type is not None and device_type != "cuda":
        raise ValueError(f"mode={mode!r} captures CUDA graphs and needs a CUDA device, not "
                         f"{device_type!r}; on CPU it would silently compile the default mode")
    return mode


def compile_model(model: nn.Module, mode=None) -> nn.Module:
    """``torch.compile`` with static shapes: a new batch shape is a new, visible compile
    (which the timer's recompile guard turns into an error) rather than a silent switch
    to a slower dynamic-shape graph. ``mode``: one of ``COMPILE_MODES``."""
    check_mode(mode)
    return torch.compile(model, dynamic=False, mode=mode)


class TrainStep:
    """``step(X, Y) -> loss``: one optimizer step on ``model`` (a GPT, possibly DDP-wrapped).

    ``forward`` is the module actually called (the compiled wrapper when ``compiled``);
    ``logits(X)`` runs it under the step's precision. ``forward_backward(X, Y)`` is the step
    without its optimizer update (what the gates call), and every call records in ``receipt``
    the dtypes it computed in (``perfladder.torch.gates.check_receipt`` reads it).
    ``mode`` picks the ``torch.compile`` mode (``compiled`` only); ``compile_optimizer``
    wraps ``opt.step`` in ``torch.compile`` (PyTorch's "compiling the optimizer" recipe).
    """

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, *, compiled: bool = False,
                 bf16: bool = False, device_type: str | None = None, mode=None,
                 compile_optimizer: bool = False):
        self.model, self.opt = model, opt
        self.compiled, self.bf16 = bool(compiled), bool(bf16)
        self.device_type = device_type or next(model.parameters()).device.type
        autocast(self.bf16, self.device_type)          # validate the device type now
        check_mode(mode, self.device_type)
        if mode is not None and not self.compiled:
            raise ValueError(f"mode={mode!r} needs compiled=True (an eager step has no compile mode)")
        self.mode = mode
        self.cudagraphs = mode in CUDAGRAPH_MODES
        self.compile_optimizer = bool(compile_optimizer)
        self.vocab_size = getattr(model, "module", model).config.vocab_size
        self.forward = compile_model(model, mode) if compiled else model
        self.receipt: dict = {}          # what the last call computed in (``forward_backward``)
        self._opt_step = self._compiled_opt_step() if self.compile_optimizer else opt.step
        # what the timed call itself computed in (dtype reads cost no sync): the receipt
        self.receipt: dict[str, str] = {}

    def _compiled_opt_step(self):
        _quiet_ignored_range_warning()
        opt = self.opt

        @torch.compile(fullgraph=False)
        def opt_step():
            opt.step()

        def run():
            # dynamo drops the optimizer's own profiler range inside the compiled region;
            # this one, outside it, keeps the kernels attributable to the optimizer
            with torch.profiler.record_function(COMPILED_OPT_RANGE):
                opt_step()
        return run

    def logits(self, X: torch.Tensor) -> torch.Tensor:
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        with autocast(self.bf16, self.device_type):
            return self.forward(X)                                       # (B, T, V)

    def forward_backward(self, X: torch.Tensor, Y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The step up to (not including) the optimizer: zero the gradients, run the forward
        under the step's precision, the fp32 loss, the backward. Returns ``(loss, logits)``,
        both detached; the gradients are left in ``p.grad``. ``__call__`` runs exactly this and
        then the optimizer, so a gate that calls it checks the code that is timed.

        It records ``self.receipt`` on every call: the dtypes of what this call computed
        (reading ``.dtype`` is host metadata, no device sync)."""
        self.opt.zero_grad(set_to_none=True)
        logits = self.logits(X)                                          # (B, T, V), bf16 under autocast
        loss = F.cross_entropy(logits.float().reshape(-1, self.vocab_size),  # (B*T, V) in fp32
                               Y.reshape(-1))                            # (B*T,)
        loss.backward()
        self._record_receipt(logits, loss)
        return loss.detach(), logits.detach()

    def _record_receipt(self, logits: torch.Tensor, loss: torch.Tensor) -> None:
        # The logits come out of the tied output matmul, so under autocast their dtype is that
        # matmul's compute dtype; the first parameter's gradient dtype says the masters stayed fp32.
        grad = next(iter(self.model.parameters())).grad
        self.receipt = {"logits": dtype_name(logits.dtype), "loss": dtype_name(loss.dtype),
                        "grad": None if grad is None else dtype_name(grad.dtype),
                        "calls": self.receipt.get("calls", 0) + 1}

    def __call__(self, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        loss, _ = self.forward_backward(X, Y)
        self._opt_step()
        return loss

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in (("mode", self.mode),
                                                  ("compile_optimizer", self.compile_optimizer)) if v)
        return (f"TrainStep(compiled={self.compiled}, bf16={self.bf16}, "
                f"device_type={self.device_type!r}{extra})")


class _DropIgnoredRange(logging.Filter):
    def filter(self, record) -> bool:
        return not str(record.msg).startswith("Profiler record function")


def _quiet_ignored_range_warning() -> None:
    """Dynamo warns once that it drops ``Optimizer.step``'s profiler range inside the compiled
    optimizer; ``TrainStep`` opens its own range around the compiled call (``COMPILED_OPT_RANGE``),
    so that message is noise here. Only that one message is filtered."""
    log = logging.getLogger("torch._dynamo.variables.ctx_manager")
    if not any(isinstance(f, _DropIgnoredRange) for f in log.filters):
        log.addFilter(_DropIgnoredRange())


def make_optimizer(model: nn.Module, lr: float, kind: str = "default") -> torch.optim.Optimizer:
    """AdamW over ``model``'s parameters. ``kind`` 'fused' asks for the fused kernel; 'default'
    and 'compiled' build PyTorch's default implementation (the step decides whether to compile it)."""
    if kind not in OPTIMIZERS:
        raise ValueError(f"optimizer={kind!r} is not valid; valid choices: {OPTIMIZERS}")
    if kind == "fused":
        return torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    return torch.optim.AdamW(model.parameters(), lr=lr)


def make_step(model: nn.Module, opt: torch.optim.Optimizer, *, compiled: bool = False,
              bf16: bool = False, device_type: str | None = None, mode=None,
              compile_optimizer: bool = False) -> TrainStep:
    """The training step of a rung: eager or ``torch.compile``-d, fp32 or bf16 autocast."""
    return TrainStep(model, opt, compiled=compiled, bf16=bf16, device_type=device_type, mode=mode,
                     compile_optimizer=compile_optimizer)
