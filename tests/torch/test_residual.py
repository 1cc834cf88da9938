"""GPT(residual='bf16'): the residual stream in bf16 under bf16 autocast -- a numerics change,
measured here against the fp32-stream model and against the model gate's reference."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.measure.gates import BACKWARD_TOL, FORWARD_TOL, probe_qk_std  # noqa: E402
from perfladder.torch import GPT  # noqa: E402

SMOKE = get_config("smoke").gpt()


def _model(**kw):
    """The smoke GPT at the model gate's probe weights (q and k projections scaled so that the
    attention scores have std 2: attention then depends on where it looks)."""
    torch.manual_seed(0)
    m = GPT(SMOKE, **kw)
    D = SMOKE.num_hiddens
    with torch.no_grad():
        for blk in m.blks:
            W = blk.attn.W_qkv.weight                                     # (3D, D): q | k | v rows
            W[:2 * D] *= probe_qk_std(D) / W[:2 * D].std()
    return m


def _run(model, X, autocast: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(X)
    F.cross_entropy(logits.float().flatten(0, 1), torch.roll(X, -1, 1).flatten()).backward()
    return logits.detach().double(), {n: p.grad.double() for n, p in model.named_parameters()}


def _rel(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


def _errors(got, want) -> tuple[float, float]:
    """(logits, worst parameter gradient) as the model gate measures them: ||diff|| / ||ref||."""
    return _rel(got[0], want[0]), max(_rel(got[1][n], want[1][n]) for n in want[1])


def test_residual_choices_and_autocast_required():
    with pytest.raises(ValueError, match="valid choices"):
        GPT(SMOKE, residual="fp16")
    X = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(RuntimeError, match="needs bf16 autocast"):
        GPT(SMOKE, residual="bf16")(X)


def test_bf16_stream_is_bf16_between_blocks_and_its_gradients_reach_fp32_masters():
    model = _model(residual="bf16")
    seen = []
    for blk in model.blks:
        blk.register_forward_hook(lambda mod, inp, out: seen.append((inp[0].dtype, out.dtype)))
        blk.norm1.register_forward_hook(lambda mod, inp, out: seen.append(("norm in", inp[0].dtype)))
    X = torch.randint(0, SMOKE.vocab_size, (2, 16))
    logits, grads = _run(model, X, autocast=True)
    assert seen and all(d == torch.bfloat16 for pair in seen for d in pair if isinstance(d, torch.dtype))
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    fp32_stream = _model()
    fp32_stream(X)                                  # without autocast: the stream is fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        H = fp32_stream.embed_tokens(X)
        assert fp32_stream.blks[0](H).dtype == torch.float32   # fp32 + bf16 adds promote


def test_bf16_stream_numerics_against_fp32_stream_and_gate_tolerance():
    """What the bf16 stream costs in accuracy, measured at the smoke size (batch 8, T=16, probe
    weights), against the model gate's reference (the fp32 model, no autocast):

        fp32 stream, bf16 autocast:   logits 0.0045, worst gradient 0.0116
        bf16 stream, bf16 autocast:   logits 0.0055, worst gradient 0.0194
        bf16 vs fp32 stream:          logits 0.0060, worst gradient 0.0195
    and at full width (batch 4, T=128, CPU): 0.0122 / 0.0196 (fp32 stream), 0.0141 / 0.0319 (bf16).

    The tolerance argued for the model gate: keep the bf16 one, FORWARD_TOL['bf16'] = 2^-4 and
    BACKWARD_TOL['bf16'] = 2^-3. Its derivation (``perfladder.measure.gates``) already counts
    the stream's roundings ("the residual adds when the stream itself is bf16, as in the JAX
    model"): a bf16 stream adds two roundings a block (its two adds, and their gradients in the
    backward) to the ~10 a block that bf16 compute has, sqrt(12 / 10) ~ 1.1x the error if they
    were independent; measured 1.2x (logits) and 1.6x (the worst gradient, a LayerNorm weight's:
    a sum over all positions with cancellation), 4x inside the tolerance at full width. The
    mildest planted bug the gate must catch sits at 0.33. The assertions below allow twice the
    measured values so that they test the claim (a bf16 stream is within the gate) and flag a
    regression, not noise."""
    X = torch.randint(0, SMOKE.vocab_size, (8, 16), generator=torch.Generator().manual_seed(1))
    reference = _run(_model(), X, autocast=False)
    fp32_stream = _run(_model(), X, autocast=True)
    bf16_stream = _run(_model(residual="bf16"), X, autocast=True)
    f_logits, f_grad = _errors(fp32_stream, reference)
    b_logits, b_grad = _errors(bf16_stream, reference)
    d_logits, d_grad = _errors(bf16_stream, fp32_stream)
    assert d_logits > 1e-4 and d_grad > 1e-4                  # a real change, not a no-op
    assert b_logits <= min(FORWARD_TOL["bf16"], 2 * 0.0055), b_logits
    assert b_grad <= min(BACKWARD_TOL["bf16"], 2 * 0.0194), b_grad
    assert b_logits <= 2 * f_logits and b_grad <= 3 * f_grad, (b_logits, f_logits, b_grad, f_grad)
