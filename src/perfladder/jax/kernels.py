"""JAX's kernel-level time breakdown: profile a few steps, sort the device kernels.

``kernel_breakdown(step, stream)`` warms ``step`` up, runs ``steps`` more calls inside
``jax.profiler.trace(..., create_perfetto_trace=True)`` (the last output waited for inside
the trace), reads the trace back with ``perfladder.kernels.parse_chrome_trace`` and sums the
events by category. On a GPU the events are the CUDA kernels/copies of the device's stream
timelines; on CPU they are XLA:CPU's ops.

XLA names its kernels after the fusion, and a fusion's name rarely says what it holds
(``loop_multiply_fusion.3`` may be the AdamW update; on CPU ``ynn_fusion.7`` may be a dot).
Pass ``hlo_text`` -- the compiled module's text, ``compiled_hlo_text(jitted, *args)`` -- and
every op of that module is categorized from what it contains and from the Python code it
was traced from (optax / ``Optimizer.update`` -> optimizer; the GPT's LayerNorm -> reductions),
and its kernels are named with the part of the GPT that code is (``loop_add_multiply_fusion_5
[GELU]``: ``perfladder.jax.frames``); the breakdown's notes say how much of the kernel time
the text covered.
"""
from __future__ import annotations

import glob
import os
import tempfile
import time

import jax

from perfladder.checks import check_int
from perfladder.jax.device import has_gpu
from perfladder.jax.program import hlo_module_name, hlo_ops, refine
from perfladder.jax.timer import compile_count, sync
from perfladder.kernels import (
    KernelBreakdown,
    KernelEvents,
    breakdown,
    parse_chrome_trace,
    select_kernel_events,
)
from perfladder.measure.timing import RecompileError

TRACE_FILES = ("perfetto_trace.json.gz", "*.trace.json.gz", "*.trace.json")


class ProfileError(RuntimeError):
    """The profiler did not produce a trace with kernel events we can read."""


def compiled_hlo_text(jitted, *args, **kwargs) -> str:
    """The optimized HLO text of ``jitted`` (``jax.jit`` / ``nnx.jit``) for these arguments.

    Compiles again (the executable cache is not consulted by ``lower().compile()``): call it
    outside any timed or profiled window.
    """
    if not hasattr(jitted, "lower"):
        raise TypeError(f"{jitted!r} has no .lower(...): pass the jitted function itself "
                        "(jax.jit / nnx.jit), not a wrapper around it")
    return jitted.lower(*args, **kwargs).compile().as_text()


def _trace_file(log_dir: str) -> str | None:
    for pattern in TRACE_FILES:
        found = sorted(glob.glob(os.path.join(log_dir, "plugins", "profile", "*", pattern)),
                       key=os.path.getmtime)
        if found:
            return found[-1]
    return None


def _xspace_rows(log_dir: str) -> list[tuple]:
    """``(process, thread, name, dur_us, args)`` rows from the raw ``*.xplane.pb`` (the same
    planes and lines as the JSON trace, before any conversion), via ``jax.profiler.ProfileData``."""
    found = sorted(glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb")))
    if not found or not hasattr(jax.profiler, "ProfileData"):
        return []
    rows = []
    for path in found:
        data = jax.profiler.ProfileData.from_file(path)
        for plane in data.planes:
            for line in plane.lines:
                for ev in line.events:
                    stats = {}
                    try:
                        stats = {str(k): v for k, v in ev.stats}
                    except (TypeError, ValueError):
                        pass
                    start = getattr(ev, "start_ns", None)
                    rows.append((plane.name, line.name, ev.name, ev.duration_ns / 1000.0, stats,
                                 None if start is None else start / 1000.0))
    return rows


def _files_under(log_dir: str) -> list[str]:
    out = []
    for root, _, files in os.walk(log_dir):
        out += [os.path.relpath(os.path.join(root, f), log_dir) for f in files]
    return sorted(out)


def profiler_options():
    """The trace's options: no Python tracer. The breakdown reads device (or XLA:CPU) events
    only, and the Python tracer records every Python call of the traced steps (nnx walks the
    model graph in Python on every call): with it, stopping the trace of 5 smoke-config steps
    took 0.9-1.2 s on CPU and wrote 4.1 MB; without it 0.09 s and 1.2 MB. The host tracer
    stays: it carries the annotations that tie each kernel to its HLO op."""
    cls = getattr(jax.profiler, "ProfileOptions", None)
    if cls is None:
        return None
    options = cls()
    options.python_tracer_level = 0
    return options


def _start(log_dir: str, perfetto: bool) -> None:
    options = profiler_options()
    kw = {} if options is None else {"profiler_options": options}
    if perfetto:
        kw["create_perfetto_trace"] = True
    try:
        jax.profiler.start_trace(log_dir, **kw)
    except TypeError:           # a jax without these switches: the xplane/JSON files remain
        jax.profiler.start_trace(log_dir)


def trace_kernels(step, stream, steps: int, expect: str,
                  perfetto: bool = True) -> tuple[KernelEvents, float]:
    """Run ``steps`` calls of ``step`` under the profiler; their kernel events and wall µs.

    ``perfetto=False`` skips writing the Perfetto JSON (the slowest part of stopping a trace);
    the events are then read from the raw ``*.xplane.pb``.
    """
    with tempfile.TemporaryDirectory(prefix="perfladder-trace-") as log_dir:
        try:
            _start(log_dir, perfetto)
        except Exception as e:
            raise ProfileError(f"jax.profiler.start_trace failed: {type(e).__name__}: {e}") from e
        try:
            out = None
            t0 = time.perf_counter()
            for _ in range(steps):
                out = step(*next(stream))
            sync(out)                           # inside the trace: every kernel has finished
            wall_us = (time.perf_counter() - t0) * 1e6
        except BaseException:
            try:
                jax.profiler.stop_trace()
            except Exception:                   # the step's own error is the one to see
                pass
            raise
        try:
            jax.profiler.stop_trace()
        except Exception as e:
            raise ProfileError(f"jax.profiler.stop_trace failed: {type(e).__name__}: {e}") from e
        path = _trace_file(log_dir)
        errors = []
        if path is not None:
            try:
                return parse_chrome_trace(path, expect=expect), wall_us
            except ValueError as e:
                errors.append(f"{os.path.basename(path)}: {e}")
        rows = _xspace_rows(log_dir)
        if rows:
            try:
                return select_kernel_events(rows, expect=expect), wall_us
            except ValueError as e:
                errors.append(f"xplane.pb: {e}")
        raise ProfileError(f"the profile of {steps} steps holds no {expect.upper()} kernel events we "
                           f"can read ({'; '.join(errors) or 'no trace file written'}); files written: "
                           f"{_files_under(log_dir)}")


def kernel_breakdown(step, stream, steps: int = 5, warmup: int = 3, top: int = 10,
                     hlo_text: str | None = None, perfetto: bool = True) -> KernelBreakdown:
    """Where the device time of ``step(X, Y)`` goes: a ``perfladder.kernels.KernelBreakdown``.

    ``warmup`` calls first (compilation, autotuning), then ``steps`` calls under the profiler;
    a compilation during the profiled calls raises ``RecompileError``. ``hlo_text`` (optional)
    is the compiled step's module text (``compiled_hlo_text``), used to categorize its ops.
    On CPU the breakdown has ``device='cpu'`` and describes XLA:CPU ops.
    """
    for name, v, lo in (("steps", steps, 1), ("warmup", warmup, 0), ("top", top, 1)):
        check_int(name, v, lo)
    op_info, module = None, None
    if hlo_text is not None:
        op_info, module = hlo_ops(hlo_text), hlo_module_name(hlo_text)
    out = None
    for _ in range(warmup):
        out = step(*next(stream))
    if out is not None:
        sync(out)
    expect = "gpu" if has_gpu() else "cpu"
    before = compile_count()
    events, wall_us = trace_kernels(step, stream, steps, expect, perfetto)
    compiled = compile_count() - before
    if compiled:
        raise RecompileError(f"{compiled} compilation(s) happened while profiling {steps} steps; "
                             "warm up past compilation (raise warmup) and keep one batch shape")
    triples, matched_us = sort_events(zip(events, events.ops), op_info, module)
    total = sum(d for _, d in events) or 1.0
    notes = [f"jax {jax.__version__}, backend {jax.default_backend()}; events from {len(events.lines)} "
             "timeline(s): " + ", ".join(events.lines[:4]) + (" ..." if len(events.lines) > 4 else "")]
    if events.device == "cpu":
        notes.append("CPU run: the events are XLA:CPU ops, not GPU kernels; ops run on a thread "
                     "pool, so their summed time can exceed the wall time")
    if op_info is None:
        notes.append("categories from kernel names only (no hlo_text): XLA fuses the AdamW update "
                     "into loop fusions, counted as elementwise here")
    else:
        notes.append(f"{100 * matched_us / total:.0f}% of the kernel time matched ops of HLO module "
                     f"{module!r} (by the event's op, or by a fusion kernel's own name where the "
                     "event names only a command buffer); those are categorized by what the op "
                     "contains and by the Python code it came from (optax / Optimizer.update -> "
                     "optimizer; a LayerNorm's or the residual add's elementwise passes -> "
                     "reduction/norm) and named with the part of the GPT that code is ([GELU], "
                     "[LayerNorm], ...); the other kernels (library and Pallas kernels a command "
                     "buffer launched, other modules') by their names")
    return breakdown(triples, steps, top, device=events.device, framework="jax",
                     wall_us=wall_us, notes=notes,
                     spans=events.spans if events.device == "gpu" else None)


def sort_events(events, op_info: dict | None, module: str | None) -> tuple[list, float]:
    """``((name, dur_us), (hlo_op, hlo_module))`` per event -> ``(name, dur_us, category)`` per
    event, and the µs that matched an op of ``op_info`` (``hlo_ops`` of module ``module``;
    ``None``: names only). A matched kernel is named with its op's part of the GPT."""
    triples, matched_us = [], 0.0
    for (name, dur), (hlo_op, hlo_mod) in events:
        cat, label = None, name
        if op_info is not None and (hlo_mod is None or _same_module(hlo_mod, module)):
            found = _lookup(op_info, hlo_op, name)
            if found is not None:
                (cat, part), matched_us = found, matched_us + dur
                label = name if part is None else f"{name} [{part}]"
        triples.append((label, dur, refine(name, cat)))
    return triples, matched_us


def _same_module(event_module: str, module: str | None) -> bool:
    """``jit_train_step`` vs an event's ``jit_train_step`` / ``jit_train_step(42)``."""
    if module is None:
        return True
    return event_module == module or event_module.split("(")[0] == module


def _lookup(op_info: dict, hlo_op: str | None, name: str) -> tuple[str, str | None] | None:
    """``(category, part)`` of the op that launched a kernel: the event's ``hlo_op`` (absent
    or a command buffer's thunk where XLA runs the step as CUDA graphs), else the kernel's name
    as the fusion's."""
    for key in (hlo_op, name, _dotted(name)):
        if key and key in op_info:
            return op_info[key]
    return None


def _dotted(name: str) -> str:
    """XLA:GPU names a fusion's kernel after the op with '.' -> '_' (loop_add_fusion_3)."""
    head, sep, tail = name.rpartition("_")
    return f"{head}.{tail}" if sep and tail.isdigit() else name
