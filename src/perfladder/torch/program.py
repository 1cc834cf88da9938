"""What a PyTorch step's program computes: the dtypes of its arithmetic, and its FLOPs.

The counterpart of ``perfladder.jax.program``, which reads the same things off the traced
jaxpr and the compiled HLO:

* ``MatmulDtypes`` -- a ``TorchDispatchMode`` that counts, op by op as the dispatcher runs
  them (after autocast has chosen each op's dtype), the operand dtypes of every matmul
  (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``, ...), of every attention
  kernel (any ``*attention*`` op, forward and backward: the operands its schema names as
  data, ``ATTENTION_DATA``, not its softmax statistics), and the input dtype of the loss's
  log-softmax;
* ``arithmetic(step, X, Y)`` -- those counts over one gated forward and backward of a
  ``TrainStep``: the step's own ``forward_backward`` (its ``loss_and_grads`` and
  ``autocast_bf16`` code, whatever the reader passed), with the compiled module swapped
  for the module it compiles;
* ``count_flops(gpt_config, T)`` / ``check_flops(...)`` -- matmul FLOPs per token of the
  plain model's forward and backward, counted by ``torch.utils.flop_counter.FlopCounterMode``
  on the meta device (shapes only, no arithmetic), against the formula the ladder reports
  MFU with.

Reading a compiled step's arithmetic. Three ways were weighed:

* the dispatch mode on the compiled call itself: dynamo refuses to run compiled code under
  a user dispatch mode, runs the frame's Python eagerly instead, and marks the code object
  (``GPT.forward``) *skip for every later call* -- measured on torch 2.13: every later rung
  would silently run eagerly while labelled compiled. Declaring the mode
  ``ignore_compile_internals`` avoids that, but then it sees only what runs outside the
  compiled graph: none of the matmuls;
* capturing the graph (``torch._dynamo`` / AOTAutograd / a custom backend): a second trace
  of the model per rung, which the GPU book's budget does not allow; reading inductor's
  generated code: it is not produced again on a compile-cache hit;
* chosen: the same step's own ``forward_backward`` run once with its compiled module swapped
  for the module it compiles (``TrainStep.uncompiled``): the same Python that dynamo traced,
  under the same autocast and matmul-precision state, so each matmul's dtypes are the ones
  the compiled graph was traced with. One eager forward and backward: no compile.

What it sees: every dtype decision made in Python and by autocast -- a forward computed in
fp32 and cast to bf16 at the end, a loss computed in bf16, an embedding lookup left to
autocast -- including a ``forward_backward`` overridden by a subclass. What it cannot see:
what inductor does inside the graph (it keeps each matmul's dtypes; it may compute
elementwise ops in fp32 internally, which is not a matmul), and a compile backend that
computes something other than the graph it traced; those are numerical differences, the
model gate's (which calls the compiled ``forward_backward`` itself).
"""
from __future__ import annotations

import collections
import functools

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from perfladder.measure.counts import check_flops as _check_flops

# operand positions of each matmul op: the two matrices (addmm / baddbmm: after the bias)
MATMUL_OPERANDS = {"mm": (0, 2), "bmm": (0, 2), "matmul": (0, 2), "linear": (0, 2), "mv": (0, 2),
                   "dot": (0, 2), "addmm": (1, 3), "baddbmm": (1, 3), "addmv": (1, 3),
                   "addbmm": (1, 3),
                   # fused 'gemm': every GEMM is one of our operators (``perfladder.torch.fused.gemm``)
                   "gemm_linear": (0, 2), "gemm_dgrad": (0, 2), "gemm_wgrad": (0, 2),
                   "gemm_wgrad_bgrad": (0, 2)}
# the data operands of an attention op, by the name its schema gives them: q, k, v, the output
# and the output's gradient (SDPA's kernels), the projection, output and its gradient (the
# fused kernel's ``perfladder::rope_attention_*``). Not data: the logsumexp every kernel keeps
# for its backward (fp32 by design, and 4-D in cuDNN's), RoPE tables, masks, RNG state.
ATTENTION_DATA = frozenset({"query", "key", "value", "out", "grad_out", "grad_out_",
                            "qkv", "y", "dy"})
UNNAMED = "no data operand"     # an attention op whose schema names none: the receipt fails
LOSS_OPS = ("_log_softmax", "log_softmax", "nll_loss_forward", "nll_loss2d_forward",
            "cross_entropy_loss")


def _dtypes(tensors) -> str:
    return "+".join(sorted({str(t.dtype).removeprefix("torch.") for t in tensors}))


def attention_data(func, args, kwargs) -> list:
    """The tensors ``func`` (an attention op) takes as ``ATTENTION_DATA``, read by name from its
    schema, whether passed by position or keyword."""
    names = [a.name for a in func._schema.arguments]
    given = dict(zip(names, args)) | dict(kwargs or {})
    return [t for n, t in given.items() if n in ATTENTION_DATA and isinstance(t, torch.Tensor)]


class MatmulDtypes(TorchDispatchMode):
    """Counts ``{dtype or 'a+b': n}`` of every matmul's operands (``matmuls``), every attention
    kernel's data operands (``attention``: ``attention_data``) and every loss op's input
    (``loss_ops``), plus the op names seen (``ops``), while it is active.

    ``ignore_compile_internals``: should a compiled module be called under it after all, dynamo
    runs the compiled graph (the mode then sees none of its ops, and the receipt fails for
    want of matmuls) instead of marking the frame skip-forever (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.matmuls: collections.Counter = collections.Counter()
        self.attention: collections.Counter = collections.Counter()
        self.loss_ops: collections.Counter = collections.Counter()
        self.ops: collections.Counter = collections.Counter()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in MATMUL_OPERANDS:
            lo, hi = MATMUL_OPERANDS[name]
            ops = [a for a in args[lo:hi] if isinstance(a, torch.Tensor)]
            self.matmuls[_dtypes(ops)] += 1
            self.ops[name] += 1
        elif "attention" in name:
            ops = attention_data(func, args, kwargs)
            self.attention[_dtypes(ops) if ops else UNNAMED] += 1
            self.ops[name] += 1
        elif name in LOSS_OPS:
            self.loss_ops[_dtypes(args[:1])] += 1
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def arithmetic(step, X, Y) -> dict:
    """What one forward and backward of ``step`` (a ``TrainStep``) computes in: the step's own
    ``forward_backward`` with its compiled module swapped for the one it compiles, under
    ``MatmulDtypes``. Returns the receipt entries ``matmul_operands``, ``attention_operands``,
    ``loss_ops`` and ``ops``; the gradients it leaves are cleared by the next step's call."""
    with step.uncompiled(), MatmulDtypes() as mode:
        step.forward_backward(X, Y)
    return {"matmul_operands": dict(mode.matmuls), "attention_operands": dict(mode.attention),
            "loss_ops": dict(mode.loss_ops), "ops": dict(mode.ops)}


# -- FLOPs ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def count_flops(gpt_config, seq_len: int) -> tuple[float, int]:
    """``(matmul FLOPs per token, parameters in no matmul)`` of the plain GPT's forward and
    backward at ``seq_len``, by ``FlopCounterMode`` on the meta device (one sequence; SDPA is
    counted without the causal half, as the formula does)."""
    from perfladder.torch.model import GPT
    with torch.device("meta"):
        model = GPT(gpt_config)
    model.to("meta")                       # the RoPE tables are built on the CPU
    X = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        logits = model(X)                                                # (1, T, V)
        F.cross_entropy(logits.float().flatten(0, 1), X.flatten()).backward()
    vector = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    return counter.get_total_flops() / seq_len, vector


def check_flops(gpt_config, seq_len: int, flops_per_token) -> dict:
    """``perfladder.measure.counts.check_flops`` of the formula ``flops_per_token(T)`` against
    ``count_flops`` at ``seq_len`` and ``seq_len // 2``."""
    (at_T, vector), (at_half, _) = count_flops(gpt_config, seq_len), count_flops(gpt_config, seq_len // 2)
    return _check_flops(vector_params=vector, seq_len=seq_len,
                        formula=(flops_per_token(seq_len), flops_per_token(seq_len // 2)),
                        counted=(at_T, at_half), counter="torch.utils.flop_counter.FlopCounterMode")
