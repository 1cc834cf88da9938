"""Device kernels (or XLA:CPU ops) of a Chrome / Perfetto trace JSON, as written by
``jax.profiler.trace(..., create_perfetto_trace=True)``.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any, Iterable


# -- Chrome / Perfetto traces ----------------------------------------------------------------------
class KernelEvents(list):
    """``[(name, duration_us), ...]`` picked out of a trace, plus what the caller must know.

    * ``device`` -- ``'gpu'`` (device kernels of the GPU planes) or ``'cpu'`` (XLA:CPU ops);
    * ``ops`` -- per event, ``(hlo_op, hlo_module)`` from the event's args (``None`` where absent);
    * ``lines`` -- the ``'process / thread'`` timelines the events came from;
    * ``spans`` -- per event, ``(start_us, end_us)`` where the trace says when it ran (``None``
      where it does not): the device's busy time is their union, not their sum.
    """

    def __init__(self, pairs=(), device: str = "gpu", ops=(), lines=(), spans=()):
        super().__init__(pairs)
        self.device = device
        self.ops = list(ops)
        self.lines = sorted(set(lines))
        self.spans = list(spans)


_GPU_PROCESS = re.compile(r"/device:GPU|^(?!/host).*GPU", re.IGNORECASE)
_STREAM_LINE = re.compile(r"^Stream #")
_DERIVED_OPS_LINE = "XLA Ops"


def select_kernel_events(rows: Iterable, expect: str | None = None) -> KernelEvents:
    """Pick the kernel events out of ``rows`` of ``(process, thread, name, dur_us, args)``
    (a sixth element, when present, is the event's start in µs: it gives ``spans``).

    GPU (a process named ``/device:GPU:N``): the raw CUDA stream timelines (``Stream #N(...)``:
    kernels, memcpys, memsets), never the timelines xprof derives from them ('XLA Ops',
    'XLA Modules', 'Steps', ...) which would count every kernel twice; the derived
    'XLA Ops' line is used only when no stream line has events. CPU (no GPU process): the
    XLA:CPU ops of ``/host:CPU`` -- a thread named 'XLA Ops' if there is one, else the events
    that carry an ``hlo_op`` argument (the thunk executor's ops; its ``end: ...`` markers and
    the thread-pool bookkeeping carry none).

    ``expect`` (``'gpu'`` / ``'cpu'`` / ``None``) makes a mismatch an error rather than a
    silent switch: a GPU run whose trace has no GPU kernels (CUPTI unavailable) must not be
    reported from host-side events.
    """
    if expect not in (None, "gpu", "cpu"):
        raise ValueError(f"expect={expect!r} is not valid; valid choices: (None, 'gpu', 'cpu')")
    rows = list(rows)
    gpu = [r for r in rows if _GPU_PROCESS.search(r[0] or "")]
    gpu_processes = sorted({r[0] for r in gpu})
    picked: list = []
    device = "gpu"
    if gpu:
        picked = [r for r in gpu if _STREAM_LINE.match(r[1] or "")]
        if not picked:
            picked = [r for r in gpu if (r[1] or "") == _DERIVED_OPS_LINE]
        if not picked:
            lines = sorted({f"{r[0]} / {r[1]}" for r in gpu})
            raise ValueError(f"the trace has GPU timelines {lines} but no kernel events on a "
                             "'Stream #...' or 'XLA Ops' line")
    else:
        device = "cpu"
        host = [r for r in rows if (r[0] or "").startswith("/host")]
        picked = [r for r in host if (r[1] or "") == _DERIVED_OPS_LINE]
        if not picked:
            picked = [r for r in host if isinstance(r[4], dict) and r[4].get("hlo_op")
                      and not str(r[2]).startswith("end: ")]
    if expect is not None and device != expect:
        found = gpu_processes or sorted({r[0] for r in rows})
        raise ValueError(f"expected {expect.upper()} kernel events but the trace holds "
                         f"{device.upper()} ones (processes: {found}); "
                         + ("is CUPTI available to the profiler on this machine?" if expect == "gpu"
                            else "the step ran on a GPU"))
    if not picked:
        processes = sorted({r[0] for r in rows})
        raise ValueError(f"no kernel or XLA op events in the trace (processes: {processes})")
    out = KernelEvents(device=device)
    for row in picked:
        proc, thread, name, dur, args = row[:5]
        args = args if isinstance(args, dict) else {}
        out.append((str(name), float(dur)))
        out.ops.append((args.get("hlo_op"), args.get("hlo_module")))
        ts = row[5] if len(row) > 5 else None
        out.spans.append(None if ts is None else (float(ts), float(ts) + float(dur)))
    out.lines = sorted({f"{r[0]} / {r[1]}" for r in picked})
    return out


def read_trace_json(path: str | Path) -> list[dict]:
    """The ``traceEvents`` of a Chrome trace file (JSON object or bare array; ``.gz`` or not)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{path}: no such trace file") from e
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a Chrome trace JSON ({e})") from e
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: no 'traceEvents' list in this JSON")
    return events


def trace_rows(events: list[dict]) -> list[tuple]:
    """``(process, thread, name, dur_us, args, ts_us)`` of every complete ('X') event, with
    process and thread names resolved from the metadata ('M') events (``ts_us`` ``None`` when
    the event has no ``ts``)."""
    procs: dict[Any, str] = {}
    threads: dict[tuple, str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            nm = (e.get("args") or {}).get("name")
            if e.get("name") == "process_name":
                procs[e.get("pid")] = str(nm)
            elif e.get("name") == "thread_name":
                threads[(e.get("pid"), e.get("tid"))] = str(nm)
    rows = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or "dur" not in e:
            continue
        pid, tid = e.get("pid"), e.get("tid")
        ts = e.get("ts")
        rows.append((procs.get(pid, str(pid)), threads.get((pid, tid), str(tid)),
                     str(e.get("name", "")), float(e["dur"]), e.get("args") or {},
                     float(ts) if isinstance(ts, (int, float)) else None))
    return rows


def parse_chrome_trace(path: str | Path, expect: str | None = None) -> KernelEvents:
    """The GPU kernel events (or, on a CPU-only trace, the XLA:CPU op events) of a
    Chrome/Perfetto trace JSON (``perfetto_trace.json.gz``, ``*.trace.json.gz``, plain JSON).

    Returns ``KernelEvents``: a list of ``(name, duration_us)`` with ``.device`` ('gpu' or
    'cpu'), ``.ops`` (``(hlo_op, hlo_module)`` per event), ``.lines`` and ``.spans``. See
    ``select_kernel_events`` for which timelines count and for ``expect``. Only complete
    ('X') events are read -- what xprof writes; durations are in microseconds.
    """
    return select_kernel_events(trace_rows(read_trace_json(path)), expect=expect)


def union_us(spans: Iterable) -> float | None:
    """Microseconds covered by at least one of ``spans`` (``(start_us, end_us)`` each): the
    time the device was busy, each instant counted once however many streams ran kernels in
    it. ``None`` when any span is unknown (``None``) or there are none: then only the sum of
    durations is known, which overlapping kernels inflate."""
    spans = list(spans)
    if not spans or any(s is None for s in spans):
        return None
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total
