"""The model's GEMMs through cuBLASLt plans whose algorithm was chosen by timing (nvmath-python).

PyTorch's ``F.linear`` and ``mm`` take cuBLAS's first heuristic choice of algorithm for every
shape. Here each GEMM shape of the step -- forward, input gradient and weight gradient of every
linear layer and of the tied LM head -- gets one nvmath ``Matmul`` planned once and autotuned
once (``Matmul.autotune``: each candidate algorithm timed ``AUTOTUNE_ITERATIONS`` times, the
fastest kept), through ``fused.epilogue``'s ``Plans`` (made once per shape, operands swapped in
on every later call, nothing validated or logged per call). With ``bgrad=True`` the weight
gradient's GEMM also writes the bias gradient in its epilogue (cuBLASLt's ``BGRADB``), so the
output gradient is not read a second time by a separate reduction.

For ``y = x W^T + b`` with x (N, K), W (O, K), the operands are arranged so that every result is
the row-major tensor the model wants, with no copy (nvmath's result is column-major when the
epilogue asks for it, else in operand a's order):

| GEMM            | computed as              | a, b                   | epilogue        | result       |
|-----------------|--------------------------|------------------------|-----------------|--------------|
| forward, bias   | y^T = W x^T   (O, N)      | W, x^T (a view)        | BIAS (along O)  | column-major |
| forward, none   | y = x W^T     (N, O)      | x, W^T (a view)        | --              | row-major    |
| input gradient  | dx = dy W     (N, K)      | dy, W                  | --              | row-major    |
| weight gradient | dW^T = x^T dy (K, O)      | x^T (a view), dy       | BGRADB: db (O,) | column-major |

Each GEMM is a ``torch.library.custom_op`` with a fake (shape) implementation, and the linear's
backward is registered on its forward operator (``register_autograd``), as in ``fused.epilogue``:
the compiled graph holds only ``perfladder::`` operators, AOTAutograd's cache can keep it, and
CUDA graphs capture the kernels (plans, and their autotuning, are made on a step's first calls,
which cudagraph trees run before they capture). Under autocast the operands are cast to the
autocast dtype first, as autocast does for ``F.linear``; the math is fp32 accumulation, the
result in the operands' dtype (nvmath's default compute type: true fp32 for fp32 operands).

``routed_linear(model)`` applies the model option (``GPT(fused=("gemm",))`` or ``"gemm_bgrad"``):
every ``nn.Linear`` of the model runs through ``linear`` (its parameters and their names
unchanged) and it returns the LM head's ``linear``. Without nvmath a call raises one line
naming the package; ``fused.epilogue.use_backend(STAND_IN)`` runs the same code on PyTorch ops.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from perfladder.torch.fused._ffn import check_operands
from perfladder.torch.fused.epilogue import plans

AUTOTUNE_ITERATIONS = 10      # timings of each candidate algorithm, once per plan
GEMM_OPTIONS = ("gemm", "gemm_bgrad")


def _run(epilog, a, b, inputs=None):
    return plans().run(epilog, a, b, inputs or {}, autotune=AUTOTUNE_ITERATIONS)


@contextlib.contextmanager
def autotuning(iterations: int):
    """Within: plans made from here on are autotuned with ``iterations`` timings of each
    candidate algorithm (0: cuBLASLt's heuristic first choice is kept, as PyTorch's cuBLAS call
    keeps it); ``benchmarks/gemm_algorithms_torch.py`` times both."""
    global AUTOTUNE_ITERATIONS
    before, AUTOTUNE_ITERATIONS = AUTOTUNE_ITERATIONS, int(iterations)
    try:
        yield
    finally:
        AUTOTUNE_ITERATIONS = before


@torch.library.custom_op("perfladder::gemm_linear", mutates_args=())
def linear_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, bgrad: bool) -> torch.Tensor:
    """x (N, K), W (O, K), b (O,) or None -> ``x W^T + b`` (N, O), row-major, in x's dtype.
    ``bgrad``: only the backward reads it (the bias gradient in the weight gradient's GEMM)."""
    check_operands(x, w, "gemm_linear", 1)
    x, w = x.contiguous(), w.contiguous()
    if b is None:
        return _run(None, x, w.t())                                   # (N, O) row-major
    return _run("BIAS", w, x.t(), {"bias": b.contiguous()}).t()       # (O, N) column-major -> (N, O)


@linear_fwd.register_fake
def _(x, w, b, bgrad):
    return x.new_empty(x.shape[0], w.shape[0])


@torch.library.custom_op("perfladder::gemm_dgrad", mutates_args=())
def dgrad(dy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """dy (N, O), W (O, K) -> dx = dy W (N, K), row-major."""
    check_operands(dy, w, "gemm_dgrad", 0)
    return _run(None, dy.contiguous(), w.contiguous())


@dgrad.register_fake
def _(dy, w):
    return dy.new_empty(dy.shape[0], w.shape[1])


@torch.library.custom_op("perfladder::gemm_wgrad", mutates_args=())
def wgrad(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dy (N, O), x (N, K) -> dW = dy^T x (O, K), row-major."""
    check_operands(dy.t(), x, "gemm_wgrad", 0)
    return _run(None, x.contiguous().t(), dy.contiguous()).t()        # (K, O) column-major -> (O, K)


@wgrad.register_fake
def _(dy, x):
    return dy.new_empty(dy.shape[1], x.shape[1])


@torch.library.custom_op("perfladder::gemm_wgrad_bgrad", mutates_args=())
def wgrad_bgrad(dy: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dy (N, O), x (N, K) -> (dW = dy^T x (O, K), db = dy's column sums (O,)), from one GEMM."""
    check_operands(dy.t(), x, "gemm_wgrad_bgrad", 0)
    dw_t, aux = _run("BGRADB", x.contiguous().t(), dy.contiguous())
    return dw_t.t(), aux["bgradb"].reshape(dy.shape[1])


@wgrad_bgrad.register_fake
def _(dy, x):
    return dy.new_empty(dy.shape[1], x.shape[1]), dy.new_empty(dy.shape[1])


def _setup(ctx, inputs, output):
    x, w, b, bgrad = inputs
    ctx.has_bias, ctx.bgrad = b is not None, bgrad
    ctx.save_for_backward(x, w)


def _backward(ctx, dy):
    x, w = ctx.saved_tensors
    dy = dy.contiguous()
    db = None
    if ctx.has_bias and ctx.bgrad:
        dw, db = wgrad_bgrad(dy, x)
    else:
        dw = wgrad(dy, x)
        if ctx.has_bias:
            db = dy.sum(0, dtype=torch.float32).to(dy.dtype)
    return dgrad(dy, w), dw, db, None


linear_fwd.register_autograd(_backward, setup_context=_setup)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           bgrad: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x (..., K) through the tuned plans. Under autocast the
    operands are cast to the autocast dtype first (their casts' backward brings the gradients
    back to the fp32 parameters), as ``fused._ffn.run_ffn`` does."""
    dev = x.device.type
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    lead, K = x.shape[:-1], x.shape[-1]
    b = None if bias is None else bias.to(dt)
    return linear_fwd(x.reshape(-1, K).to(dt), weight.to(dt), b, bgrad).reshape(*lead, weight.shape[0])


class TunedLinear(nn.Linear):
    """An ``nn.Linear`` whose forward runs through ``linear`` (the same parameters and names)."""
    bgrad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.bgrad)


class TunedLinearBgrad(TunedLinear):
    """``TunedLinear`` with the bias gradient in the weight gradient's GEMM."""
    bgrad = True


def routed_linear(model: nn.Module):
    """The LM head's linear for ``model`` by its ``fused`` options: ``F.linear``, or with
    'gemm' / 'gemm_bgrad' ``linear``, after every ``nn.Linear`` in it became a ``TunedLinear``
    (``TunedLinearBgrad``)."""
    option = next((o for o in GEMM_OPTIONS if o in model.fused), None)
    if option is None:
        return torch.nn.functional.linear
    cls = TunedLinearBgrad if option == "gemm_bgrad" else TunedLinear
    for m in model.modules():
        if type(m) is nn.Linear:
            m.__class__ = cls
    return linear
