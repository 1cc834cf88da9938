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
from perfladder.measure.timing import Stopwatch

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


# -- the rows: evaluated on held-out windows, recorded -----------------------------------------------
ROWS = {"train": [0, 2000], "val": [2000, 2200]}


def test_the_rows_are_recorded_and_a_file_without_them_still_loads():
    c = L.check_learning(FALLING, 3.33, 2.2, threshold=2.4, window=20, rows=ROWS)
    d = json.loads(json.dumps(c.to_dict()))
    assert d["rows"] == ROWS and L.LearningCheck.from_dict(d) == c
    old = {k: v for k, v in d.items() if k != "rows"}          # a file written before rows
    assert L.LearningCheck.from_dict(old).rows is None and L.LearningCheck.from_dict(old).passed


@pytest.mark.parametrize("val", [[0, 200], [1999, 2199], [500, 600]])
def test_validation_rows_inside_the_training_rows_are_refused(val):
    """Whatever the losses say: a "validation" loss on training rows passes a model that
    memorised (about 0.17 nats lower than the held-out one at smoke)."""
    with pytest.raises(L.HeldOutRowsError, match="overlap the training rows") as e:
        L.check_learning(FALLING, 3.33, 2.2, threshold=2.4, window=20,
                         rows={"train": [0, 2000], "val": val})
    assert isinstance(e.value, L.LearningError) and e.value.gate == "held-out rows"
    assert not e.value.check.passed and e.value.check.rows["val"] == val


def test_rows_are_read_off_the_arrays_not_their_names():
    c = get_config("smoke")
    data = TimeMachine(c.batch_size, c.num_steps, num_train=c.num_train, num_val=c.num_val)
    (Xt, _), (Xv, _) = data.train_arrays(), data.val_arrays()
    assert data.rows_of(Xt) == [0, c.num_train] and data.rows_of(Xv[5:9]) == [c.num_train + 5, c.num_train + 9]
    assert L.split_rows(data, iter(()), Xv) == {"train": [0, c.num_train],
                                                 "val": [c.num_train, c.num_train + c.num_val]}
    assert L.split_rows(data, iter(()), Xt[:c.num_val])["val"] == [0, c.num_val]   # the wrong split
    for bad in (Xv.copy(), Xv[::2], np.zeros((3, c.num_steps), np.int32)):
        with pytest.raises(ValueError, match="not a slice of this corpus"):
            data.rows_of(bad)


def test_train_and_check_runs_the_parts_in_order_for_either_framework():
    """The learning check's order, framework-free: validation before, training, validation
    after, each part timed; a stream that draws the validation rows is refused."""
    c = get_config("smoke")
    data = TimeMachine(c.batch_size, c.num_steps, num_train=c.num_train, num_val=c.num_val)
    calls, watch = [], Stopwatch()
    val = iter([3.3, 2.2])

    def val_loss():
        calls.append("val")
        return next(val)

    def train():
        calls.append("train")
        return FALLING

    check = L.train_and_check(train, val_loss, data, iter(()), window=10, watch=watch)
    assert calls == ["val", "train", "val"] and check.passed
    assert (check.val_before, check.val_after) == (3.3, 2.2)
    assert check.rows == {"train": [0, c.num_train], "val": [c.num_train, c.num_train + c.num_val]}
    assert list(watch.seconds) == ["data", "val before", "train", "val after"]

    class OnValRows:
        rows = [c.num_train, c.num_train + 4]
    with pytest.raises(L.HeldOutRowsError):
        L.train_and_check(lambda: FALLING, iter([3.3, 2.2]).__next__, data, OnValRows(), window=10)
