"""Residual add fused with the LayerNorm after it; a one-pass LayerNorm backward.

In the pre-norm block every LayerNorm but the first reads the residual stream right after a
residual add: ``H = H + branch; y = LN(H)``. Here that is one kernel each way:

* ``add_layer_norm(H, branch, weight, bias, eps, out_dtype) -> (H_new, y)``: forward reads
  the stream and the branch once, writes the new stream (the stream's dtype: the sum is
  rounded to it before it is normalised, as the reference's add does) and the normalised
  ``y`` in ``out_dtype`` (under bf16 autocast the bf16 the next matmul casts to anyway);
  the fp32 row mean and 1/std are kept for the backward pass.
* backward, one pass over the rows: reads the new stream, ``dy`` and the gradient of the new
  stream, writes ``dH = dH_new + LN'(dy)`` (the stream's dtype) and the branch gradient (the
  branch's dtype: the same values), and per-program partial sums of ``dy * xhat`` and ``dy``,
  which a small sum turns into the weight and bias gradients.
* ``layer_norm(x, weight, bias, eps, out_dtype) -> y``: the same kernels without the add
  (the first LayerNorm of the model, whose input is the embedding).

Math: fp32 in registers, ``var = mean((x - mean)^2)``, ``rstd = 1 / sqrt(var + eps)``,
``y = (x - mean) * rstd * w + b`` -- torch's LayerNorm.
"""
from typing import Optional

import torch

from perfladder.torch.fused._launch import check_device, next_pow2, tl, triton

FWD_ROWS = 4           # rows per forward program
BWD_ROWS = 4           # rows per backward iteration
BWD_PROGRAMS = 1024    # backward programs: each loops over row blocks, keeping its dw/db partials


@triton.jit
def _ln_fwd_kernel(x_ptr, br_ptr, h_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
                   n_rows, D, eps,
                   HAS_BRANCH: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    rmask = rows < n_rows
    cmask = cols < D
    mask = rmask[:, None] & cmask[None, :]
    off = rows[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
    if HAS_BRANCH:
        x += tl.load(br_ptr + off, mask=mask, other=0.0).to(tl.float32)
        h = x.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + off, h, mask=mask)
        x = h.to(tl.float32)                      # normalise the stream as stored
    mean = tl.sum(x, axis=1) / D
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / D
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=rmask)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)


@triton.jit
def _ln_bwd_kernel(x_ptr, dy_ptr, dres_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dbr_ptr,
                   dw_part_ptr, db_part_ptr, n_rows, D, progs,
                   ITERS: tl.constexpr, HAS_BRANCH: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    # row blocks pid, pid + progs, ... (a compile-time trip count: the interpreter cannot
    # loop over a runtime scalar with numpy 2)
    for it in range(ITERS):
        rows = ((pid + it * progs) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        rmask = rows < n_rows
        mask = rmask[:, None] & cmask[None, :]
        off = rows[:, None] * D + cols[None, :]
        x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        wdy = dy * w[None, :]
        c1 = tl.sum(xhat * wdy, axis=1) / D
        c2 = tl.sum(wdy, axis=1) / D
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        if HAS_BRANCH:
            dx += tl.load(dres_ptr + off, mask=mask, other=0.0).to(tl.float32)
            tl.store(dbr_ptr + off, dx.to(dbr_ptr.dtype.element_ty), mask=mask)
        tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += tl.sum(dy * xhat, axis=0)
        db_acc += tl.sum(dy, axis=0)
    tl.store(dw_part_ptr + pid * D + cols, dw_acc, mask=cmask)
    tl.store(db_part_ptr + pid * D + cols, db_acc, mask=cmask)


def _rows(x: torch.Tensor) -> tuple[int, int]:
    D = x.shape[-1]
    return x.numel() // D, D


def _check(x, branch, weight, bias):
    if branch is not None and branch.shape != x.shape:
        raise ValueError(f"branch shape {tuple(branch.shape)} != stream shape {tuple(x.shape)}")
    D = x.shape[-1]
    if weight.shape != (D,) or bias.shape != (D,):
        raise ValueError(f"weight and bias must be ({D},), got {tuple(weight.shape)}, {tuple(bias.shape)}")


@torch.library.custom_op("perfladder::add_layer_norm_fwd", mutates_args=())
def add_layer_norm_fwd(x: torch.Tensor, branch: Optional[torch.Tensor], weight: torch.Tensor,
                       bias: torch.Tensor, eps: float, out_dtype: torch.dtype
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, y, mean, rstd); ``h`` is the new stream (an empty placeholder without a branch)."""
    _check(x, branch, weight, bias)
    check_device(_ln_fwd_kernel, x, weight, bias, *(() if branch is None else (branch,)))
    x = x.contiguous()
    n, D = _rows(x)
    has_branch = branch is not None
    h = torch.empty_like(x) if has_branch else x.new_empty(0)
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    mean = torch.empty(n, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n, dtype=torch.float32, device=x.device)
    br = branch.contiguous() if has_branch else x
    _ln_fwd_kernel[(triton.cdiv(n, FWD_ROWS),)](
        x, br, h if has_branch else x, weight, bias, y, mean, rstd, n, D, eps,
        HAS_BRANCH=has_branch, BLOCK_R=FWD_ROWS, BLOCK_D=next_pow2(D))
    return h, y, mean, rstd


@add_layer_norm_fwd.register_fake
def _(x, branch, weight, bias, eps, out_dtype):
    _check(x, branch, weight, bias)
    n, _ = _rows(x)
    h = torch.empty_like(x) if branch is not None else x.new_empty(0)
    return (h, torch.empty(x.shape, dtype=out_dtype, device=x.device),
            x.new_empty(n, dtype=torch.float32), x.new_empty(n, dtype=torch.float32))


@torch.library.custom_op("perfladder::add_layer_norm_bwd", mutates_args=())
def add_layer_norm_bwd(x: torch.Tensor, dy: torch.Tensor, dres: Optional[torch.Tensor],
                       weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                       branch_dtype: torch.dtype
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dbranch, dweight, dbias); ``x`` is the normalised stream (``h``, or the input
    without a branch); ``dbranch`` is an empty placeholder when ``dres`` is None (no branch)."""
    check_device(_ln_bwd_kernel, x, dy, weight, mean, rstd)
    x, dy = x.contiguous(), dy.contiguous()
    n, D = _rows(x)
    has_branch = dres is not None
    dres = dres.contiguous() if has_branch else dy
    dx = torch.empty_like(x)
    dbr = torch.empty(x.shape, dtype=branch_dtype, device=x.device) if has_branch else x.new_empty(0)
    n_blocks = triton.cdiv(n, BWD_ROWS)
    progs = max(1, min(BWD_PROGRAMS, n_blocks))
    dw_part = torch.empty(progs, D, dtype=torch.float32, device=x.device)
    db_part = torch.empty(progs, D, dtype=torch.float32, device=x.device)
    _ln_bwd_kernel[(progs,)](
        x, dy, dres, weight, mean, rstd, dx, dbr if has_branch else dx, dw_part, db_part, n, D,
        progs, ITERS=triton.cdiv(n_blocks, progs), HAS_BRANCH=has_branch, BLOCK_R=BWD_ROWS, BLOCK_D=next_pow2(D))
    return dx, dbr, dw_part.sum(0).to(weight.dtype), db_part.sum(0).to(weight.dtype)


@add_layer_norm_bwd.register_fake
def _(x, dy, dres, weight, mean, rstd, branch_dtype):
    dbr = (torch.empty(x.shape, dtype=branch_dtype, device=x.device) if dres is not None
           else x.new_empty(0))
    return torch.empty_like(x), dbr, torch.empty_like(weight), torch.empty_like(weight)


def _add_layer_norm_setup(ctx, inputs, output):
    x, branch, weight, _, _, _ = inputs
    h, _, mean, rstd = output
    ctx.has_branch = branch is not None
    ctx.branch_dtype = branch.dtype if ctx.has_branch else x.dtype
    # the backward normalises again from the stream the LayerNorm read: h, or x without a branch
    ctx.save_for_backward(h if ctx.has_branch else x, weight, mean, rstd)


def _add_layer_norm_backward(ctx, dh, dy, dmean, drstd):
    # mean and rstd are outputs only so that the backward can read them
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dbr, dw, db = add_layer_norm_bwd(x, dy, dh if ctx.has_branch else None, weight, mean, rstd,
                                         ctx.branch_dtype)
    return dx, (dbr if ctx.has_branch else None), dw, db, None, None


# registered on the operator (see fused/gelu.py): the compiled graph stays cacheable
add_layer_norm_fwd.register_autograd(_add_layer_norm_backward, setup_context=_add_layer_norm_setup)


def add_layer_norm(x: torch.Tensor, branch: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float, out_dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + branch`` (in ``x``'s dtype) and ``LayerNorm(h)`` in ``out_dtype`` (default
    ``x``'s), over the last axis, with fp32 statistics."""
    h, y, _, _ = add_layer_norm_fwd(x, branch, weight, bias, float(eps), out_dtype or x.dtype)
    return h, y


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``LayerNorm(x)`` over the last axis in ``out_dtype`` (default ``x``'s), fp32 statistics."""
    return add_layer_norm_fwd(x, None, weight, bias, float(eps), out_dtype or x.dtype)[1]
