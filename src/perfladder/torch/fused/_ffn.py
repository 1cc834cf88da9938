"""What the two FFNs whose GEMMs carry GELU (``fused.mlp``: Triton; ``fused.epilogue``: cuBLASLt)
share around their operators: the forward operator returns ``(y, h, g)`` and its backward reads h
and g; FC2's input gradient, GELU's derivative and FC1's bias gradient come from one GEMM
(``fc2_dgelu``), the other gradients from plain ones; the operands are cast to the autocast
dtype before the operator, as autocast does for ``F.linear``."""
from __future__ import annotations

import torch


def check_operands(x, w, what: str, k_dim: int):
    """One line naming the shapes or dtypes when ``x`` (N, K) and ``w`` cannot be multiplied
    (``k_dim``: the weight's dimension of length K)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[k_dim]:
        raise ValueError(f"{what}: shapes {tuple(x.shape)} and {tuple(w.shape)} do not multiply")
    if x.dtype != w.dtype:
        raise ValueError(f"{what}: input dtype {x.dtype} != weight dtype {w.dtype} (cast both first)")


def ffn_setup(ctx, inputs, output):
    x, w1, _, w2, _ = inputs
    _, h, g = output
    ctx.save_for_backward(x, w1, w2, h, g)


def ffn_backward(fc2_dgelu):
    """The forward operator's backward, with ``fc2_dgelu(dy, w2, h) -> (dh, db1)``."""
    def backward(ctx, dy, dh_out, dg_out):
        # h and g are outputs only so that the backward can read them; nothing downstream uses them
        x, w1, w2, h, g = ctx.saved_tensors
        dy = dy.contiguous()
        dh, db1 = fc2_dgelu(dy, w2, h)                                    # (N, F), (F,)
        return (dh @ w1, dh.t() @ x, db1.to(w1.dtype),                    # dx, dW1, db1
                dy.t() @ g, dy.sum(0, dtype=torch.float32).to(w2.dtype))  # dW2, db2
    return backward


def run_ffn(ffn_fwd, x: torch.Tensor, dense1: torch.nn.Linear, dense2: torch.nn.Linear) -> torch.Tensor:
    """``dense2(gelu_tanh(dense1(x)))`` for x (..., D) through the operator ``ffn_fwd``. Under
    autocast the operands are cast to the autocast dtype first (the casts' backward brings the
    gradients back to the fp32 parameters) and the GEMMs run in it."""
    dev = x.device.type
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    lead, D = x.shape[:-1], x.shape[-1]
    # casts and the operator are not autocast ops: no autocast region is needed around them
    # (one would put an autocast node in the compiled graph, which AOTAutograd will not cache)
    ops = [t.to(dt) for t in (x.reshape(-1, D), dense1.weight, dense1.bias, dense2.weight, dense2.bias)]
    return ffn_fwd(*ops)[0].reshape(*lead, dense2.out_features)       # (..., D)
