"""perfladder.ladder.lab.Lab: both labs keep the contract, members and signatures, and
``measure`` returns the same record on both sides."""
from __future__ import annotations

import inspect
import typing

import pytest

from perfladder.config import get_config
from perfladder.ladder.lab import Lab, Measured

METHODS = [n for n, v in vars(Lab).items() if callable(v) and not n.startswith("_")]
ATTRIBUTES = list(typing.get_type_hints(Lab))


@pytest.fixture(scope="module", params=["torch", "jax"])
def lab(request):
    if request.param == "torch":
        from perfladder.torch.lab import TorchLab
        return TorchLab(get_config("smoke"), device="cpu", probe=False)
    from perfladder.jax.lab import JaxLab
    return JaxLab(get_config("smoke"), probe=False)


def test_the_protocol_lists_what_the_engine_uses():
    assert {"framework", "config", "result", "seed_top", "code"} <= set(ATTRIBUTES)
    assert {"use", "build_step", "measure", "free", "kernel_report", "learning_check"} <= set(METHODS)


def test_each_lab_has_every_member_of_the_protocol(lab):
    assert isinstance(lab, Lab)
    missing = [n for n in ATTRIBUTES + METHODS if not hasattr(lab, n)]
    assert missing == []
    assert lab.framework in ("torch", "jax") and isinstance(lab.code, dict)


@pytest.mark.parametrize("name", METHODS)
def test_each_method_takes_the_protocols_arguments(lab, name):
    """Every parameter of the protocol's method is the lab's, in the same place and kind; what
    the lab adds has a default (the engine never passes it)."""
    want = list(inspect.signature(getattr(Lab, name)).parameters.values())[1:]
    got = list(inspect.signature(getattr(type(lab), name)).parameters.values())[1:]
    for w in want:
        if w.kind is inspect.Parameter.VAR_KEYWORD:
            assert any(g.kind is w.kind for g in got), (name, got)
            continue
        same = [g for g in got if g.name == w.name]
        assert same and same[0].kind == w.kind, (name, w, got)
        if w.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            assert got.index(same[0]) == want.index(w), (name, w, got)
    extra = [g for g in got if g.name not in {w.name for w in want}
             and g.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]
    assert all(g.default is not inspect.Parameter.empty for g in extra), (name, extra)


def test_measure_returns_one_record_on_both_sides(lab, monkeypatch):
    """The same ``Measured`` from both labs: the timer's throughput, whether it remeasured, and
    the memory (PyTorch's measured peak; None in JAX, which reads its plan)."""
    from perfladder.measure.timing import Throughput
    module = inspect.getmodule(type(lab))
    t = Throughput(tokens_per_s=1.0, windows=[1.0, 1.0], seconds=[0.01, 0.01], steps_per_window=1,
                   tokens_per_window=1, warmup=0, stable=True)
    monkeypatch.setattr(module, "throughput", lambda *a, **kw: t)
    monkeypatch.setattr(lab, "stream", lambda *a, **kw: iter(()))
    got = lab.measure(None, 8)
    assert isinstance(got, Measured) and got.throughput is t and got.remeasured is False
    assert (got.memory is None) == (lab.framework == "jax")
    assert typing.get_type_hints(type(lab).measure)["return"] is Measured
