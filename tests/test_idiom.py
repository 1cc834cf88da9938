"""The chapter's idiom runs: ``from perfladder import torch as d2l`` / ``jax as d2l`` provide
``TimeMachine`` (with ``train_dataloader``), ``GPT(vocab_size, ...)``, ``try_gpu``,
``num_gpus`` and ``plt``, and chapter-style code trains a tiny model with them on the CPU."""
from __future__ import annotations

import math

import numpy as np
import pytest

from perfladder.config import GPTConfig

TINY = dict(batch_size=8, num_steps=16, tokenization="char", num_train=64, num_val=16)


def _rows(a) -> np.ndarray:
    """Rows of a (n, T) array sorted lexicographically: a multiset of windows."""
    a = np.asarray(a)
    return a[np.lexsort(a.T[::-1])]


def _check_dataset(data, d2l_batches):
    assert (data.num_train, data.num_val, data.batch_size) == (64, 16, 8)
    assert data.X.shape[1] == data.Y.shape[1] == 16
    batches = [(np.asarray(X), np.asarray(Y)) for X, Y in d2l_batches]
    assert len(batches) == len(data.train_dataloader()) == 8
    assert all(X.shape == Y.shape == (8, 16) for X, Y in batches)
    X_all = np.concatenate([X for X, _ in batches])
    Y_all = np.concatenate([Y for _, Y in batches])
    np.testing.assert_array_equal(Y_all[:, :-1], X_all[:, 1:])       # Y is X shifted by one
    Xt, _ = data.train_arrays()
    np.testing.assert_array_equal(_rows(X_all), _rows(Xt))            # one pass = the split, once


# -- PyTorch ---------------------------------------------------------------------------------
def test_torch_chapter_idiom_trains_one_step():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from perfladder import torch as d2l

    device = d2l.try_gpu()
    data = d2l.TimeMachine(**TINY)
    V = len(data.vocab)
    assert V == 28
    torch.manual_seed(0)
    model = d2l.GPT(V, num_hiddens=32, num_blks=2).to(device)
    torch.manual_seed(0)
    same = d2l.GPT(GPTConfig(vocab_size=V, num_hiddens=32, num_blks=2)).to(device)
    assert model.config == same.config
    for (name, a), (_, b) in zip(model.state_dict().items(), same.state_dict().items()):
        assert torch.equal(a, b), name

    loader = data.train_dataloader()
    first = next(iter(loader))
    assert all(isinstance(t, torch.Tensor) and t.dtype == torch.int64 for t in first)
    _check_dataset(data, loader)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    X, Y = first[0].to(device), first[1].to(device)
    loss = F.cross_entropy(model(X).flatten(0, 1), Y.flatten())
    loss.backward()
    opt.step()
    assert abs(loss.item() - math.log(V)) < 0.1     # near-uniform logits at init
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_torch_loader_shuffles_from_torch_seed_and_keeps_the_ragged_tail():
    torch = pytest.importorskip("torch")
    from perfladder import torch as d2l

    data = d2l.TimeMachine(batch_size=30, num_steps=16, num_train=64, num_val=16)
    loader = data.train_dataloader()
    assert len(loader) == 3
    torch.manual_seed(1)
    a = [X.clone() for X, _ in loader]
    b = [X.clone() for X, _ in loader]                        # the next pass: a new order
    torch.manual_seed(1)
    c = [X.clone() for X, _ in loader]
    assert [len(X) for X in a] == [30, 30, 4]                # like d2l: the last batch is short
    assert all(torch.equal(x, y) for x, y in zip(a, c))
    assert not all(torch.equal(x, y) for x, y in zip(a, b))
    val = [X for X, _ in data.val_dataloader()]              # in order, not shuffled
    np.testing.assert_array_equal(torch.cat(val).numpy(), data.val_arrays()[0])


def test_torch_devices_and_plt():
    torch = pytest.importorskip("torch")
    from perfladder import torch as d2l
    assert d2l.num_gpus() == torch.cuda.device_count()
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert d2l.try_gpu().type == expected
    assert d2l.try_gpu(d2l.num_gpus()).type == "cpu"          # past the last GPU: the CPU
    with pytest.raises(ValueError, match="i=-1"):
        d2l.try_gpu(-1)
    import matplotlib.pyplot
    assert d2l.plt is matplotlib.pyplot
    with pytest.raises(AttributeError, match="no attribute 'plot'"):
        d2l.plot


# -- JAX -------------------------------------------------------------------------------------
def test_jax_chapter_idiom_trains_one_step():
    jax = pytest.importorskip("jax")
    import optax
    from flax import nnx

    from perfladder import jax as d2l

    data = d2l.TimeMachine(**TINY)
    V = len(data.vocab)
    model = d2l.GPT(V, num_hiddens=32, num_blks=2, rngs=nnx.Rngs(0))
    same = d2l.GPT(GPTConfig(vocab_size=V, num_hiddens=32, num_blks=2), rngs=nnx.Rngs(0))
    assert model.config == same.config
    for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)),
                    jax.tree.leaves(nnx.state(same, nnx.Param))):
        np.testing.assert_array_equal(a, b)

    loader = data.train_dataloader()
    X, Y = next(iter(loader))
    assert isinstance(X, jax.Array) and X.dtype == np.int32 and X.shape == (8, 16)
    _check_dataset(data, loader)

    opt = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    before = [np.asarray(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param))]

    def loss_fn(model):
        logits = model(X)                                      # (B, T, V)
        per_token = optax.softmax_cross_entropy_with_integer_labels(logits, Y)   # (B, T)
        return per_token.mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    assert abs(float(loss) - math.log(V)) < 0.1
    after = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert all(not np.array_equal(a, np.asarray(p)) for a, p in zip(before, after))


def test_jax_loader_seeded_and_devices_and_plt():
    jax = pytest.importorskip("jax")
    from perfladder import jax as d2l

    def passes(seed):
        data = d2l.TimeMachine(batch_size=30, num_steps=16, num_train=64, num_val=16, seed=seed)
        loader = data.train_dataloader()
        return [[np.asarray(X) for X, _ in loader] for _ in range(2)]
    (a, b), (c, _) = passes(0), passes(0)
    assert [len(X) for X in a] == [30, 30, 4] and len(d2l.TimeMachine(**TINY).train_dataloader()) == 8
    assert all(np.array_equal(x, y) for x, y in zip(a, c))   # same seed, same order
    assert not all(np.array_equal(x, y) for x, y in zip(a, b))   # each pass reshuffles
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    assert d2l.num_gpus() == len(gpus)
    assert d2l.try_gpu().platform == ("gpu" if gpus else "cpu")
    import matplotlib.pyplot
    assert d2l.plt is matplotlib.pyplot


@pytest.mark.parametrize("kw, match", [
    (dict(config=GPTConfig(), num_blks=2), "either a GPTConfig or a vocab_size"),
    (dict(config=28, num_block=2), r"unknown GPT argument\(s\) num_block; valid choices: num_hiddens"),
    (dict(config=True), "GPTConfig or a vocab_size"),
    (dict(config="28"), "GPTConfig or a vocab_size"),
])
def test_gpt_arguments_checked_in_both_frameworks(kw, match):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    from flax import nnx

    from perfladder import jax as pj
    from perfladder import torch as pt
    config = kw.pop("config")
    with pytest.raises(TypeError, match=match):
        pt.GPT(config, **kw)
    with pytest.raises(TypeError, match=match):
        pj.GPT(config, rngs=nnx.Rngs(0), **kw)
