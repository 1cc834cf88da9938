"""PyTorch's kernel-level time breakdown (profile a few steps, sort the device kernels), and the
attention kernels timed alone on the model's shapes (rung B7's evidence).

``kernel_breakdown(step, stream)`` warms ``step`` up, runs ``steps`` more calls under
``torch.profiler.profile`` (CPU + CUDA activities on a GPU) and sums the device events --
kernels, memcpys, memsets; never the GPU-side copies of ``record_function`` ranges, which
would count their kernels twice -- by category (``perfladder.kernels``).

A kernel launched inside ``Optimizer.step`` (torch's own ``record_function`` range around
every optimizer step) counts as 'optimizer' whatever its name: the launching CPU operator is
found through the kernel's correlation id, and its ancestors are searched for the range.

On CPU there are no kernels: the breakdown has ``device='cpu'`` and sums the *self* CPU time
of the operators (``aten::addmm``, ``aten::_scaled_dot_product_flash_attention_for_cpu``, ...),
which does not double count nested operators.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time

import torch

from perfladder.checks import check_int
from perfladder.kernels import KernelBreakdown, breakdown, categorize
from perfladder.measure.timing import RecompileError
from perfladder.torch.timer import compile_count, sync

OPTIMIZER_RANGE = re.compile(r"^Optimizer\.(step|zero_grad)#")
import warnings

import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from perfladder.torch.model import ATTN_BACKENDS


def _device_type():
    return torch.autograd.DeviceType


def _self_device_us(evt) -> float:
    """Self device time of a device event (``self_device_time_total`` on current torch,
    ``self_cuda_time_total`` on older), falling back to the event's own time range."""
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        v = getattr(evt, attr, None)
        if v:
            return float(v)
    return float(evt.time_range.elapsed_us())


DEVICE_ACTIVITIES = ("kernel", "memcpy", "memset")
_NOT_WORK = re.compile(r"^(context|stream|event|device)\s+(sync|synchronize|wait)", re.IGNORECASE)


def _is_device_work(evt) -> bool:
    """A kernel, memcpy or memset -- not a ``record_function`` range mirrored on the GPU
    timeline ('gpu_user_annotation': its kernels are already counted), not a CUDA
    synchronization record (time spent waiting, not working)."""
    kind = str(getattr(evt, "activity_type", "") or "").lower()
    if kind:                                    # torch versions that say what the event is
        return any(k in kind for k in DEVICE_ACTIVITIES)
    return not (getattr(evt, "is_user_annotation", False) or _NOT_WORK.match(evt.name or ""))


def _in_optimizer(evt) -> bool:
    while evt is not None:
        if OPTIMIZER_RANGE.match(evt.name or ""):
            return True
        evt = evt.cpu_parent
    return False


def _gpu_events(events) -> list[tuple[str, float, str | None]]:
    DT = _device_type()
    cpu_by_id = {}
    for e in events:
        if e.device_type == DT.CPU and not getattr(e, "linked_correlation_id", 0):
            cpu_by_id.setdefault(e.id, e)
    out = []
    for e in events:
        if e.device_type != DT.CUDA or not _is_device_work(e):
            continue
        launcher = cpu_by_id.get(getattr(e, "linked_correlation_id", 0) or None)
        cat = "optimizer" if launcher is not None and _in_optimizer(launcher) else None
        out.append((e.name, _self_device_us(e), cat))
    return out


def _gpu_spans(events) -> list[tuple[float, float] | None]:
    """``(start_us, end_us)`` of the events ``_gpu_events`` picks, in its order (``None`` where
    an event has no time range): their union is the time the device was busy."""
    DT = _device_type()
    out = []
    for e in events:
        if e.device_type != DT.CUDA or not _is_device_work(e):
            continue
        tr = getattr(e, "time_range", None)
        start, end = getattr(tr, "start", None), getattr(tr, "end", None)
        out.append((float(start), float(end)) if isinstance(start, (int, float))
                   and isinstance(end, (int, float)) and end >= start else None)
    return out


def _cpu_events(events) -> list[tuple[str, float, str | None]]:
    DT = _device_type()
    out = []
    for e in events:
        if e.device_type != DT.CPU or getattr(e, "is_async", False):
            continue
        us = float(e.self_cpu_time_total)
        if us <= 0:
            continue
        out.append((e.name, us, "optimizer" if _in_optimizer(e) else None))
    return out


def kernel_breakdown(step, stream, steps: int = 5, warmup: int = 3, top: int = 10) -> KernelBreakdown:
    """Where the device time of ``step(X, Y)`` goes: a ``perfladder.kernels.KernelBreakdown``.

    ``warmup`` calls first (compilation, autotuning, allocator growth), then ``steps`` calls
    under the profiler, closed by a sync. A compilation during the profiled calls raises
    ``RecompileError``. The device is the batches' (CUDA kernels when they live on a GPU,
    CPU operators otherwise).
    """
    for name, v, lo in (("steps", steps, 1), ("warmup", warmup, 0), ("top", top, 1)):
        check_int(name, v, lo)
    X, Y = next(stream)
    on_gpu = X.device.type == "cuda"
    if on_gpu and os.environ.get("TEARDOWN_CUPTI") != "1":
        raise RuntimeError("TEARDOWN_CUPTI is not '1': profiling now would tax every later "
                           "measurement in this process (import perfladder.torch first)")
    out = step(X, Y) if warmup else None
    for _ in range(warmup - 1):
        out = step(*next(stream))
    sync(out)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_gpu:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    before = compile_count()
    with torch.profiler.profile(activities=activities, acc_events=True) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            out = step(*next(stream))
        sync(out)
        wall_us = (time.perf_counter() - t0) * 1e6
    compiled = compile_count() - before
    if compiled:
        raise RecompileError(f"{compiled} compilation(s) happened while profiling {steps} steps; "
                             "warm up past compilation (raise warmup) and keep one batch shape")
    events = prof.events()
    picked = _gpu_events(events) if on_gpu else _cpu_events(events)
    if not picked:
        raise RuntimeError(f"the profile of {steps} steps recorded no "
                           f"{'CUDA kernels' if on_gpu else 'CPU operators'}"
                           + ("; is CUPTI available to the profiler?" if on_gpu else ""))
    notes = [f"torch {torch.__version__}; " + (
        "CUDA kernels, memcpys and memsets (self device time)" if on_gpu else
        "CPU run: the events are aten operators' self CPU time, not GPU kernels")]
    n_opt = sum(1 for n, _, c in picked if c == "optimizer" and categorize(n) != "optimizer")
    if n_opt:
        notes.append(f"{n_opt} event(s) counted as optimizer because they ran inside Optimizer.step "
                     "(their names alone say otherwise)")
    return breakdown(picked, steps, top, device="gpu" if on_gpu else "cpu", framework="torch",
                     wall_us=wall_us, notes=notes, spans=_gpu_spans(events) if on_gpu else None)


@contextlib.contextmanager
def quiet_kineto():
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


# -- attention kernels alone (rung B7's evidence) --------------------------------------------
BACKENDS = ("flash", "efficient", "cudnn", "math")   # the SDPA kernels B7 measures


def time_attention(attend, backend=None, reps=20):
    """B7: median ms of attend() (causal attention, forward and backward) with SDPA
    pinned to `backend` (None: PyTorch's own pick). A kernel that cannot take the
    inputs raises when it is pinned."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        attend()                                    # the warm-up, or the refusal
        sync()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            attend()
            sync()                                  # the clock stops on the kernels
            times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[reps // 2]


def attention_backends(lab, batch_size: int, reps: int | None = None) -> dict:
    """Causal SDPA forward + backward on the model's q/k/v shape in bf16, for PyTorch's own
    choice ('default') and each of ``BACKENDS`` pinned, each timed by the lab's
    ``time_attention`` technique: ``{name: {"available", "ms" | "error"}}``."""
    c = lab.gpt_config
    B, H, T, Dh = batch_size, c.num_heads, lab.config.num_steps, c.head_dim
    reps = reps or (20 if lab.on_gpu else 5)
    gen = torch.Generator(device=lab.device).manual_seed(lab.config.seed)
    q, k, v = (torch.randn(B, H, T, Dh, device=lab.device, dtype=torch.bfloat16,
                           generator=gen).requires_grad_() for _ in range(3))   # (B, H, T, Dh)
    dy = torch.randn(B, H, T, Dh, device=lab.device, dtype=torch.bfloat16, generator=gen)
    scale = 1.0 / Dh ** 0.5

    def attend():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        torch.autograd.grad(y, (q, k, v), dy)

    timer = lab.code["time_attention"]
    out = {}
    picks = default_choice(q, k, v, scale)
    for name in ("default", *BACKENDS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")            # a refusal's reasons come as warnings
                ms = timer(attend, None if name == "default" else ATTN_BACKENDS[name], reps)
            out[name] = {"available": True, "ms": float(ms)}
        except RuntimeError as e:
            out[name] = {"available": False, "error": str(e).strip().splitlines()[0][:300]}
    out["default"]["picks"] = picks
    return out


def default_choice(q, k, v, scale) -> str | None:
    """The backend PyTorch's own priority picks for these inputs (causal), by name; None when
    this torch cannot say (``torch._fused_sdp_choice`` is internal)."""
    by_value = {int(b.value): n for n, b in ATTN_BACKENDS.items() if b is not None}
    try:
        return by_value.get(int(torch._fused_sdp_choice(q, k, v, is_causal=True, scale=scale)))
    except (AttributeError, RuntimeError, TypeError):
        return None


def pick_backend(timings: dict) -> str:
    """The fastest available pinned backend in ``attention_backends``' output."""
    ok = {n: t["ms"] for n, t in timings.items() if n in BACKENDS and t.get("available")}
    if not ok:
        raise RuntimeError(f"no attention backend could run: {timings}")
    return min(ok, key=ok.get)
