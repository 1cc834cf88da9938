"""The training step, and the seed rungs' techniques it is built from.

A step is ``zero_grad -> forward -> fp32 loss -> backward -> AdamW``; it returns the loss
as a device tensor (``.detach()``-ed, never read on the host inside the hot loop). The
techniques are plain functions, in the order the ladder applies them, and each is what its
rung's notebook cell shows (a test keeps the two the same):

    loss_and_grads     R0   the fp32 loss of the forward's logits, and its gradients
    compile_model      R1   torch.compile the model (and, through AOTAutograd, its backward)
    autocast_bf16      R2   the forward under bf16 autocast
    make_optimizer     B1   AdamW, fused or not
    compile_optimizer  B2   the optimizer step torch.compile-d

(R4's, ``checkpoint_block``, runs inside the model: ``perfladder.torch.model``.) ``build_step``
composes them from a ``Recipe``; ``CODE`` names them for ``TorchLab.use``, which lets a
notebook cell pass its own version of any of them.
"""
from __future__ import annotations

import contextlib
import logging
import time

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


# -- the techniques, in ladder order ---------------------------------------------------------
def loss_and_grads(forward, X, Y):
    """R0's step up to the optimizer: the fp32 loss of the forward's
    logits, and its gradients."""
    logits = forward(X)                                    # (B, T, V)
    rows = logits.float().flatten(0, 1)                    # (B*T, V) fp32
    loss = F.cross_entropy(rows, Y.flatten())
    loss.backward()                                        # into p.grad
    return loss.detach(), logits.detach()


def compile_model(model, mode=None):
    """R1: compile the forward; static shapes, so a new batch shape is
    a visible recompile."""
    return torch.compile(model, dynamic=False, mode=mode)


def autocast_bf16(forward, device_type):
    """R2: run the forward under bf16 autocast; the weights and the loss
    stay fp32."""
    def forward_bf16(X):
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return forward(X)                      # (B, T, V) in bf16
    return forward_bf16


def make_optimizer(model, lr, kind="default"):
    """AdamW over the model's parameters: B1's fused kernel, or the one
    PyTorch picks."""
    if kind not in OPTIMIZERS:
        raise ValueError(f"optimizer={kind!r} is not valid; "
                         f"valid choices: {OPTIMIZERS}")
    params = model.parameters()
    if kind == "fused":                          # one kernel per group
        return torch.optim.AdamW(params, lr=lr, fused=True)
    return torch.optim.AdamW(params, lr=lr)      # foreach on CUDA


def compile_optimizer(opt):
    """B2: the default AdamW with its step compiled, so inductor fuses
    the update."""
    @torch.compile(fullgraph=False)
    def opt_step():
        opt.step()
    return opt_step


CODE = {f.__name__: f for f in (loss_and_grads, compile_model, autocast_bf16, make_optimizer,
                                compile_optimizer)}


def check_mode(mode, device_type: str | None = None):
    """A valid ``torch.compile`` mode; CUDA-graph modes only on a CUDA device."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"mode={mode!r} is not valid; valid choices: {COMPILE_MODES}")
    if mode in CUDAGRAPH_MODES and device_type is not None and device_type != "cuda":
        raise ValueError(f"mode={mode!r} captures CUDA graphs and needs a CUDA device, not "
                         f"{device_type!r}; on CPU it would silently compile the default mode")
    return mode


class TrainStep:
    """``step(X, Y) -> loss``: one optimizer step on ``model`` (a GPT, possibly DDP-wrapped).

    Built from the seed techniques above (``code``: the functions to use, by name; default
    ``CODE``): ``compiled`` runs the model through ``compile_model`` (with ``mode``), ``bf16``
    the forward through ``autocast_bf16``, ``compile_optimizer`` the optimizer step through
    ``compile_optimizer``. ``forward`` is what is called for the logits;
    ``forward_backward(X, Y)`` is the step without its optimizer update (what the gates call,
    so a gate checks the code that is timed). Every call records in ``receipt`` the dtypes it
    computed in (dtype reads are host metadata: no sync), and the first call times itself
    (``first_call_s``: where a compiled step compiles, whoever makes that call).
    """

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, *, compiled: bool = False,
                 bf16: bool = False, device_type: str | None = None, mode=None,
                 compile_optimizer: bool = False, code: dict | None = None):
        code = {**CODE, **(code or {})}
        self.model, self.opt = model, opt
        self.compiled, self.bf16 = bool(compiled), bool(bf16)
        self.device_type = device_type or next(model.parameters()).device.type
        if self.bf16 and self.device_type not in ("cuda", "cpu"):
            raise ValueError(f"device_type={self.device_type!r} is not valid for bf16 autocast; "
                             "valid choices: ('cuda', 'cpu')")
        check_mode(mode, self.device_type)
        if mode is not None and not self.compiled:
            raise ValueError(f"mode={mode!r} needs compiled=True (an eager step has no compile mode)")
        self.mode = mode
        self.cudagraphs = mode in CUDAGRAPH_MODES
        self.compile_optimizer = bool(compile_optimizer)
        self._loss_and_grads = code["loss_and_grads"]
        forward = code["compile_model"](model, mode) if compiled else model
        self.forward = code["autocast_bf16"](forward, self.device_type) if bf16 else forward
        # the same forward around the module that is compiled: what ``uncompiled`` runs
        self._eager_forward = (code["autocast_bf16"](model, self.device_type) if bf16 else model
                               ) if compiled else self.forward
        self._opt_step = self._timed_range(code["compile_optimizer"](opt)) if compile_optimizer else opt.step
        self.receipt: dict = {}             # what the last call computed in
        self.first_call_s: dict[str, float] = {}   # the first forward+backward, the first update

    @staticmethod
    def _timed_range(opt_step):
        _quiet_ignored_range_warning()

        def run():
            # dynamo drops the optimizer's own profiler range inside the compiled region;
            # this one, outside it, keeps the kernels attributable to the optimizer
            with torch.profiler.record_function(COMPILED_OPT_RANGE):
                opt_step()
        return run

    def logits(self, X: torch.Tensor) -> torch.Tensor:
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        return self.forward(X)                                           # (B, T, V)

    def forward_backward(self, X: torch.Tensor, Y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The step up to (not including) the optimizer: zero the gradients, the forward under
        the step's precision, the fp32 loss, the backward. Returns ``(loss, logits)``, both
        detached; the gradients are left in ``p.grad``. ``__call__`` runs exactly this and then
        the optimizer."""
        self.opt.zero_grad(set_to_none=True)
        with self._first("forward_backward"):
            loss, logits = self._loss_and_grads(self.logits, X, Y)
        self._record_receipt(logits, loss)
        return loss, logits

    def _record_receipt(self, logits: torch.Tensor, loss: torch.Tensor) -> None:
        # the logits come out of the tied output matmul (under autocast: its compute dtype);
        # the first parameter's gradient dtype says the masters stayed fp32
        grad = next(iter(self.model.parameters())).grad
        self.receipt = {"logits": dtype_name(logits.dtype), "loss": dtype_name(loss.dtype),
                        "grad": None if grad is None else dtype_name(grad.dtype),
                        "calls": self.receipt.get("calls", 0) + 1}

    @contextlib.contextmanager
    def uncompiled(self):
        """Inside the block the step's forward runs the module its ``compile_model`` compiled,
        eagerly, through the same ``autocast_bf16`` (an eager step is unchanged): how
        ``perfladder.torch.program.arithmetic`` reads what a compiled step computes in."""
        compiled = self.forward
        self.forward = self._eager_forward
        try:
            yield self
        finally:
            self.forward = compiled

    def __call__(self, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        loss, _ = self.forward_backward(X, Y)
        with self._first("optimizer"):
            self._opt_step()
        return loss

    @contextlib.contextmanager
    def _first(self, what: str):
        """Time ``what`` the first time it runs, between device syncs (only then: the timed
        windows never see these syncs)."""
        if what in self.first_call_s:
            yield
            return
        sync = torch.cuda.synchronize if self.device_type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        yield
        sync()
        self.first_call_s[what] = time.perf_counter() - t0

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


def make_step(model: nn.Module, opt: torch.optim.Optimizer, *, compiled: bool = False,
              bf16: bool = False, device_type: str | None = None, mode=None,
              compile_optimizer: bool = False, code: dict | None = None) -> TrainStep:
    """The training step of a rung: eager or ``torch.compile``-d, fp32 or bf16 autocast."""
    return TrainStep(model, opt, compiled=compiled, bf16=bf16, device_type=device_type, mode=mode,
                     compile_optimizer=compile_optimizer, code=code)
