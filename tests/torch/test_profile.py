"""Profiling leaves no trace: TEARDOWN_CUPTI is set at import and checked before a GPU profile,
kineto's trace lines are filtered from stderr and nothing else is, the profile of a rung is
its ``ProfileSummary``, and (on a GPU) a step timed after a profile runs as fast as before it."""
from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from perfladder.config import get_config
from perfladder.kernels import KernelBreakdown
from perfladder.measure.evidence import ProfileSummary
from perfladder.torch import TorchLab, kernel_breakdown, throughput
from perfladder.torch.kernels import quiet_kineto
from perfladder.torch.profile import summary_of


def test_import_sets_teardown_before_any_profiler_and_no_jax():
    code = ("import os, sys; assert 'TEARDOWN_CUPTI' not in os.environ; "
            "import perfladder.torch; print(os.environ['TEARDOWN_CUPTI']); "
            "print(sorted(m for m in ('jax', 'jaxlib', 'flax', 'optax') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["1", "[]"]


def test_a_gpu_profile_refuses_without_teardown(monkeypatch):
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    on_cuda = SimpleNamespace(device=SimpleNamespace(type="cuda"))      # a batch that lives on a GPU

    def step(X, Y):
        raise AssertionError("stepped before the check")
    with pytest.raises(RuntimeError, match="TEARDOWN_CUPTI is not '1'"):
        kernel_breakdown(step, iter([(on_cuda, None)]), steps=1)


def test_kernel_breakdown_of_a_cpu_step():
    X = torch.randn(16, 16)
    stream = iter(lambda: (X @ X, None), None)
    kb = kernel_breakdown(lambda A, _: (A @ A).relu(), stream, steps=2, warmup=1, top=5)
    assert isinstance(kb, KernelBreakdown) and kb.device == "cpu" and kb.framework == "torch"
    assert kb.steps == 2 and kb.total_us > 0 and len(kb.top) <= 5
    assert any(k.name == "aten::mm" for k in kb.top) and kb.share("matmul") > 0
    s = summary_of(kb)
    assert isinstance(s, ProfileSummary) and s.steps == 2 and "CPU operators" in s.tool
    assert s.device_ms == pytest.approx(kb.total_us / 2 / 1000)
    assert s.shares == kb.category_share and s.rows[0]["device_ms"] > 0


@pytest.mark.parametrize("kw, name", [(dict(steps=0), "steps=0"), (dict(warmup=-1), "warmup=-1"),
                                      (dict(top=True), "top=True")])
def test_kernel_breakdown_bad_counts(kw, name):
    with pytest.raises(ValueError, match=name):
        kernel_breakdown(lambda X, Y: X, iter([]), **kw)


def test_quiet_kineto_drops_only_the_trace_lines(capfd):
    with quiet_kineto():
        os.write(2, b"USDT: kineto profiler_start\n")
        os.write(2, b"a real warning\n")
        os.write(2, b"USDT: kineto profiler_stop\n")
        print("to stdout", flush=True)
    out, err = capfd.readouterr()
    assert "a real warning" in err and "USDT" not in err and "to stdout" in out
    with quiet_kineto():
        os.write(2, b"USDT: something else entirely\n")               # not a profiler start/stop
    assert "USDT: something else entirely" in capfd.readouterr().err


def test_quiet_kineto_restores_stderr_after_an_error(capfd):
    with pytest.raises(KeyError):
        with quiet_kineto():
            os.write(2, b"before the error\n")
            raise KeyError("x")
    os.write(2, b"after the block\n")
    err = capfd.readouterr().err
    assert "before the error" in err and "after the block" in err


def test_a_lab_profile_is_a_profile_summary():
    lab = TorchLab(get_config("smoke"))
    step = lab.build_step(lab.seed_recipe())
    p = lab.profile(step, lab.config.batch_size)
    assert isinstance(p, ProfileSummary) and p.steps == 2 and p.device_ms > 0
    assert p.shares["optimizer"] > 0 and any(r["name"].startswith("aten::") for r in p.rows)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (profiler tax is a GPU effect)")
def test_timing_after_a_profile_is_not_taxed():
    # the small batch is where a per-launch tax would show most
    lab = TorchLab(get_config("smoke"))
    step = lab.build_step(lab.seed_recipe())
    stream = lab.stream(lab.config.batch_size)
    # windows of 200 tiny steps (a fraction of a second each on a GPU) after a long warm-up:
    # shorter ones wander with the clocks of an idle device and never settle
    kw = dict(warmup=100, timed=200, windows=3)
    before = throughput(step, stream, **kw)
    with quiet_kineto():
        kb = kernel_breakdown(step, stream, steps=5)
    assert kb.device == "gpu" and kb.total_us > 0
    after = throughput(step, stream, **kw)
    assert before.stable and after.stable, (before, after)
    allowed = max(before.spread, after.spread) + 0.03
    assert abs(after.tokens_per_s / before.tokens_per_s - 1) <= allowed, (before, after)
