"""Fused Triton kernels for the memory-bound half of a training step, each behind a model option.

    GPT(config, fused=("rope", "addnorm"))      # default: fused=() -- the reference ops

| option     | module                 | replaces                                              |
|------------|------------------------|-------------------------------------------------------|
| 'rope'     | ``fused.rope``         | RoPE on q and k (and the QKV split's backward concat) |
| 'addnorm'  | ``fused.add_layer_norm``| residual add + LayerNorm, forward and backward       |
| 'gelu'     | ``fused.gelu``         | tanh GELU and its derivative                          |
| 'attention'| ``fused.attention``    | QKV split + RoPE + causal SDPA + output merge, forward and backward (subsumes 'rope') |
| 'mlp'      | ``fused.mlp``          | FC1 + bias + GELU in one GEMM, FC2's input gradient + dGELU + db1 in one (subsumes 'gelu') |
| 'epilogue' | ``fused.epilogue``     | the same as 'mlp' in cuBLASLt's GEMM epilogues, through nvmath-python (not Triton) |
| 'gemm'     | ``fused.gemm``         | every ``nn.Linear`` and the LM head: cuBLASLt plans autotuned once per shape (nvmath-python) |
| 'gemm_bgrad'| ``fused.gemm``        | 'gemm' with each bias gradient in its weight gradient's GEMM epilogue (subsumes 'gemm') |

Each is a ``torch.library.custom_op`` operator (``perfladder::...``) with a fake (shape)
implementation and its backward registered on it (``register_autograd``, itself calling a
backward operator), launching Triton kernels. ``torch.compile`` (dynamo + AOTAutograd +
inductor) treats each kernel as one opaque node, CUDA graphs capture it like any other kernel,
and the compiled graph holds nothing but operators, so inductor's FX graph cache and
AOTAutograd's cache can keep it (an ``autograd.Function`` around the kernels would make
AOTAutograd bypass its cache). The math is the reference's: fp32 inside the
kernel, the reference's output dtypes; tests compare both, forward and backward.

The kernels run on CUDA tensors; on CPU only through Triton's interpreter
(``TRITON_INTERPRET=1`` set before triton is imported), which the tests use. Anything else
is a clear error, never a silent fallback to the reference ops. 'epilogue' launches cuBLASLt's
kernels through nvmath-python instead of Triton's; on CPU the tests run its operators on
PyTorch ops that keep the epilogues' contract (``fused.epilogue.use_backend``).
"""
from __future__ import annotations

from perfladder.checks import check_options

FUSED = ("rope", "addnorm", "gelu", "attention", "mlp", "epilogue", "gemm", "gemm_bgrad")
NOT_TRITON = ("epilogue", "gemm", "gemm_bgrad")     # options whose kernels are a library's (cuBLASLt), not Triton's
# pairs that cannot be combined, and why
EXCLUSIVE = {("rope", "attention"): "fused 'attention' rotates q and k itself (it subsumes 'rope'); "
                                    "use one of them",
             ("gelu", "mlp"): "fused 'mlp' computes GELU in its GEMMs (it subsumes 'gelu'); use one of them",
             ("gelu", "epilogue"): "fused 'epilogue' computes GELU in cuBLASLt's GEMMs (it subsumes 'gelu'); "
                                   "use one of them",
             ("mlp", "epilogue"): "fused 'mlp' and 'epilogue' both put GELU in the FFN's GEMMs (Triton's or "
                                  "cuBLASLt's); use one of them",
             ("gemm", "gemm_bgrad"): "fused 'gemm_bgrad' is 'gemm' with the bias gradients in the GEMMs' "
                                     "epilogues (it subsumes 'gemm'); use one of them"}


def check_fused(fused) -> tuple[str, ...]:
    """``fused`` as a tuple of known option names; a clear error for anything else."""
    names = check_options("fused", fused, FUSED)
    for pair, why in EXCLUSIVE.items():
        if set(pair) <= set(names):
            raise ValueError(f"fused={names!r}: {why}")
    return names
