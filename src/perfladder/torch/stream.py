"""Fresh, constant-shape training batches on the device.

Three properties make the stream safe to time (see ``perfladder.timing``):

* every epoch is a new random permutation, cut into *whole* batches only -- the ragged
  tail is dropped, so a compiled step never sees a second batch shape;
* every ``next()`` gathers and ships a new pair of tensors -- never one cached batch;
* ids are int64 (what ``nn.Embedding`` and ``cross_entropy`` want); on CUDA the host
  copy is pinned so the host-to-device transfer can be asynchronous.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from ..data import TimeMachine, check_batch_size

SPLITS = ("train", "val")


def batches(data: TimeMachine, batch_size: int, device, seed: int = 0,
            split: str = "train") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Infinite stream of ``(X, Y)``, each of shape (batch_size, num_steps), int64, on ``device``."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not valid; valid choices: {SPLITS}")
    X_all, Y_all = data.train_arrays() if split == "train" else data.val_arrays()
    per_epoch = check_batch_size(batch_size, len(X_all))   # error if no whole batch fits
    device = torch.device(device)
    return _generate(X_all, Y_all, int(batch_size), per_epoch, device, seed)


def _generate(X_all: np.ndarray, Y_all: np.ndarray, B: int, per_epoch: int,
              device: torch.device, seed: int):
    rng = np.random.default_rng(seed)
    pin = device.type == "cuda"
    while True:
        perm = rng.permutation(len(X_all))[: per_epoch * B]         # ragged tail dropped
        for i in range(per_epoch):
            idx = perm[i * B:(i + 1) * B]                            # (B,)
            X = torch.from_numpy(X_all[idx]).long()                  # (B, T) int64, new tensor
            Y = torch.from_numpy(Y_all[idx]).long()                  # (B, T)
            if pin:
                X, Y = X.pin_memory(), Y.pin_memory()
            yield X.to(device, non_blocking=pin), Y.to(device, non_blocking=pin)
