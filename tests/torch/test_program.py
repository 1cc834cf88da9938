"""perfladder.torch.program: the dispatch mode behind the PyTorch receipt reads each attention
op's data operands by the names its schema gives them, whatever else the op takes."""
from __future__ import annotations

import pytest
import torch

from perfladder.measure.gates import ReceiptError, check_receipt
from perfladder.torch.program import UNNAMED, MatmulDtypes

# Two ops shaped like cuDNN's SDPA backward (its logsumexp is 4-D fp32, (B, H, T, 1)) and like
# an attention op whose schema names no data operand.
_lib = torch.library.Library("perfladder_test_program", "DEF")
_lib.define("fake_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
            "Tensor out, Tensor logsumexp) -> Tensor")
_lib.define("opaque_attention(Tensor a, Tensor b) -> Tensor")
_lib.impl("fake_attention_backward", lambda g, q, k, v, o, lse: q.clone(), "CPU")
_lib.impl("opaque_attention", lambda a, b: a.clone(), "CPU")


def _bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def test_softmax_statistics_are_not_data():
    B, H, T, E = 2, 2, 8, 4
    q, k, v, o, g = (_bf16(B, H, T, E) for _ in range(5))
    lse = torch.randn(B, H, T, 1)                                  # fp32, 4-D as cuDNN's
    with MatmulDtypes() as mode:
        torch.ops.perfladder_test_program.fake_attention_backward(g, q, k, v, o, lse)
    assert dict(mode.attention) == {"bfloat16": 1}
    receipt = {"logits": "bfloat16", "attention_operands": dict(mode.attention)}
    assert check_receipt(receipt, "bf16") is receipt


def test_fp32_data_in_a_bf16_step_is_seen():
    B, H, T, E = 2, 2, 8, 4
    q = torch.randn(B, H, T, E)                                    # one data operand in fp32
    k, v, o, g = (_bf16(B, H, T, E) for _ in range(4))
    with MatmulDtypes() as mode:
        torch.ops.perfladder_test_program.fake_attention_backward(g, q, k, v, o, torch.randn(B, H, T, 1))
    assert dict(mode.attention) == {"bfloat16+float32": 1}
    with pytest.raises(ReceiptError, match="attention_operands"):
        check_receipt({"logits": "bfloat16", "attention_operands": dict(mode.attention)}, "bf16")


def test_an_attention_op_with_no_named_data_fails_the_receipt():
    with MatmulDtypes() as mode:
        torch.ops.perfladder_test_program.opaque_attention(_bf16(2, 3), _bf16(2, 3))
    assert dict(mode.attention) == {UNNAMED: 1}
    with pytest.raises(ReceiptError, match="no data operand"):
        check_receipt({"logits": "bfloat16", "attention_operands": dict(mode.attention)}, "bf16")


def test_sdpa_forward_and_backward_on_cpu_in_bf16():
    q, k, v = (_bf16(2, 2, 8, 16).requires_grad_() for _ in range(3))
    with MatmulDtypes() as mode:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    assert dict(mode.attention) == {"bfloat16": 2}, dict(mode.ops)
