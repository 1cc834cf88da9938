"""A short ``torch.profiler`` run of a step, as a table of the top operators/kernels."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import torch

from .timer import sync


def profile_table(step, stream, steps: int = 5, row_limit: int = 8) -> str:
    """Profile ``steps`` calls of ``step`` (CPU + CUDA activities on a GPU, CPU only on CPU).

    Sorted by self device time on a GPU (the kernels that take the time), by self CPU
    time on CPU. Refuses to run without ``TEARDOWN_CUPTI=1`` (set by importing
    ``perfladder.torch``): without it the profiler's CUDA instrumentation outlives the
    ``with`` block and taxes every later timing in the process.
    """
    if os.environ.get("TEARDOWN_CUPTI") != "1":
        raise RuntimeError("TEARDOWN_CUPTI is not '1': profiling now would tax every later "
                           "measurement in this process (import perfladder.torch first)")
    on_gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_gpu:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    out = None
    with _drop_kineto_trace_lines():
        with torch.profiler.profile(activities=activities, acc_events=True) as prof:
            for _ in range(steps):
                out = step(*next(stream))
            sync(out)
    sort_by = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)


@contextlib.contextmanager
def _drop_kineto_trace_lines():
    """Some torch builds' kineto print ``USDT:... profiler_start/stop`` trace lines straight
    to file descriptor 2 on every profile. Capture fd 2 for the block and pass everything
    else through to ``sys.stderr`` unchanged, so that only those two lines disappear."""
    try:
        fd = sys.__stderr__.fileno()
    except (AttributeError, OSError, ValueError):      # no real stderr: nothing to filter
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if not (ln.startswith("USDT:") and "profiler_st" in ln)]
            if kept:
                sys.stderr.write("".join(kept))
