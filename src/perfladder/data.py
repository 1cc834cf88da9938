"""The corpus: H. G. Wells' *The Time Machine*, character-level, numpy only.

The text ships inside the package (``perfladder/assets/timemachine.txt``) and is
checked against the sha1 that d2l uses for the same file, so nothing is downloaded
and a damaged copy is refused rather than silently trained on.

Processing follows d2l's ``TimeMachine`` exactly, so that ``X``/``Y``/``vocab`` are
value-for-value what ``d2l.TimeMachine(batch_size, num_steps)`` would give:

* every run of non-letters becomes one space, then everything is lowercased;
* tokens are single characters;
* the vocabulary is the *sorted* set of tokens plus ``'<unk>'`` (28 entries:
  ``' '``, ``'<unk>'``, ``'a'`` ... ``'z'``);
* every window of ``num_steps + 1`` consecutive tokens is one example;
  ``X`` is its first ``num_steps`` tokens, ``Y`` the last ``num_steps``.
"""
from __future__ import annotations

import collections
import hashlib
import re
from importlib import resources
from pathlib import Path

import numpy as np

from perfladder.checks import check_int

SHA1 = "090b5e7e70c295757f55df93cb0a180b9691891a"
TOKENIZATIONS = ("char",)


class CorpusError(ValueError):
    """The corpus file is missing or is not the expected text."""


def corpus_path() -> Path:
    """Where the shipped copy of the text lives."""
    return Path(str(resources.files("perfladder") / "assets" / "timemachine.txt"))


def read_corpus(path: str | Path | None = None) -> str:
    """Return the raw text, after checking its sha1."""
    path = corpus_path() if path is None else Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError as e:
        raise CorpusError(f"corpus file not found: {path}") from e
    digest = hashlib.sha1(raw).hexdigest()
    if digest != SHA1:
        raise CorpusError(
            f"corpus {path} has sha1 {digest}, expected {SHA1} "
            "(the d2l timemachine.txt); refusing to train on a different text")
    return raw.decode("utf-8")


def preprocess(text: str) -> str:
    """Non-letters -> one space, lowercase (d2l's rule)."""
    return re.sub("[^A-Za-z]+", " ", text).lower()


class Vocab:
    """Token <-> index maps; indices are positions in the sorted token list."""

    def __init__(self, tokens=(), min_freq: int = 0, reserved_tokens=()):
        tokens = list(tokens)
        if tokens and isinstance(tokens[0], list):
            tokens = [t for line in tokens for t in line]
        counter = collections.Counter(tokens)
        self.token_freqs = sorted(counter.items(), key=lambda kv: kv[1], reverse=True)
        kept = [t for t, f in self.token_freqs if f >= min_freq]
        self.idx_to_token = sorted(set(["<unk>", *reserved_tokens, *kept]))
        self.token_to_idx = {t: i for i, t in enumerate(self.idx_to_token)}

    def __len__(self) -> int:
        return len(self.idx_to_token)

    def __getitem__(self, tokens):
        if not isinstance(tokens, (list, tuple)):
            return self.token_to_idx.get(tokens, self.unk)
        return [self[t] for t in tokens]

    def to_tokens(self, indices):
        if hasattr(indices, "__len__") and len(indices) > 1:
            return [self.idx_to_token[int(i)] for i in indices]
        return self.idx_to_token[int(np.asarray(indices).reshape(-1)[0])]

    @property
    def unk(self) -> int:
        return self.token_to_idx["<unk>"]


class TimeMachine:
    """Character-level windows of the novel, d2l-compatible.

    ``X[i]`` / ``Y[i]`` are int32 arrays of shape ``(num_steps,)``; the first
    ``num_train`` windows are the training split, the next ``num_val`` validation.
    ``X`` and ``Y`` are read-only views of the corpus (every window, as in d2l, but none
    of them copied); index or slice them to get arrays of your own.
    """

    def __init__(self, batch_size: int, num_steps: int, num_train: int = 10000,
                 num_val: int = 5000, tokenization: str = "char", path=None):
        if tokenization not in TOKENIZATIONS:
            raise ValueError(f"tokenization={tokenization!r} is not supported; "
                             f"valid choices: {TOKENIZATIONS}")
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.num_steps = check_int("num_steps", num_steps, 1)
        self.num_train = check_int("num_train", num_train, 1)
        self.num_val = check_int("num_val", num_val, 0)
        num_steps, num_train, num_val = self.num_steps, self.num_train, self.num_val
        tokens = list(preprocess(read_corpus(path)))
        self.vocab = Vocab(tokens)
        corpus = np.asarray(self.vocab[tokens], dtype=np.int32)
        if num_steps + 1 > len(corpus):
            raise ValueError(f"num_steps={num_steps} is longer than the corpus: a window holds "
                             f"num_steps + 1 = {num_steps + 1} tokens and the corpus has "
                             f"{len(corpus)}")
        n_windows = len(corpus) - num_steps
        if num_train + num_val > n_windows:
            raise ValueError(
                f"num_train + num_val = {num_train + num_val} exceeds the "
                f"{n_windows} windows of length {num_steps + 1} in the corpus "
                f"({len(corpus)} tokens)")
        if self.batch_size > num_train:
            raise ValueError(
                f"batch_size={self.batch_size} is larger than the {num_train} training "
                "windows; not even one whole batch fits")
        # Window i is corpus[i : i + num_steps + 1]. A strided, read-only view of the corpus,
        # not a copy: the windows overlap, so materialising them all would take
        # (len(corpus) - num_steps) * (num_steps + 1) * 4 bytes -- 46 GiB at num_steps=50000.
        # Only what is gathered from it (a batch, a split) is ever copied.
        windows = np.lib.stride_tricks.sliding_window_view(corpus, num_steps + 1)  # (n, T + 1)
        self.X, self.Y = windows[:, :-1], windows[:, 1:]  # (n, T) each, views

    def train_arrays(self):
        """(X, Y) of the training split."""
        return self.X[: self.num_train], self.Y[: self.num_train]

    def val_arrays(self):
        s = slice(self.num_train, self.num_train + self.num_val)
        return self.X[s], self.Y[s]

    def rows_of(self, X) -> list[int]:
        """``[start, stop)``: the windows ``X`` holds, read off where it lies in the corpus --
        what a split's arrays are, not what they were called. ``X`` must be consecutive rows of
        ``self.X`` (a slice of it, as ``train_arrays`` and ``val_arrays`` give); a copy cannot
        say where it came from and is refused."""
        base = self.X
        X = X if isinstance(X, np.ndarray) else None
        if (X is None or X.ndim != 2 or X.shape[1:] != base.shape[1:]
                or X.strides != base.strides or not np.may_share_memory(X, base)):
            raise ValueError(f"{'an array' if X is None else f'an array of shape {X.shape}'} that "
                             "is not a slice of this corpus' windows (TimeMachine.X): which rows "
                             "it holds cannot be told; pass train_arrays() / val_arrays() or a "
                             "slice of them")
        offset = X.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        start, rem = divmod(offset, base.strides[0])
        if rem or start < 0 or start + len(X) > len(base):
            raise ValueError(f"an array at byte offset {offset} of the corpus is not whole "
                             f"windows of TimeMachine.X (rows 0..{len(base)})")
        return [int(start), int(start + len(X))]

    def __repr__(self) -> str:
        return (f"TimeMachine(batch_size={self.batch_size}, num_steps={self.num_steps}, "
                f"num_train={self.num_train}, num_val={self.num_val}, vocab={len(self.vocab)})")


def check_batch_size(batch_size: int, num_examples: int) -> int:
    """Whole batches available per epoch; a clear error if there are none."""
    batch_size = check_int("batch_size", batch_size)
    if batch_size > num_examples:
        raise ValueError(f"batch_size={batch_size} is larger than the data "
                         f"({num_examples} examples): no whole batch fits")
    return num_examples // batch_size
