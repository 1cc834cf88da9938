"""A planted data split both frameworks' learning-check tests share (framework-free)."""
from __future__ import annotations

from perfladder.data import TimeMachine


class TrainRowsAsValidation(TimeMachine):
    """The planted split: its "validation" windows are the first training windows."""

    def val_arrays(self):
        return self.X[:self.num_val], self.Y[:self.num_val]
