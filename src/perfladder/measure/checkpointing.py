"""The checkpoint gate: a checkpointed step must hold fewer saved activations than its base
(no framework imports; each side measures: ``perfladder.torch.checks.saved_activation_bytes``,
``perfladder.jax.checks.saved_residual_bytes``).

R4's mirror check proves that checkpointing computes the same logits, which is also true of a
"checkpoint" that recomputes nothing (each block called directly): both keep every
activation for the backward pass, and only the memory the rung exists to save tells them
apart. So the gate counts the bytes one forward leaves saved for the backward -- the tensors
autograd packs (PyTorch), the residuals of ``jax.vjp`` (JAX), parameters left out since both
sides keep those -- in the candidate and in the same recipe without checkpointing, and asks
for at most ``CHECKPOINT_SAVED_RATIO`` of the base's.

The tolerance. A checkpointed block keeps only its input; what stays saved is the embedding,
the final norm, the output projection and the loss's inputs. Measured at smoke (2 blocks,
batch 8): PyTorch 0.10 (fp32) and 0.14 (bf16 autocast), JAX 0.08 and 0.09; more blocks make
it smaller. A checkpoint that recomputes nothing saves exactly what its base saves (1.0); one
that wraps one block of two, about 0.55. Half the base's bytes sits 3.5x over the honest
worst and under both.
"""
from __future__ import annotations

from perfladder.measure.evidence import Gate
from perfladder.measure.gates import GateError

CHECKPOINT_SAVED_RATIO = 0.5
GATE_NAME = "checkpoint gate"


class CheckpointGateError(GateError):
    """A checkpointed step keeps (nearly) every activation its base keeps: nothing is recomputed."""


def checkpoint_gate(saved_bytes: int, base_bytes: int, *, reference: str,
                    max_ratio: float = CHECKPOINT_SAVED_RATIO) -> Gate:
    """The gate's verdict on the bytes one forward saves for the backward, the checkpointed
    candidate's (``saved_bytes``) against its base's (``base_bytes``). Returns the evidence;
    ``CheckpointGateError`` when the ratio is above ``max_ratio`` (or the base saved nothing,
    which leaves nothing to compare)."""
    saved, base = int(saved_bytes), int(base_bytes)
    if base <= 0:
        raise CheckpointGateError(f"the base ({reference}) saved {base} bytes for the backward: "
                                  "nothing to compare the checkpointed step with", gate=GATE_NAME)
    ratio = saved / base
    if not ratio <= max_ratio:
        raise CheckpointGateError(
            f"the checkpointed step saves {saved} bytes of activations for the backward, "
            f"{ratio:.2f} of its base's {base} ({reference}); allowed at most {max_ratio:g}: "
            "it recomputes nothing, so it is not activation checkpointing", gate=GATE_NAME)
    return Gate(name=GATE_NAME, passed=True, values={"saved_ratio": ratio},
                tolerances={"saved_ratio": max_ratio}, reference=reference,
                detail={"saved_bytes": saved, "base_saved_bytes": base})
