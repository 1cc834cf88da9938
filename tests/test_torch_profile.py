"""The profiler leaves no tax behind: TEARDOWN_CUPTI is set at import, checked before profiling,
and (on a GPU) R0's throughput after a profile agrees with the one before it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from perfladder.config import get_config
from perfladder.torch import Ladder, profile_table, throughput


def test_import_sets_teardown_before_any_profiler_and_no_jax():
    code = ("import os, sys; assert 'TEARDOWN_CUPTI' not in os.environ; "
            "import perfladder.torch; print(os.environ['TEARDOWN_CUPTI']); "
            "print(sorted(m for m in ('jax', 'jaxlib', 'flax', 'optax') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["1", "[]"]


def test_profile_refuses_without_teardown(monkeypatch):
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    with pytest.raises(RuntimeError, match="TEARDOWN_CUPTI"):
        profile_table(lambda X, Y: X, iter([]), steps=1)


def test_profile_table_on_this_device():
    X = torch.randn(16, 16)
    stream = iter(lambda: (X @ X, None), None)
    table = profile_table(lambda A, _: (A @ A).relu(), stream, steps=2, row_limit=5)
    assert "aten::mm" in table and "Self CPU" in table


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (profiler tax is a GPU effect)")
def test_timing_after_a_profile_is_not_taxed():
    # the small batch is where a per-launch tax would show most
    ladder = Ladder(get_config("smoke"))
    step = ladder.fresh_step(compiled=False, bf16=False)
    stream = ladder.stream(ladder.config.batch_size)
    kw = dict(warmup=20, timed=50, windows=5)
    before = throughput(step, stream, **kw)
    profile_table(step, stream, steps=5)
    after = throughput(step, stream, **kw)
    allowed = max(before.spread, after.spread) + 0.03
    assert abs(after.tokens_per_s / before.tokens_per_s - 1) <= allowed, (before, after)
