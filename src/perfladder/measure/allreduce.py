"""The all-reduce gate: R5's gradients checked where the all-reduce acts (no framework imports;
the measurements: ``perfladder.torch.parallel.allreduce``, ``perfladder.jax.parallel.allreduce``).

Data parallelism is right when every rank ends its backward pass holding the gradient one
process would compute on the combined batch: the mean of the ranks' gradients. A collective
that sums where a mean belongs hands every rank k times that gradient, and AdamW nearly
cancels the scale (its step is ``m / sqrt(v)``): parameters compared after a few steps move
by 3e-4 (relative), under any honest tolerance. Only the gradients show it. So at R5's start
each rank runs one forward and backward of its own batch through the wrapped model (DDP,
FSDP2, the JAX mesh, ``jax.distributed``), and its gradient -- every parameter, flattened --
is compared with the single-process gradient of every rank's batch together, computed from
the same initial weights by the plain model in the same precision.

The metric and tolerance are the model gate's (``perfladder.measure.gates``): the relative
error ``||g - ref|| / ||ref||`` within ``BACKWARD_TOL`` and the scale ``|<g, ref> / <ref, ref>
- 1|`` within ``SCALE_TOL`` of the rung's precision. The reference runs each rank's batch
separately, as the ranks do, so the two differ only in how the k gradients are added:
measured on CPU 0.0 on both (PyTorch, gloo, two ranks, DDP and FSDP2, fp32 and bf16) and
below 1e-5 (JAX, four host devices and two processes, fp32). A sum where the mean belongs is k - 1 off on both (1.0
at two ranks: 8x over the bf16 backward tolerance, 64x over its scale); a rank left out of
the reduction, (k - 1) / k.
"""
from __future__ import annotations

import math

from perfladder.measure.evidence import Gate
from perfladder.measure.gates import GateError, rel_diff, scale_error, tolerances

GATE_NAME = "all-reduce gate"
REFERENCE = ("the single-process gradient of every rank's batch together (the plain model, "
             "the same initial weights and precision)")


class AllReduceGateError(GateError):
    """A rank's all-reduced gradient is not the single-process gradient of the combined batch."""


def allreduce_gate(dot_gr: float, dot_rr: float, norm_diff: float, *, precision: str,
                   ranks: int, who: str = "this rank") -> Gate:
    """The gate's verdict from three numbers of ``who``'s flattened gradient g against the
    reference ref: ``<g, ref>``, ``<ref, ref>`` and ``||g - ref||``. ``precision``: the rung's
    ('fp32', 'tf32', 'bf16'); ``ranks``: how many were reduced. Returns the evidence;
    ``AllReduceGateError`` when either quantity is past its tolerance (NaN never passes)."""
    tol = tolerances(precision, precision)
    values = {"grad": rel_diff(norm_diff, math.sqrt(max(dot_rr, 0.0))),
              "scale": scale_error(dot_gr, dot_rr)}
    tols = {"grad": tol["backward"], "scale": tol["scale"]}
    bad = {k: v for k, v in values.items() if not v <= tols[k]}
    if bad:
        ratio = dot_gr / dot_rr if dot_rr else math.inf
        raise AllReduceGateError(
            f"{who}'s all-reduced gradient is {ratio:.3g} x the single-process gradient of the "
            f"{ranks} ranks' batches together (||diff|| / ||ref|| = {values['grad']:.3g}, allowed "
            f"{tols['grad']:.3g}; scale off by {values['scale']:.3g}, allowed {tols['scale']:.3g})"
            + (f": summed where the mean belongs ({ranks} x)" if abs(ratio - ranks) < 0.1 else "")
            + "; not timing data parallelism that trains another model", gate=GATE_NAME)
    return Gate(name=GATE_NAME, passed=True, values=values, tolerances=tols, reference=REFERENCE,
                detail={"ranks": ranks, "precision": precision, "who": who})
