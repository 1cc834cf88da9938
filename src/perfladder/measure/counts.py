"""Cheap runtime checks of what a measurement counts (no framework imports).

A rate is tokens over seconds, and an MFU is that rate times FLOPs per token over a peak; the
gates prove the model is the same, these prove the arithmetic around it:

* ``check_tokens(timing)`` -- every window's tokens (its rate times its seconds) equal the
  batch shape times the steps in the window (a miscount in ``num_tokens`` or in the loop);
* ``check_flops(formula, counted, ...)`` -- the FLOPs-per-token formula the ladder reports
  MFU with (``perfladder.config.flops_per_token``) against an independent counter of the
  model's matmuls, run once when a ladder starts (``FlopCounterMode`` / the jaxpr's dots);
* ``check_distinct(digests)`` -- data-parallel ranks or devices were fed different batches;
* ``check_global_rate(...)`` -- a multi-process throughput equals the global tokens over the
  elapsed time of each window;
* ``check_mfu(result, device_name)`` -- a rung's MFU is divided by its own precision's peak
  in the table (``perfladder.hardware.PEAKS``: bf16 for bf16, TF32 for tf32 and fp32), the
  one its record names.

Each raises a ``CountError`` (a ``GateError``: the rung or the ladder is refused) naming the
numbers; their tolerances, and why, are in the one table, ``perfladder.measure.gates``.
"""
from __future__ import annotations

import math

from perfladder.hardware import peak_for
from perfladder.measure.gates import FLOPS_RTOL, GLOBAL_RATE_RTOL, MFU_RTOL, TOKENS_RTOL, GateError

__all__ = ["CountError", "check_tokens", "check_flops", "check_distinct", "check_global_rate",
           "check_mfu", "TOKENS_RTOL", "FLOPS_RTOL", "GLOBAL_RATE_RTOL", "MFU_RTOL"]


class CountError(GateError):
    """A measurement's own arithmetic (tokens, FLOPs, data per rank) does not add up."""


def check_tokens(timing, what: str = "the timed step") -> int:
    """Every window of ``timing`` (a ``Throughput`` or ``evidence.Timing``) counted
    batch shape x steps tokens; returns that count. ``CountError`` otherwise."""
    shape = list(timing.batch_shape)
    if len(shape) < 2:
        raise CountError(f"{what}: batch_shape={shape!r} must be (batch, seq_len): the tokens of "
                         "a window cannot be checked without it", gate="token count")
    want = math.prod(shape) * timing.steps_per_window
    for w, (rate, secs) in enumerate(zip(timing.windows, timing.seconds)):
        got = rate * secs
        if not abs(got - want) <= TOKENS_RTOL * want:
            raise CountError(f"{what}: window {w + 1} counted {got:,.1f} tokens, but "
                             f"{timing.steps_per_window} steps of batch shape {tuple(shape)} are "
                             f"{want:,} tokens: its rate would be off by {got / want:.3g}x",
                             gate="token count")
    return want


def split_flops(per_token_at_T: float, per_token_at_half: float, T: int) -> tuple[float, float]:
    """Per-token FLOPs counted at sequence lengths ``T`` and ``T // 2`` -> ``(constant part,
    part per unit of T)``: a count linear in T, ``a + b T``, separates the parameters' share
    (``6N``) from attention's (``12 L D`` per unit of T)."""
    half = T // 2
    if T < 2 or 2 * half != T:
        raise ValueError(f"T={T!r} must be an even sequence length >= 2")
    b = (per_token_at_T - per_token_at_half) / (T - half)
    return per_token_at_T - b * T, b


def check_flops(*, vector_params: int, seq_len: int, formula: tuple[float, float],
                counted: tuple[float, float], counter: str) -> dict:
    """The formula's FLOPs per token against an independent count, term by term: both given at
    ``seq_len`` and ``seq_len // 2`` (``formula``: the ladder's ``flops_per_token``; ``counted``:
    by ``counter``) and split into their constant part, which must be the counted matmuls
    plus ``6 * vector_params`` (parameters in no matmul: the formula's 6N counts them), and
    their part per unit of T (attention, 12 L D). Returns what was compared; ``CountError``
    naming the term otherwise."""
    fa, fb = split_flops(*formula, seq_len)
    ca, cb = split_flops(*counted, seq_len)
    for name, got, want in (("6N", ca + 6 * vector_params, fa), ("12LD", cb, fb)):
        if not abs(got - want) <= FLOPS_RTOL * abs(want):
            raise CountError(f"FLOPs per token at T={seq_len}: {counter} counts {got:,.0f} for the "
                             f"{name} term, the formula {want:,.0f} ({want / got:.4g}x): the MFU "
                             "and TFLOP/s of every rung would be off", gate="flop count")
    return {"counter": counter, "seq_len": seq_len, "formula": formula[0],
            "counted_matmul_flops": counted[0], "vector_params": vector_params, "rtol": FLOPS_RTOL}


def check_distinct(digests, what: str = "ranks") -> list:
    """Data-parallel ``digests`` (one per rank or device, of the batch it was fed) all
    differ; ``CountError`` naming the ones that share a batch otherwise."""
    digests = list(digests)
    if len(digests) < 2:
        raise ValueError(f"check_distinct needs the digests of at least 2 {what}, got {len(digests)}")
    seen: dict = {}
    for i, d in enumerate(digests):
        seen.setdefault(d, []).append(i)
    same = [ids for ids in seen.values() if len(ids) > 1]
    if same:
        raise CountError(f"{what} {same} were fed the same batch: data parallelism would count "
                         f"{len(digests)} x the tokens of fewer distinct batches",
                         gate="distinct batches")
    return digests


def check_global_rate(windows, global_tokens: float, seconds, what: str = "the ranks") -> list[float]:
    """A multi-process rate, window by window: ``windows[w]`` (what is reported) must equal
    ``global_tokens`` (every rank's batch, from the launch's shapes: k x B x T x steps) over
    the elapsed ``max_r seconds[r][w]`` (``seconds``: each rank's window seconds).
    Returns the global rates; ``CountError`` beyond ``GLOBAL_RATE_RTOL``."""
    per_rank = [list(s) for s in seconds]
    if not per_rank or any(len(s) != len(windows) for s in per_rank):
        raise ValueError(f"{len(per_rank)} ranks' window seconds do not line up with "
                         f"{len(windows)} windows")
    out = []
    for w, reported in enumerate(windows):
        elapsed = max(s[w] for s in per_rank)
        want = global_tokens / elapsed
        if not abs(reported - want) <= GLOBAL_RATE_RTOL * want:
            raise CountError(f"{what}: window {w + 1} reports {reported:,.0f} tokens/s, but "
                             f"{global_tokens:,.0f} global tokens over the slowest rank's "
                             f"{elapsed:.4g} s are {want:,.0f} tokens/s ({reported / want:.3g}x)",
                             gate="global rate")
        out.append(want)
    return out


def check_mfu(result, device_name: str | None, devices: int = 1):
    """A measured rung's MFU (``result``: a ``RungResult``) against the peak table, by the rung's
    own precision: a bf16 rung divided by the bf16 peak of ``device_name``, an fp32 or tf32 rung
    by the TF32 peak; the peak its record names (``mfu_peak``) must be that one, and its MFU
    times that peak its TFLOP/s per device (over ``devices``). No MFU only where the table
    has no such peak. Returns ``result``; ``CountError`` naming both peaks otherwise."""
    peak = peak_for(device_name)
    column = "bf16" if result.precision == "bf16" else "tf32"
    want = None if peak is None or not result.measured else getattr(peak, column)
    if want is None:
        if result.mfu is not None or result.mfu_peak is not None:
            raise CountError(f"{result.name}: MFU {result.mfu!r} against {result.mfu_peak!r}, but "
                             f"{device_name!r} has no {column} peak in the table", gate="mfu peak")
        return result
    named = {"precision": column, "tflops": want}
    if result.mfu_peak != named or result.mfu is None:
        raise CountError(f"{result.name} computes in {result.precision}: its MFU must be divided by "
                         f"{peak.name}'s {column} peak, {want} TFLOP/s; its record names "
                         f"{result.mfu_peak!r}", gate="mfu peak")
    per_device = result.tflops / max(1, devices)
    if not abs(result.mfu * want - per_device) <= MFU_RTOL * per_device:
        raise CountError(f"{result.name}: MFU {result.mfu:.4g} x the {column} peak {want} TFLOP/s is "
                         f"{result.mfu * want:.4g} TFLOP/s, but it delivered {per_device:.4g} per device "
                         f"({result.mfu * want / per_device:.3g}x): divided by another peak",
                         gate="mfu peak")
    return result
