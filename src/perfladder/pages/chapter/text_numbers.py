"""The numbers the book's text pages (``chapter13/index.md``, ``chapter13/case_study.md``) quote,
computed from the configuration of the run a ladder page shows (framework-free).

A text page cannot compute: it pastes values a notebook glued, as plain text
(``{glue:text}`../notebooks/01_pytorch_ladder.ipynb::t_cfg_params:s```). ``text_values(result)``
is what the PyTorch page glues for that: the model's sizes and parameter counts, and the two
operations the roofline section of the index sets on either side of the ridge, at the
chapter's batch.
"""
from __future__ import annotations

from perfladder.config import expected_num_params
from perfladder.pages.chapter.phrases import config_numbers, gradient_numbers
from perfladder.pages.claims import config_of
from perfladder.results.record import LadderResult

BF16_BYTES = 2
# FLOPs of one tanh-GELU value: x^3 (2), times 0.044715 (1), plus x (1), times sqrt(2/pi) (1),
# tanh (about 5, through one exp), plus 1 (1), times x (1), times 0.5 (1)
GELU_FLOPS_PER_VALUE = 13


def _g(v: float) -> str:
    return f"{v / 1e9:.1f} G"


def _m(v: float) -> str:
    return f"{v / 1e6:.1f} M" if v < 1e8 else f"{v / 1e6:.0f} M"


def model_numbers(result: LadderResult) -> dict[str, str]:
    """The model's sizes and parameter counts (``t_cfg_*``, ``t_params_*``)."""
    c = config_of(result)
    gpt = c.gpt()
    d, total = gpt.num_hiddens, expected_num_params(gpt)
    per_block = 12 * d * d + 13 * d           # QKV, output, FFN (4x) weights and biases, two norms
    # (the FFN's share assumes ffn_mult 4; a breakdown that does not add up is not printed)
    embed = gpt.vocab_size * d
    out = {f"t_{k}": fn(result) for k, fn in {**config_numbers(), **gradient_numbers()}.items()}
    out.update(t_vocab=str(gpt.vocab_size), t_params_exact=f"{total:,}", t_params_m=f"{total / 1e6:.2f}M",
               t_params_block=f"{per_block:,}", t_params_embed=f"{embed:,}", t_params_norm=f"{2 * d:,}")
    if per_block * gpt.num_blks + embed + 2 * d != total:         # the breakdown must add up
        out.update(t_params_block="–", t_params_embed="–", t_params_norm="–")
    return out


def ridge_numbers(result: LadderResult) -> dict[str, str]:
    """The FFN matmul and its GELU at the chapter's batch, in bf16: FLOPs, bytes, intensity."""
    c = config_of(result)
    gpt = c.gpt()
    rows, d = c.batch_size * c.num_steps, gpt.num_hiddens
    hidden = gpt.ffn_mult * d
    mm_flops = 2 * rows * d * hidden
    mm_bytes = BF16_BYTES * (rows * d + d * hidden + rows * hidden)
    values = rows * hidden
    gelu_flops, gelu_bytes = GELU_FLOPS_PER_VALUE * values, 2 * BF16_BYTES * values   # read + write
    return {"t_rows": f"{rows:,}", "t_hidden": str(hidden),
            "t_ffn_shape": f"({rows} × {d}) @ ({d} × {hidden})", "t_gelu_shape": f"({rows} × {hidden})",
            "t_ffn_flops": _g(mm_flops), "t_ffn_bytes": _m(mm_bytes),
            "t_ffn_intensity": f"about {mm_flops / mm_bytes:.0f}",
            "t_gelu_flops": f"about {_g(gelu_flops)}", "t_gelu_bytes": _m(gelu_bytes),
            "t_gelu_intensity": f"about {gelu_flops / gelu_bytes:.0f}"}


def text_values(result: LadderResult) -> dict[str, str]:
    """Everything the text pages paste from the PyTorch page, as plain strings."""
    return {**model_numbers(result), **ridge_numbers(result)}
