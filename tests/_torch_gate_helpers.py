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


def one_cacheable_graph(model, X):
    """``model(X).sum()`` compiled on the stand-in cuBLASLt backend (``fused.epilogue``): its one
    dynamo graph (no break), which AOTAutograd's cache accepts (``check_cacheable`` raises
    BypassAOTAutogradCache otherwise), so another process can load the step's compile."""
    from torch._functorch._aot_autograd.autograd_cache import check_cacheable

    from perfladder.torch.fused import epilogue as ep
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with ep.use_backend(ep.STAND_IN):
        torch.compile(lambda x: model(x).sum(), backend=backend, fullgraph=True)(X)
    assert len(graphs) == 1
    check_cacheable(graphs[0])
    return graphs[0]


class StubGpuLab:
    """A lab on a 'GPU' that has nothing to run: a rung refused before it builds anything is
    recorded through the engine on it, and one that tries to build fails loudly."""
    framework, on_gpu, device_name, seed_top = "torch", True, "stub GPU", "R3"

    def __init__(self):
        from perfladder.results.record import LadderResult
        self.config = CFG
        self.result = LadderResult(framework="torch", device=self.device_name,
                                   config=CFG.to_dict(), baseline="R0")

    def seed_recipe(self):
        from perfladder.torch.recipe import Recipe
        return Recipe.seed(CFG)

    def recipe_from_dict(self, d):
        from perfladder.torch.recipe import Recipe
        return Recipe.from_dict(d)

    def free(self):
        pass


# relative error norms of the cuBLASLt tests: fp32 the same arithmetic up to summation order;
# bf16 against the reference's own bf16 run, both rounded to bf16 (unit roundoff 2^-8) at
# different points
FP32_REL, BF16_REL = 1e-5, 1e-2


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def assert_trains_like(ref, model, X, grad_rel=1e-4) -> None:
    """``model`` (the reference's weights, another way of computing) gives ``ref``'s logits and,
    after the same backward, its parameters' gradients; run it inside the caller's backend."""
    outs = [m(X) for m in (ref, model)]
    for y in outs:
        y.square().mean().backward()
    assert rel(outs[1].detach(), outs[0].detach()) <= FP32_REL
    for (name, p), q in zip(ref.named_parameters(), model.parameters()):
        assert rel(q.grad, p.grad) <= grad_rel, name
