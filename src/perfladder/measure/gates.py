"""What a gate measures and what it allows, for both frameworks (no framework imports).

A rung is timed only after it has proven that it computes the model the reference computes.
The framework gates (``perfladder.torch.gates``, ``perfladder.jax.gates``) measure; this
module holds what they share: the tolerance table, the ``GateResult`` record, the errors,
the loss gate's rule (``loss_gate``) and the check of a dtype receipt.

Which gate guards what:

    model gate      logits, the step's own loss, every parameter's gradient by name and every
                    matrix gradient's scale, against the plain fp32 model at probe weights
                    (below), no optimizer step: compile / jit, bf16, batch (reference in
                    chunks), checkpointing, one-hot and fp32 embedding lookups, attention
                    kernels, CUDA graphs, max-autotune, fused kernels' derivatives
    optimizer gate  every step form, OPTIMIZER_STEPS steps: torch, the candidate's optimizer
                    step fed the reference's gradients (fused / compiled AdamW, CUDA graphs);
                    JAX, the step form itself ('none' / 'nnx' / 'split') against the library's
                    AdamW step, op by op in fp32: betas, a group left out, a discarded state
    rung checks     each rung's own equivalence check, at probe weights, in the precision and
                    code path the rung times (parity, mirror, one-hot lookup: below)
    loss gate       the timed step's first steps against the plain bf16 recipe (below)
    receipt         the dtypes of the timed call and of its arithmetic: every matmul's and
                    attention kernel's operands, the loss's (``perfladder.torch.program``,
                    the traced jaxpr): every step that claims bf16, an fp32 loss always
    counts          ``perfladder.measure.counts``: tokens per window, FLOPs per token at the
                    ladder's start, distinct data per rank / device, global multi-process rates
    learning check  ``perfladder.measure.learning``: held-out loss by the reference implementation

The metric (``METRIC``). Every quantity a gate compares -- the logits, the gradient of one
parameter, the update of one parameter -- is reduced to the relative error of the tensor as a
whole, ``rel = ||candidate - reference|| / ||reference||`` in Frobenius norms. It is
scale-free (a parameter whose gradients are 1e-5 is judged like one whose gradients are 1).
It was chosen over ``max|c - r| / max|r|`` after measuring both: the gradient of a
bias or a LayerNorm parameter is a sum over all B*T positions of cotangents of both signs,
smaller than its terms, so the rounding error of the terms shows up enlarged in its largest
entry (bf16, honest: 0.05 by the max, 0.035 by the norm), while the bugs a gate must catch
change a whole tensor and keep their size (the embedding lookup's gradient halved: 0.25 by
the max, 0.33 by the norm). A bug confined to a fraction f of a tensor is diluted to
sqrt(f) of its size: one head of 8 still shows at 0.35 of its effect. A missing gradient, a
shape mismatch, NaN or inf count as ``inf``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from perfladder.hardware import check_precision
from perfladder.measure.evidence import Gate, dtype_name

# Unit roundoff u = 2^-p of each format (p: significand bits, the implicit one included).
# fp32: 23 stored + 1; TF32 (what a GPU's fp32 matmul runs in by default): 10 + 1; bf16: 7 + 1.
UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "tf32": 2.0 ** -11, "bf16": 2.0 ** -8}

# Tolerance of rel (above) by the coarser precision of the pair compared, for the forward
# (logits) and the backward (every parameter's gradient); the optimizer gate uses "fp32"
# (its two optimizers see the same gradients and keep fp32 state).
#
# bf16: u = 2^-8 = 3.9e-3 per rounding. The logits come out of a chain of roughly 10
#   roundings per block (matmul inputs and outputs, norms, the residual adds when the stream
#   itself is bf16, as in the JAX model) times 6 blocks; independent roundings add in
#   quadrature, sqrt(60) u ~ 8 u, and another kernel (flash attention, fused epilogues) may
#   round elsewhere: forward 16 u = 2^-4 = 0.0625. A gradient goes through that chain twice
#   (forward, then backward), and a bias's or norm's gradient is a sum with cancellation
#   (see the metric): backward 32 u = 2^-3 = 0.125. Measured honest worst cases, CPU: logits
#   0.005 (smoke) .. 0.012 (full width), gradients 0.013 (torch) .. 0.035 (JAX, a bias, batch
#   32); the mildest planted bug (the embedding lookup's gradient halved, while the tied
#   output projection still contributes its full share of the table's gradient) sits at
#   0.33, and the others at 0.5 .. 1 or inf.
# TF32: u = 2^-11; the same chains: forward 16 u = 2^-7, backward 32 u = 2^-6. A TF32 matmul
#   rounds its inputs to 11 bits and accumulates in fp32, so only u changes.
# fp32 vs fp32: both sides round at 2^-24, but they may add the same numbers in another
#   order (inductor / XLA fusion, another attention kernel, a batch in chunks); a K-term
#   sum reassociated can move by up to K u, and K = 4D = 2048 at full width:
#   2048 * 2^-24 = 2^-13 = 1.2e-4. Measured honest: below 1e-6 (compiled vs eager, jit vs
#   op-by-op, one-hot vs gather, checkpointed vs plain); the optimizer gate's fused AdamW
#   against the default one, fed the same gradients, a few 1e-6.
FORWARD_TOL = {"fp32": 2.0 ** -13, "tf32": 2.0 ** -7, "bf16": 2.0 ** -4}
BACKWARD_TOL = {"fp32": 2.0 ** -13, "tf32": 2.0 ** -6, "bf16": 2.0 ** -3}
# The gradient's scale. Adam's update is invariant to a parameter's gradient scale, so a
#   kernel derivative that is k% off (a fused GELU's backward times 1.05) is invisible to the
#   loss gate, and at 5% it passes BACKWARD_TOL["bf16"]. A scale is measured apart from the
#   noise: for every matrix parameter (2-D and more) the model gate also compares
#   scale = |<c, r> / <r, r> - 1|, the rounding noise averaging out over the tensor's
#   entries while a systematic error does not. Measured honest worst, CPU smoke, bf16:
#   0.0010 (JAX, batch 32) and 0.0021 (torch, batch 32); the mildest planted bug, the
#   tanh-GELU derivative 5% off, shows at 0.046 (JAX, dense1 of the last block) .. 0.063:
#   2^-6 leaves it 2.9x over and the honest worst 7x under. Vectors (biases, norm scales) are left to
#   BACKWARD_TOL: theirs are sums with cancellation whose honest scale moves by up to 0.032
#   (JAX: the key bias, whose true gradient is exactly zero since softmax ignores a shift).
SCALE_TOL = {"fp32": 2.0 ** -13, "tf32": 2.0 ** -8, "bf16": 2.0 ** -6}
# The optimizer gate compares each parameter's displacement after OPTIMIZER_STEPS steps
#   (fp32 state on both sides). Several steps, because after one step Adam's bias correction
#   makes the update lr * g / |g| whatever its betas are; after three, beta1 = 0.8 instead
#   of 0.9 (the mildest planted optimizer bug) moves the parameters by 0.019 .. 0.055; an
#   optimizer state discarded every step, by 0.17 (JAX, split step). Adam divides each
#   gradient entry by its own size, so an entry whose true gradient is near zero steps by a
#   full lr in the direction of its rounding noise: the fp32 forward tolerance does not bound
#   a displacement. Measured honest: fused vs default AdamW a few 1e-6; jit vs op-by-op fp32
#   steps 3e-5; on the H200 with XLA's GEMMs taken from cuBLAS, a step compiled with
#   autotuning against the reference compiled without (two GEMM algorithms, two summation
#   orders) 1.4e-4 on the first block's QKV weights. 2^-10 = 9.8e-4 is 7x that, and the
#   mildest planted bug stays 19x over it.
OPTIMIZER_TOL = 2.0 ** -10
OPTIMIZER_STEPS = 3
# Where the reference's own steps do not reproduce (a GPU: XLA's scatter-add for the embedding
#   gradient uses atomics, so step 2 starts from parameters an ulp apart, and TF32 matmuls and
#   Adam amplify that), each parameter is judged against REPRO_FACTOR times its reference's
#   run-to-run difference when that is larger than OPTIMIZER_TOL. Measured on the H200, full
#   config, 8 rows, 3 op-by-op steps: the same honest step form against one reference run,
#   re-run on each of 10 rungs, differed by 0.0021 .. 0.0032 on the key bias (true gradient
#   zero, so Adam normalises pure rounding noise into steps) -- a spread of 1.5x between runs,
#   which 4x covers; beta1 = 0.8 (0.019 .. 0.055 on every parameter) stays over on every
#   parameter whose reference reproduces. On CPU the reference reproduces exactly and
#   OPTIMIZER_TOL alone applies.
REPRO_FACTOR = 4.0

# -- each rung's own equivalence check (the same metric unless said) --------------------------
# torch R1, compiled vs eager logits at probe weights, max |diff| <= atol + rtol * |ref|, fp32:
#   on a GPU the matmuls run as TF32 and inductor re-associates fused reductions (logits are
#   O(1): measured 5e-4 on the H200); on CPU ~1e-6. Planted: a wrong attention scale (1/Dh
#   for 1/sqrt(Dh)) moves the logits by 0.0024 at the initial weights -- it would pass -- and
#   by 0.23 at probe weights: 23x over.
COMPILE_ATOL, COMPILE_RTOL = 1e-2, 1e-3
# torch R4, checkpointed vs plain logits, max |diff|, run in the rung's precision (bf16
#   autocast) through the step's own autocast code: recomputation runs the same ops on the
#   same inputs in the same order, so the result is bitwise equal (measured 0.0, H200 and
#   CPU). Planted: a checkpoint wrapper that runs its block with autocast off is exact in
#   fp32 and off by 1e-2 in bf16: so the check runs in bf16.
MIRROR_ATOL = 1e-6
# JAX, max |a - b| / max |b| of the logits at probe weights. R1 (jit vs op by op, fp32): XLA
#   re-associates fused sums, and on a GPU fp32 matmuls run as TF32 (measured 7e-4 on the
#   H200). B4 (cuDNN vs XLA attention, bf16): measured 0.014 on the H200, under 2^-4 =
#   FORWARD_TOL["bf16"]; a wrong attention scale (1/Dh for 1/sqrt(Dh)) is 0.2 at probe
#   weights -- and passes at the initial weights, where attention is a uniform average.
# R4 (remat mirror, both forwards in one program): measured 0.0; a mirror whose final norm
#   scale drifted by 1.5x is 0.5 off.
PARITY_TOL = {"float32": 1e-2, "bfloat16": 5e-2}
MIRROR_TOL = {"float32": 1e-5, "bfloat16": 1e-2}
# One-hot vs gathered embedding rows, ||diff|| / ||rows||, in the precision the one-hot
#   matmul runs in (it is fp32 by design, also inside autocast): exact in fp32 (every
#   output is 1 * w plus zeros; measured 0.0); a TF32 matmul (CUDA, fp32 matmul precision
#   'high') rounds the table to 11 bits, <= 2^-11. Planted: the lookup left to autocast
#   rounds the rows to bf16, ~2^-9 / sqrt(3) = 1.1e-3: 2.3x over the TF32 bound, 1e3x over
#   the fp32 one. The table gradients (the same sums in another order) get the same bound.
LOOKUP_TOL = {"fp32": 2.0 ** -20, "tf32": 2.0 ** -11}
# torch B4's two-model check in true fp32 (logits max |diff|, table gradient rel): the
#   model's forward in true fp32, one-hot vs gather; measured 0.0 and 3e-7.
EMBED_ATOL, EMBED_GRAD_RTOL = 1e-6, 1e-4

# -- the loss gate: the first GATE_STEPS optimizer steps of the timed step itself -----------
# Against the plain bf16 recipe (library code) from the same init on the same batches; a loss
# of ~3.3. What it is for: the compiled step as a whole (the JAX model gate runs op by op):
# its mildest planted bug, an update computed but never applied, moves the third loss by
# 0.16 (torch) / 6% (JAX) at smoke: 8x / 6x over. What it cannot see: at the initial weights
# the logits are near zero and the loss near log V whatever the blocks compute, so a dropped
# residual moves it by 0.007 (torch) / 0.4% (JAX) at smoke, under the GPU's honest noise; the
# model gate, at probe weights, is that bug's gate (its logits off by 0.43: 7x over).
# One rule for both frameworks, max |diff| / |reference| over the steps (``loss_gate``):
#   honest worst 4.6e-3 in JAX (B1 on the H200: the plain reference accumulates the embedding
#   gradient with bf16 atomics), 4.5e-4 in torch (1.5e-3 of a loss of 3.3: B4, H200), < 1e-4
#   on CPU; the mildest planted bug 6% (JAX) and 0.16 / 3.3 = 5% (torch): 6x and 5x over.
LOSS_RTOL = 1e-2
GATE_STEPS = OPTIMIZER_STEPS

# -- the counts (``perfladder.measure.counts``) ---------------------------------------------
# A window's tokens, rate x seconds against batch shape x steps: the rate is count / seconds,
#   so float rounding is all (1e-16); counting rows for tokens is T x off.
TOKENS_RTOL = 1e-9
MFU_RTOL = TOKENS_RTOL   # MFU x peak against TFLOP/s: a quotient of the rung's own numbers
# FLOPs per token, the formula's terms against the counter's (FlopCounterMode on the meta
#   device; the jaxpr's dots), the parameters in no matmul (biases, norm scales) added to the
#   counted constant part: measured equal to the FLOP, smoke and full, both frameworks.
#   Planted: the backward left out (2N for 6N) is 3x off; attention's 12 L T D halved, 2x.
FLOPS_RTOL = 1e-6
# Multi-process rates per window, the reported against the global tokens over the slowest
#   rank's seconds: ranks step in lockstep (each step waits in the all-reduce) but close their
#   windows on their own clocks, a few percent apart on a loaded 2-core host. Planted: one of
#   two ranks' tokens counted twice is 0.5 off: 2x over.
GLOBAL_RATE_RTOL = 0.25

# The probe weights a model gate runs at. At the initial weights (std 0.02) the attention
# scores q.k / sqrt(Dh) have a std of D * 0.02^2 (0.2 at width 512, 0.013 at the smoke
# width 32): attention is a near-uniform causal average, and a bug in what decides *where*
# it looks (RoPE left off k) moves the logits by less than bf16 rounding does. The gate
# therefore scales the query and key projections (the same factor in the reference and
# the candidate) so that the scores have a std of PROBE_SCORE_STD: with LayerNorm-ed
# inputs, a score's std is D * s^2 for projection weights of std s, so s = sqrt(2 / D).
PROBE_SCORE_STD = 2.0


def probe_qk_std(num_hiddens: int) -> float:
    """Weight std of the query / key projections that gives attention scores of std
    ``PROBE_SCORE_STD`` (see above)."""
    if not isinstance(num_hiddens, int) or num_hiddens < 1:
        raise ValueError(f"num_hiddens={num_hiddens!r} must be a positive integer")
    return math.sqrt(PROBE_SCORE_STD / num_hiddens)


def coarser(a: str, b: str) -> str:
    """The coarser of two precisions (the one with the larger unit roundoff)."""
    check_precision(a), check_precision(b)
    return a if UNIT_ROUNDOFF[a] >= UNIT_ROUNDOFF[b] else b


def tolerances(reference: str, candidate: str) -> dict:
    """``{'forward': tol, 'backward': tol, 'scale': tol}`` for comparing a ``candidate``
    precision with a ``reference`` precision (the coarser of the two decides)."""
    p = coarser(reference, candidate)
    return {"forward": FORWARD_TOL[p], "backward": BACKWARD_TOL[p], "scale": SCALE_TOL[p]}


def scale_error(dot_cr: float, dot_rr: float) -> float:
    """``|<c, r> / <r, r> - 1|`` from the two inner products: how far the candidate's tensor is,
    as a whole, a scaled copy of the reference's (``SCALE_TOL``); NaN-safe, as ``rel_diff``."""
    if math.isnan(dot_cr) or math.isnan(dot_rr):
        return math.inf
    if dot_rr == 0.0:
        return 0.0 if dot_cr == 0.0 else math.inf
    return abs(dot_cr / dot_rr - 1.0)


METRIC = "||candidate - reference|| / ||reference|| per tensor (Frobenius norms)"


def rel_diff(norm_diff: float, norm_ref: float) -> float:
    """``METRIC``: 0 when both are zero; inf when only the reference is, or on NaN (never passes)."""
    if math.isnan(norm_diff) or math.isnan(norm_ref):
        return math.inf
    if norm_ref == 0.0:
        return 0.0 if norm_diff == 0.0 else math.inf
    return norm_diff / norm_ref


# -- results and errors ---------------------------------------------------------------------
@dataclass
class GateResult:
    """What one gate compared, what it measured, and what it allowed.

    ``measured`` and ``tolerance`` share their keys, one per quantity: ``'logits'``,
    ``'grad/<parameter>'``, ``'update/<parameter>'``. ``worst`` is the quantity with the
    largest ``measured / tolerance``; ``passed`` is whether every quantity is within its
    tolerance. ``details`` holds the rest (batch shapes, steps, the probe scale...).
    """
    gate: str
    reference: str
    candidate: str
    precision: dict                 # {'reference': 'fp32', 'candidate': 'bf16'}
    measured: dict
    tolerance: dict
    passed: bool
    worst: str
    details: dict = field(default_factory=dict)

    @classmethod
    def judge(cls, gate: str, reference: str, candidate: str, precision: dict,
              measured: dict, tolerance: dict, details: dict | None = None) -> "GateResult":
        """Build the result from the measurements: ``worst`` and ``passed`` computed here."""
        if not measured or set(measured) != set(tolerance):
            raise ValueError(f"measured and tolerance must name the same quantities; got "
                             f"{sorted(measured)} and {sorted(tolerance)}")
        measured = {k: _clean(v) for k, v in measured.items()}
        worst = max(measured, key=lambda k: measured[k] / tolerance[k])
        passed = all(measured[k] <= tolerance[k] for k in measured)
        return cls(gate=gate, reference=reference, candidate=candidate, precision=dict(precision),
                   measured=measured, tolerance=dict(tolerance), passed=passed, worst=worst,
                   details=dict(details or {}))

    def summary(self) -> str:
        """One line: the gate, the verdict, the worst quantity and its numbers."""
        w = self.worst
        verdict = "passed" if self.passed else "FAILED"
        return (f"{self.gate} {verdict}: {self.candidate} vs {self.reference} "
                f"({self.precision.get('candidate')} vs {self.precision.get('reference')}); "
                f"worst {w}: ||diff|| / ||ref|| = {self.measured[w]:.3g} "
                f"(allowed {self.tolerance[w]:.3g})")

    def evidence(self):
        """This result as the ``perfladder.measure.evidence.Gate`` a rung records."""
        from perfladder.measure.evidence import Gate
        return Gate(name=self.gate, passed=self.passed, values=dict(self.measured),
                    tolerances=dict(self.tolerance), reference=self.reference,
                    detail={"candidate": self.candidate, "precision": self.precision,
                            "worst": self.worst, **self.details})

    def to_dict(self) -> dict:
        d = asdict(self)
        # JSON has no inf: a missing gradient is written as the string "inf"
        d["measured"] = {k: (v if math.isfinite(v) else "inf") for k, v in self.measured.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "GateResult":
        d = dict(d)
        d["measured"] = {k: float(v) for k, v in d["measured"].items()}
        return cls(**d)


def _clean(v) -> float:
    v = float(v)
    return math.inf if math.isnan(v) else v


class GateError(AssertionError):
    """A rung failed a correctness gate: it is not timed. ``gate`` names the gate and
    ``result`` (a ``GateResult``, when the gate measured something) holds the numbers."""

    def __init__(self, message: str, result: GateResult | None = None, gate: str | None = None):
        super().__init__(message)
        self.result = result
        self.gate = gate or (result.gate if result is not None else None)


class ModelGateError(GateError):
    """The candidate's logits or parameter gradients differ from the reference model's."""


class OptimizerGateError(GateError):
    """The candidate's optimizer moves the parameters differently from the reference AdamW."""


class ReceiptError(GateError):
    """A step that claims a precision did not compute in it (its own receipt says so)."""


class LossGateError(GateError):
    """A configuration's first losses differ from the reference recipe's on the same batches."""


def loss_gate(losses, reference_losses, reference: str, rtol: float = LOSS_RTOL) -> Gate:
    """The loss gate of both frameworks: the candidate's ``losses`` over the first steps against
    the ``reference``'s (the plain bf16 recipe from the same init on the same batches), each
    step's |diff| / |reference| at most ``rtol``. ``LossGateError`` if not (NaN fails too);
    returns the evidence."""
    got, want = [float(x) for x in losses], [float(x) for x in reference_losses]
    rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(got, want))
    if not rel <= rtol:
        raise LossGateError(
            f"losses over the first {len(got)} steps {[round(x, 5) for x in got]} differ from "
            f"{reference}'s {[round(x, 5) for x in want]} by {rel:.3g} (relative) > rtol={rtol:g}: "
            "not timing a configuration that trains a different model", gate="loss over steps")
    return Gate(name="loss over steps", passed=True, values={"max_rel_diff": rel},
                tolerances={"max_rel_diff": rtol}, reference=reference,
                detail={"steps": len(got), "losses": got, "reference_losses": want})


def fail_if(result: GateResult, error: type[GateError]) -> GateResult:
    """Return ``result`` if it passed, else raise ``error`` with its summary."""
    if not result.passed:
        raise error(f"{result.summary()}: not timing a model that computes something else",
                    result=result)
    return result


# -- dtype receipts ---------------------------------------------------------------------------
RECEIPT_EXPECT = {"bf16": "bfloat16", "fp32": "float32"}


def check_receipt(receipt: dict | None, expect: str, what: str = "the timed step",
                  allow_fp32_matmuls: int = 0) -> dict:
    """Assert a receipt recorded by the timed step says it computed in ``expect``.

    ``receipt`` maps what was looked at to its dtype: ``'logits'`` (required), and where the
    framework records them ``'grad'`` (a parameter's gradient: fp32 masters, whatever
    ``expect``), ``'loss'`` (the loss the step returned, read from the step itself: fp32
    whatever ``expect``), ``'first_activation'`` and ``'matmul_operands'`` (a dict
    ``{dtype or 'a+b': count}``: with ``expect='bf16'`` at least one bf16 matmul and at most
    ``allow_fp32_matmuls`` fp32 ones, e.g. 1 for an fp32 one-hot embedding lookup),
    ``'attention_operands'`` (the same, every one in ``expect``) and ``'loss_ops'`` (the
    loss's own arithmetic: fp32 whatever ``expect``).
    Raises ``ReceiptError``; returns the receipt.
    """
    if expect not in RECEIPT_EXPECT:
        raise ValueError(f"expect={expect!r} is not valid; valid choices: {tuple(RECEIPT_EXPECT)}")
    if not receipt or "logits" not in receipt:
        raise ReceiptError(f"{what} recorded no receipt: it was never called, or the code that "
                           "ran is not the step's own (a receipt is written by the timed call)",
                           gate="receipt")
    want = RECEIPT_EXPECT[expect]
    bad = {k: receipt[k] for k in ("logits", "first_activation")
           if k in receipt and dtype_name(receipt[k]) != want}
    for key in ("grad", "loss"):          # fp32 masters, and an fp32 loss, whatever the compute
        if key in receipt and dtype_name(receipt[key]) != "float32":
            bad[key] = receipt[key]
    dots = receipt.get("matmul_operands")
    if dots is not None:
        other = {k: n for k, n in dots.items() if k != want}
        fp32_ok = allow_fp32_matmuls if expect == "bf16" else 0
        if not dots.get(want) or set(other) - {"float32"} or other.get("float32", 0) > fp32_ok:
            bad["matmul_operands"] = dots
    attention = receipt.get("attention_operands")     # q, k, v (and their gradients)
    if attention and set(attention) != {want}:
        bad["attention_operands"] = attention
    loss_ops = receipt.get("loss_ops")                 # the loss's log-softmax: fp32 always
    if loss_ops is not None and set(loss_ops) != {"float32"}:
        bad["loss_ops"] = loss_ops
    if bad:
        raise ReceiptError(f"{what} claims {expect} but computed {bad} ({receipt}): it would "
                           f"measure one precision and call it another", gate="receipt")
    return receipt
