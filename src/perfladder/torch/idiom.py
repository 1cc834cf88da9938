"""The chapter's idiom on the PyTorch side: ``from perfladder import torch as d2l``.

    device = d2l.try_gpu()
    data = d2l.TimeMachine(tokenization='char', num_steps=128, batch_size=64)
    V = len(data.vocab)
    torch.manual_seed(0)
    model = d2l.GPT(V, num_blks=6, num_hiddens=512).to(device)
    for X, Y in data.train_dataloader():           # int64 CPU tensors, (B, T) each
        ...
    d2l.plt.bar(...)                               # matplotlib.pyplot

``d2l.GPT`` is ``perfladder.torch.GPT``, which takes the chapter's ``vocab_size`` and keywords
as well as a ``GPTConfig``.
"""
from __future__ import annotations

import torch

from perfladder import data as _data
from perfladder.idiom import BatchLoader


def _permutation(n: int):
    return torch.randperm(n).numpy()     # torch's global generator: torch.manual_seed fixes it


def _to_tensor(a) -> torch.Tensor:
    return torch.from_numpy(a).long()    # gathered rows are a fresh array; int64 for nn.Embedding


class TimeMachine(_data.TimeMachine):
    """``perfladder.data.TimeMachine`` with d2l's loaders: batches of int64 torch tensors.

    ``X``, ``Y``, ``vocab``, ``num_train``, ``num_val``, ``batch_size`` are those of
    ``perfladder.data.TimeMachine`` (``X``/``Y`` numpy views of every window).
    """

    def train_dataloader(self) -> BatchLoader:
        """The training split in ``batch_size`` minibatches, reshuffled on every pass."""
        X, Y = self.train_arrays()
        return BatchLoader(X, Y, self.batch_size, True, _permutation, _to_tensor)

    def val_dataloader(self) -> BatchLoader:
        """The validation split in ``batch_size`` minibatches, in order."""
        X, Y = self.val_arrays()
        return BatchLoader(X, Y, self.batch_size, False, _permutation, _to_tensor)


def num_gpus() -> int:
    """How many CUDA devices this process sees."""
    return torch.cuda.device_count()


def try_gpu(i: int = 0) -> torch.device:
    """CUDA device ``i`` if there is one, else the CPU."""
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        raise ValueError(f"i={i!r} must be a device index >= 0")
    return torch.device(f"cuda:{i}") if num_gpus() > i else torch.device("cpu")
