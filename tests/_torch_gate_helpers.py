"""Shared by the PyTorch gate tests: the smoke data, fixed batches, fresh models and steps from
the same initial weights."""
from __future__ import annotations

import pytest
import torch

from perfladder.config import get_config
from perfladder.data import TimeMachine
from perfladder.torch.model import GPT
from perfladder.torch.step import make_optimizer, make_step
from perfladder.torch.stream import batches

CFG = get_config("smoke")
DATA = TimeMachine(CFG.batch_size, CFG.num_steps, num_train=CFG.num_train, num_val=CFG.num_val)
GPT_CFG = CFG.gpt(vocab_size=len(DATA.vocab))


def fixed(batch_size, n=1, seed=7):
    s = batches(DATA, batch_size, "cpu", seed=seed)
    return [next(s) for _ in range(n)]


def model(**kw):
    torch.manual_seed(CFG.seed)
    return GPT(GPT_CFG, **kw)


def step(m=None, optimizer="default", **kw):
    m = model() if m is None else m
    return make_step(m, make_optimizer(m, CFG.lr, optimizer), device_type="cpu",
                     compile_optimizer=optimizer == "compiled", **kw)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)                  # the smoke model's ops are tiny
    yield
    torch.set_num_threads(before)
