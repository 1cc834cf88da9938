"""Fresh, constant-shape training batches on the device.

Three properties make the stream safe to time (see ``perfladder.measure.timing``):

* every epoch is a new random permutation, cut into *whole* batches only -- the ragged
  tail is dropped, so a compiled step never sees a second batch shape;
* every ``next()`` gathers and ships a new pair of tensors -- never one cached batch;
* ids are int64 (what ``nn.Embedding`` and ``cross_entropy`` want); on CUDA the host
  copy is pinned so the host-to-device transfer can be asynchronous.
"""
from __future__ import annotations

import numpy as np
import torch

from perfladder.data import TimeMachine, check_batch_size

SPLITS = ("train", "val")


def batches(data: TimeMachine, batch_size: int, device, seed: int = 0,
            split: str = "train") -> "Batches":
    """Infinite stream of ``(X, Y)``, each of shape (batch_size, num_steps), int64, on ``device``."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not valid; valid choices: {SPLITS}")
    X_all, Y_all = data.train_arrays() if split == "train" else data.val_arrays()
    per_epoch = check_batch_size(batch_size, len(X_all))   # error if no whole batch fits
    stream = Batches(X_all, Y_all, int(batch_size), per_epoch, torch.device(device), seed)
    # the windows it draws from: the learning check's record
    stream.rows = data.rows_of(X_all) if hasattr(data, "rows_of") else None
    return stream


class Batches:
    """The iterator ``batches`` returns. ``position`` is ``(seed, epoch, index)`` of the batch
    last handed out: the timer refuses a stream whose position does not move."""

    def __init__(self, X_all: np.ndarray, Y_all: np.ndarray, B: int, per_epoch: int,
                 device: torch.device, seed: int):
        self.X_all, self.Y_all, self.B, self.per_epoch = X_all, Y_all, B, per_epoch
        self.device, self.seed = device, seed
        self.rng = np.random.default_rng(seed)
        self.pin = device.type == "cuda"
        self.epoch, self.index, self.perm = -1, per_epoch, None
        self.position = None

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.index >= self.per_epoch:
            self.perm = self.rng.permutation(len(self.X_all))[: self.per_epoch * self.B]  # ragged tail dropped
            self.epoch, self.index = self.epoch + 1, 0
        idx = self.perm[self.index * self.B:(self.index + 1) * self.B]    # (B,)
        self.position = (self.seed, self.epoch, self.index)
        self.index += 1
        X = torch.from_numpy(self.X_all[idx]).long()                      # (B, T) int64, new tensor
        Y = torch.from_numpy(self.Y_all[idx]).long()                      # (B, T)
        if self.pin:
            X, Y = X.pin_memory(), Y.pin_memory()
        return X.to(self.device, non_blocking=self.pin), Y.to(self.device, non_blocking=self.pin)
