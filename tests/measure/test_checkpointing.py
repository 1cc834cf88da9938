"""perfladder.measure.checkpointing: the checkpoint gate's rule (the measurements: each
framework's checks, tests/torch/test_gates.py and tests/jax/test_model.py)."""
import pytest

from perfladder.measure.checkpointing import (
    CHECKPOINT_SAVED_RATIO,
    CheckpointGateError,
    checkpoint_gate,
)
from perfladder.measure.gates import GateError


def test_fewer_saved_bytes_pass_with_the_numbers_recorded():
    g = checkpoint_gate(100, 1000, reference="base")
    assert g.passed and g.values == {"saved_ratio": 0.1}
    assert g.tolerances == {"saved_ratio": CHECKPOINT_SAVED_RATIO}
    assert g.detail == {"saved_bytes": 100, "base_saved_bytes": 1000}


@pytest.mark.parametrize("saved,base", [(1000, 1000), (600, 1000), (5, 0)])
def test_as_many_saved_bytes_as_the_base_are_refused(saved, base):
    with pytest.raises(CheckpointGateError) as e:
        checkpoint_gate(saved, base, reference="base")
    assert isinstance(e.value, GateError) and e.value.gate == "checkpoint gate"
