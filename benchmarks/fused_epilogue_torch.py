"""The PyTorch FFN-epilogue part of ``benchmarks/fused_kernels.py`` (see there): the FFN with
GELU in cuBLASLt's epilogues (rung B15) against the compiled reference FFN."""
from __future__ import annotations

import contextlib

from fused_kernels import kernel_row, median_ms


def ffn_epilogue_row(g, dev, B: int, T: int, cc, sync, reps: int) -> dict:
    """The FFN of ``fused.epilogue`` against the reference ``FFN``, each compiled, at the
    model's width, bf16 under autocast, a bf16 input (B14's stream): forward = FC1 + bias + GELU
    alone (the reference's GEMM and GELU kernel; the GELU_AUX_BIAS GEMM), forward + backward =
    the whole FFN, and FC2's input gradient alone (the reference's GEMM, GELU-backward kernel
    and bias-gradient reduction; the DGELU_BGRAD GEMM). On CPU (``--smoke``) the epilogues run
    on PyTorch ops standing in for cuBLASLt (``backend`` says which): not a measurement."""
    import torch
    import torch.nn.functional as F

    from perfladder.torch.fused import epilogue as ep
    from perfladder.torch.model import FFN

    cuda = dev.type == "cuda"
    N, D, Fw, bf = B * T, g.num_hiddens, g.ffn_mult * g.num_hiddens, torch.bfloat16
    torch.manual_seed(0)
    ref = FFN(g).to(dev)
    epi = FFN(g, epilogue=True).to(dev)
    epi.load_state_dict(ref.state_dict())
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(B, T, D, device=dev, dtype=bf, generator=gen).requires_grad_()
    dy = torch.randn(B, T, D, device=dev, dtype=bf, generator=gen)
    w1, b1, w2 = (t.detach().to(bf) for t in (ref.dense1.weight, ref.dense1.bias, ref.dense2.weight))
    h = F.linear(x.detach(), w1, b1)                                   # (B, T, F) bf16
    ref_fc1 = cc(lambda x: F.gelu(F.linear(x, w1, b1), approximate="tanh"))

    def dgelu(dy, h):                                                  # dh and db1, as autograd does
        dh = torch.ops.aten.gelu_backward(dy @ w2, h, approximate="tanh")
        return dh, dh.sum((0, 1))
    ref_dgrad = cc(dgelu)

    def fwd_bwd(module):
        fn = cc(module)

        def run():
            with torch.autocast(dev.type, dtype=bf):
                y = fn(x)
            return torch.autograd.grad(y, [x, *module.parameters()], dy)
        return run
    with contextlib.ExitStack() as stack:
        backend = "nvmath (cuBLASLt)"
        if not cuda:
            stack.enter_context(ep.use_backend(ep.STAND_IN))
            backend = "stand-in: PyTorch ops on CPU, not cuBLASLt"
        x2, dy2 = x.detach().reshape(N, D), dy.reshape(N, D)          # (N, D): the operators' inputs
        h2 = ep.fc1_gelu(x2, w1, b1)[1]                                 # (N, F8): cuBLASLt's aux h
        row = kernel_row(lambda: ref_fc1(x.detach()), fwd_bwd(ref), lambda: ep.fc1_gelu(x2, w1, b1),
                         fwd_bwd(epi), sync, reps, nbytes=4 * N * Fw * 2)   # h, g written; h read, dh written
        row.update(ref_dgrad_ms=median_ms(lambda: ref_dgrad(dy, h), sync, reps),
                   fused_dgrad_ms=median_ms(lambda: ep.fc2_dgelu(dy2, w2, h2), sync, reps),
                   gemm_tflop=2 * N * D * Fw / 1e12, backend=backend)
    row["fused_fwd_tflops"] = row["gemm_tflop"] / (row["fused_fwd_ms"] / 1e3)
    row["fused_dgrad_tflops"] = row["gemm_tflop"] / (row["fused_dgrad_ms"] / 1e3)
    return row


# -- jax --------------------------------------------------------------------------------------
