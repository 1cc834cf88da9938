"""The FFN with its elementwise work in cuBLASLt's GEMM epilogues, through nvmath-python.

Reference (``perfladder.torch.model.FFN``): ``y = dense2(gelu_tanh(dense1(x)))``. Compiled under
bf16 autocast that is, per layer, a cuBLAS GEMM writing ``h = x W1^T + b1`` (N x F, F = 4D), a
GELU kernel reading h and writing ``g``, and cuBLAS for FC2; backward: a GEMM writing
``dg = dy W2``, a GELU-backward kernel reading h and dg and writing ``dh``, a reduction of dh
for ``db1``, then the weight and input gradients. Here, with the GEMMs still cuBLAS's own:

* FC1 forward, ``fc1_gelu(x, W1, b1) -> (g, h)``: one cuBLASLt GEMM with the ``GELU_AUX_BIAS``
  epilogue adds the bias and writes ``g = gelu(h)`` as its result and the pre-activation h as
  its auxiliary output (the backward needs it): h is never read back for a GELU pass. FC2
  stays ``torch.addmm``.
* FC2's input gradient, ``fc2_dgelu(dy, W2, h) -> (dh, db1)``: one GEMM with the
  ``DGELU_BGRAD`` epilogue writes ``dh = (dy W2) * gelu'(h)`` and the bias gradient
  ``db1 = sum_rows(dh)``: dg never reaches memory and db1 needs no pass over dh. dx, dW1, dW2
  and db2 stay PyTorch's.

Bytes saved per layer at N tokens, bf16, as ``fused.mlp`` saves them: forward a read of h
(2NF), backward a write and a read of dg and the bias-gradient read of dh (6NF). Unlike
``fused.mlp`` the GEMMs are cuBLASLt's, not hand-written ones (on the H200, B13's Triton GEMM
ran at 232 TFLOP/s where cuBLAS runs these shapes at about 680).

Layout. cuBLASLt's epilogues are column-major: the bias runs along the result's rows (M), and
the auxiliary h and the bias gradient are column-major too. So both GEMMs compute the transposed
product, M = F, N = tokens, K = D: ``h^T = W1 x^T`` (a = W1, b = x^T, a view) and
``dg^T = W2^T dy^T`` (a = W2^T, b = dy^T, views). A column-major (F, N) result is the row-major
(N, F) tensor the model wants, so no copy is made; the auxiliary h is (F8, N), F rounded up to
a multiple of 8, and travels to the backward as the (N, F8) tensor ``h`` without being read.

The math is the reference's: fp32 accumulation; cuBLASLt's GELU is the tanh approximation (the
model's ``F.gelu(approximate='tanh')``; PyTorch's own fallback for its cuBLASLt GELU epilogue
applies ``gelu(approximate='tanh')`` for that reason); outputs, h and db1 in the operands' dtype
(bf16 under autocast, as the reference's are). Without autocast the operands stay fp32 and
nvmath's default compute type for them is true fp32, not TF32.

Why not ``torch._addmm_activation(b1, x, W1^T, use_gelu=True)``, PyTorch's own cuBLASLt
``GELU_BIAS`` epilogue: it has no derivative (autograd raises "derivative for
aten::_addmm_activation is not implemented"), it returns no pre-activation (a backward would have
to keep a second copy of h or recompute it), and on CPU it computes the exact erf GELU, not the
tanh one: a different function on each device.

Host overhead. An nvmath ``Matmul`` is stateful: constructing and planning it (cuBLASLt's
algorithm heuristics, layouts, descriptors, workspace) is host work a step must not repeat.
``Plans`` makes each plan once per (epilogue, operand shapes, strides, dtypes, device) -- two
per model and batch, shared by every layer -- and every later call only swaps the operands in
(``reset_operands_unchecked``: no validation, no logging), executes on PyTorch's current stream
(``blocking='auto'``: it returns as soon as the kernel is queued) and lets the operands go
(``release_operands``) so that the cache keeps no layer's activations alive. What is left per
call is that Python, queued while the GPU still runs earlier kernels, as every launch of a
compiled step is.

Like ``fused.mlp``, each piece is a ``torch.library.custom_op`` with its fake (shape)
implementation and its backward registered on the operator itself, so ``torch.compile`` keeps
each as one opaque node and inductor's and AOTAutograd's caches can keep the graph.

The matmul backend is ``nvmath.linalg.advanced`` (its ``Matmul`` and ``MatmulEpilog``), imported
on first use; without it a call raises one line naming the package and how to install it,
never falling back to the reference ops. ``use_backend(STAND_IN)`` runs the same code on
``StandInMatmul``, PyTorch ops that keep each epilogue's contract, so that the wiring is tested
on CPU; nothing selects it but that call.
"""
from __future__ import annotations

import contextlib
import enum
import logging
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from perfladder.torch.fused._ffn import check_operands, ffn_backward, ffn_setup, run_ffn

INSTALL = "pip install nvmath-python (or pip install 'perfladder[kernels]')"
# nvmath logs every plan and call at INFO to the logger it is given (the root logger by
# default): a notebook that turned INFO on would pay for formatting it on every call
LOGGER = logging.getLogger("perfladder.epilogue")
LOGGER.setLevel(logging.WARNING)


def nvmath_missing(what: str = "the cuBLASLt FFN epilogues (fused 'epilogue')") -> str | None:
    """One line saying why nvmath-python cannot be used here for ``what`` (None when it can be
    imported)."""
    try:
        import nvmath.linalg.advanced  # noqa: F401
    except ImportError as e:
        why = "is not installed" if getattr(e, "name", None) == "nvmath" else f"does not import ({e})"
        return f"{what} need nvmath-python, which {why} in this Python: {INSTALL}"
    return None


def aux_rows(m: int) -> int:
    """cuBLASLt's GELU auxiliary matrix has its M rounded up to a multiple of 8."""
    return -(-m // 8) * 8


class Plans:
    """Matmul objects of ``backend``, one per (epilogue, autotuning, operands' shapes, strides,
    dtypes, device), planned on first use (see the module docstring). ``planned`` counts the
    plans made, ``tuned`` those whose algorithm was then chosen by timing (``fused.gemm``)."""

    def __init__(self, backend):
        self.backend, self.plans, self.planned, self.tuned = backend, {}, 0, 0

    def run(self, epilog: str | None, a: torch.Tensor, b: torch.Tensor, inputs: dict,
            autotune: int = 0):
        """``epilog(a @ b)`` with its epilogue ``inputs``: ``(result, {aux name: tensor})`` for
        an epilogue with outputs, else the result (``epilog`` None: the plain product). The
        result is column-major when the epilogue asks for it, else in ``a``'s order (nvmath's
        rule). ``autotune`` > 0: a new plan's algorithms are timed that many times each and the
        fastest kept (``Matmul.autotune``), once per plan."""
        tensors = (a, b, *inputs.values())
        if getattr(self.backend, "CUDA_ONLY", True) and any(t.device.type != "cuda" for t in tensors):
            raise RuntimeError("nvmath's cuBLASLt GEMMs run on CUDA tensors; got tensors on "
                               f"{sorted({t.device.type for t in tensors})}")
        key = (epilog, autotune, *((n, tuple(t.shape), t.stride(), t.dtype, t.device)
                                   for n, t in (("a", a), ("b", b), *sorted(inputs.items()))))
        mm = self.plans.get(key)
        if mm is None:
            mm = self.backend.Matmul(a, b, options={"logger": LOGGER})
            mm.plan(epilog=None if epilog is None else getattr(self.backend.MatmulEpilog, epilog),
                    epilog_inputs=inputs or None)
            if autotune:
                mm.autotune(iterations=autotune)
                self.tuned += 1
            self.plans[key] = mm
            self.planned += 1
        else:
            mm.reset_operands_unchecked(a=a, b=b, epilog_inputs=inputs)
        try:
            return mm.execute()
        finally:
            mm.release_operands()


_NVMATH: list[Plans] = []           # nvmath's plans, made on first use
_INJECTED: list[Plans] = []         # use_backend's, innermost last


def plans() -> Plans:
    """The plans the operators run on: an injected backend's, else nvmath's (one line if missing)."""
    if _INJECTED:
        return _INJECTED[-1]
    if not _NVMATH:
        missing = nvmath_missing()
        if missing:
            raise ImportError(missing)
        import nvmath.linalg.advanced as advanced
        _NVMATH.append(Plans(advanced))
    return _NVMATH[0]


@contextlib.contextmanager
def use_backend(backend):
    """Within: the operators run on ``backend`` (``Matmul`` and ``MatmulEpilog`` as
    ``nvmath.linalg.advanced`` has them), with plans of their own; yields those ``Plans``."""
    _INJECTED.append(Plans(backend))
    try:
        yield _INJECTED[-1]
    finally:
        _INJECTED.pop()


# -- the contract, in PyTorch ops ---------------------------------------------------------------
class StandInEpilog(enum.Enum):
    GELU_AUX_BIAS = "GELU_AUX_BIAS"
    DGELU_BGRAD = "DGELU_BGRAD"
    BIAS = "BIAS"
    BGRADB = "BGRADB"


def _column_major(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


class StandInMatmul:
    """What this module asks of ``nvmath.linalg.advanced.Matmul``, computed by PyTorch ops:
    ``a`` (M, K) @ ``b`` (K, N) in fp32, then the epilogue, the result column-major in the
    operands' dtype.

    * ``GELU_AUX_BIAS``, input ``bias`` (M,): ``z = a @ b + bias[:, None]``; result ``gelu(z)``
      (tanh form, from fp32 z); aux ``gelu_aux``: z rounded, (M rounded up to 8, N) column-major
      (the padding rows are unspecified: NaN here);
    * ``DGELU_BGRAD``, input ``gelu_aux`` as above: result ``d = (a @ b) * gelu'(aux[:M])``; aux
      ``dgelu_bgrad`` (M,): d's row sums, from fp32 d;
    * ``BIAS``, input ``bias`` (M,): result ``a @ b + bias[:, None]``, no aux;
    * ``BGRADB``: result ``a @ b``; aux ``bgradb`` (N,): b's column sums (over K), from fp32;
    * no epilogue (``None``): result ``a @ b`` in ``a``'s order (row-major when ``a`` is), no aux.

    ``autotune`` only counts its calls (``tuned_iterations``): there are no algorithms to time.

    nvmath-python's own epilogue tests simulate the two the same way (the tanh GELU, the aux
    rows rounded up to 8 and read as ``aux[:M]``, the row sums)."""

    def __init__(self, a, b, options=None):
        self.a, self.b, self.inputs = a, b, {}

    def plan(self, *, epilog, epilog_inputs=None):
        self.epilog = None if epilog is None else StandInEpilog(epilog)
        self.inputs = dict(epilog_inputs or {})

    def autotune(self, iterations=10):
        self.tuned_iterations = iterations

    def reset_operands_unchecked(self, *, a=None, b=None, epilog_inputs=None):
        self.a, self.b = a if a is not None else self.a, b if b is not None else self.b
        self.inputs.update(epilog_inputs or {})

    def release_operands(self):
        self.a = self.b = None
        self.inputs = {}

    def execute(self):
        a, b, dt = self.a, self.b, self.a.dtype
        (M, K), N = a.shape, b.shape[1]
        if b.shape[0] != K:
            raise ValueError(f"operands of shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply")
        acc = a.float() @ b.float()                                          # (M, N) fp32
        if self.epilog is None:
            return acc.to(dt) if a.stride(1) == 1 else _column_major(acc.to(dt))
        if self.epilog is StandInEpilog.BGRADB:
            return _column_major(acc.to(dt)), {"bgradb": b.float().sum(0).to(dt)}
        if self.epilog is StandInEpilog.BIAS:
            return _column_major((acc + self.inputs["bias"].float()[:, None]).to(dt))
        if self.epilog is StandInEpilog.GELU_AUX_BIAS:
            bias = self.inputs["bias"]
            if tuple(bias.shape) != (M,):
                raise ValueError(f"bias of shape {tuple(bias.shape)}; expected {(M,)}")
            z = acc + bias.float()[:, None]
            aux = torch.full((N, aux_rows(M)), float("nan"), dtype=dt, device=a.device).t()
            aux[:M] = z
            return _column_major(F.gelu(z, approximate="tanh").to(dt)), {"gelu_aux": aux}
        aux = self.inputs["gelu_aux"]
        if tuple(aux.shape) != (aux_rows(M), N) or aux.dtype != dt or aux.stride(0) != 1:
            raise ValueError(f"gelu_aux of shape {tuple(aux.shape)}, strides {aux.stride()}, {aux.dtype}; "
                             f"expected ({aux_rows(M)}, {N}) column-major, {dt}")
        d = torch.ops.aten.gelu_backward(acc, aux[:M].float(), approximate="tanh")   # (M, N) fp32
        return _column_major(d.to(dt)), {"dgelu_bgrad": d.sum(1).to(dt)}


STAND_IN = SimpleNamespace(Matmul=StandInMatmul, MatmulEpilog=StandInEpilog, CUDA_ONLY=False)


# -- the operators --------------------------------------------------------------------------------
@torch.library.custom_op("perfladder::epilogue_fc1_gelu", mutates_args=())
def fc1_gelu(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (N, D), W1 (F, D), b1 (F,) -> (gelu(h) (N, F), h (N, F8)), in x's dtype."""
    check_operands(x, w1, "fc1_gelu", 1)
    g_t, aux = plans().run("GELU_AUX_BIAS", w1.contiguous(), x.contiguous().t(),
                           {"bias": b1.contiguous()})                          # (F, N) column-major
    return g_t.t().contiguous(), aux["gelu_aux"].t().contiguous()             # no copy: row-major already


@fc1_gelu.register_fake
def _(x, w1, b1):
    return x.new_empty(x.shape[0], w1.shape[0]), x.new_empty(x.shape[0], aux_rows(w1.shape[0]))


@torch.library.custom_op("perfladder::epilogue_fc2_dgelu", mutates_args=())
def fc2_dgelu(dy: torch.Tensor, w2: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dy (N, D), W2 (D, F), h (N, F8) from ``fc1_gelu`` -> (dh = (dy W2) * gelu'(h) (N, F),
    db1 (F,)), in dy's dtype."""
    check_operands(dy, w2, "fc2_dgelu", 0)
    (M, _), N = dy.shape, w2.shape[1]
    if tuple(h.shape) != (M, aux_rows(N)):
        raise ValueError(f"fc2_dgelu: h has shape {tuple(h.shape)}, expected {(M, aux_rows(N))}")
    dh_t, aux = plans().run("DGELU_BGRAD", w2.contiguous().t(), dy.contiguous().t(),
                            {"gelu_aux": h.contiguous().t()})                  # (F, N) column-major
    return dh_t.t().contiguous(), aux["dgelu_bgrad"].reshape(N)


@fc2_dgelu.register_fake
def _(dy, w2, h):
    return dy.new_empty(dy.shape[0], w2.shape[1]), dy.new_empty(w2.shape[1])


@torch.library.custom_op("perfladder::epilogue_ffn_fwd", mutates_args=())
def ffn_fwd(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
            b2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (N, D) -> (y (N, D), h (N, F8), g (N, F)): the FFN's output, and the pre-activation and
    activation its backward reads."""
    g, h = fc1_gelu(x, w1, b1)                                                # (N, F), (N, F8)
    return torch.addmm(b2, g, w2.t()), h, g                                   # (N, D)


@ffn_fwd.register_fake
def _(x, w1, b1, w2, b2):
    N, F_ = x.shape[0], w1.shape[0]
    return x.new_empty(N, w2.shape[0]), x.new_empty(N, aux_rows(F_)), x.new_empty(N, F_)


# the backward registered on the operator itself (not an autograd.Function around it), so a
# compiled graph holds only perfladder:: operators and AOTAutograd's cache can keep it
ffn_fwd.register_autograd(ffn_backward(fc2_dgelu), setup_context=ffn_setup)


def fused_ffn(x: torch.Tensor, dense1: torch.nn.Linear, dense2: torch.nn.Linear) -> torch.Tensor:
    """``dense2(gelu_tanh(dense1(x)))`` for x (..., D), through ``ffn_fwd`` (``fused._ffn.run_ffn``)."""
    return run_ffn(ffn_fwd, x, dense1, dense2)
