"""perfladder.measure.learning: the learning check's record and decision (no framework)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from perfladder.config import get_config
from perfladder.data import TimeMachine
from perfladder.measure import learning as L
from perfladder.measure.gates import GateError

FALLING = [3.3 - 0.01 * i for i in range(60)]


def test_unigram_entropy_and_threshold():
    assert L.unigram_entropy([0, 1, 2, 3], 4) == pytest.approx(math.log(4))
    assert L.unigram_entropy([5, 5, 5], 28) == 0.0
    c = get_config("smoke")
    data = TimeMachine(c.batch_size, c.num_steps, num_train=c.num_train, num_val=c.num_val)
    V = len(data.vocab)
    h = L.unigram_entropy(data.train_arrays()[1], V)
    assert 2.5 < h < math.log(V)                  # English letters: well under a uniform guess
    assert L.val_threshold(data.train_arrays()[1], V) == pytest.approx(L.THRESHOLD_FRACTION * h)
    with pytest.raises(ValueError, match="fraction"):
        L.val_threshold(np.zeros(3, int), V, fraction=1.5)


def test_an_honest_run_passes_and_round_trips():
    c = L.check_learning(FALLING, 3.33, 2.2, threshold=2.4, window=20, evaluated_with="reference")
    assert c.passed and c.reasons() == [] and c.steps == 60
    assert c.first == pytest.approx(sum(FALLING[:20]) / 20)
    d = json.loads(json.dumps(c.to_dict()))
    assert set(d) == {"steps", "window", "first", "last", "val_before", "val_after",
                      "threshold", "passed", "losses", "evaluated_with", "configuration", "seconds",
                      "phases"}
    assert L.LearningCheck.from_dict(d) == c
    with pytest.raises(ValueError, match="unknown LearningCheck field"):
        L.LearningCheck.from_dict({**d, "train_first": 1.0})


@pytest.mark.parametrize("val_after, losses, why", [
    (2.6, FALLING, "above the threshold"),                  # learns a little (frozen blocks)
    (3.5, FALLING, "validation loss did not fall"),         # trains, predicts nothing (a cheat)
    (2.2, FALLING[::-1], "training loss did not fall"),
    (float("nan"), FALLING, "above the threshold"),
])
def test_each_way_of_not_learning_fails(val_after, losses, why):
    with pytest.raises(L.LearningError, match=why) as e:
        L.check_learning(losses, 3.33, val_after, threshold=2.4, window=20, evaluated_with="ref")
    assert isinstance(e.value, GateError) and e.value.gate == "learning check"
    assert e.value.check.passed is False


def test_bad_window():
    with pytest.raises(ValueError, match="window"):
        L.judge(FALLING, 3.3, 2.0, threshold=2.4, window=0, evaluated_with="ref")
    with pytest.raises(ValueError, match="at least 200 losses"):
        L.judge(FALLING, 3.3, 2.0, threshold=2.4, window=100, evaluated_with="ref")
