"""Where the time of a step goes, kernel by kernel (no framework imports).

The framework sides (``perfladder.torch.kernels`` / ``perfladder.jax.kernels``) profile a
few steps and hand this module ``(kernel name, microseconds)`` pairs; here they are sorted
into a handful of kinds and summed:

* ``categorize(name)`` -- a kernel (or, on CPU, an operator) name to one of ``CATEGORIES``,
  by the ordered name patterns of ``PATTERNS`` (cuBLAS / cuDNN / FlashAttention / NCCL /
  torch / Triton-from-inductor / XLA names as they appear on NVIDIA GPUs);
* ``breakdown(events, steps)`` -- the ``KernelBreakdown``: total kernel time, per-category
  time and share, the top kernels;
* ``parse_chrome_trace(path)`` -- the device kernels (or XLA:CPU ops) of a Chrome/Perfetto
  trace JSON, as written by ``jax.profiler.trace(..., create_perfetto_trace=True)``;
* ``hlo_op_categories(hlo_text)`` -- categories of the ops of a compiled XLA module, from
  its HLO text (what a fusion contains; which Python code it came from). XLA's own names
  (``loop_multiply_fusion.3``, ``ynn_fusion.7``) do not say whether a fusion holds a dot,
  a reduction or the AdamW update; the module text does.

Times are summed kernel durations: kernels that overlap (several CUDA streams, XLA:CPU's
thread pool) are counted in full, and the gaps between kernels (launch overhead, host
stalls) are not in ``total_us`` -- compare it with ``wall_us`` for that.
"""
from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

CATEGORIES = ("matmul", "attention", "elementwise", "reduction/norm", "optimizer",
              "memcpy/memset", "collective", "other")

CATEGORY_HELP = {
    "matmul": "GEMMs: cuBLAS/cuBLASLt (sm90_xmma, nvjet, cutlass), Triton/XLA gemm fusions, aten mm/addmm/bmm",
    "attention": "fused attention kernels: FlashAttention, cuDNN SDPA/fMHA, memory-efficient attention",
    "elementwise": "pointwise and fused pointwise kernels (Triton poi, XLA loop fusions), gathers/scatters",
    "reduction/norm": "reductions, LayerNorm, softmax, cross entropy (Triton red/per, XLA reduce fusions)",
    "optimizer": "the AdamW update (multi_tensor_apply / fused adam; anything run inside the optimizer step)",
    "memcpy/memset": "data movement without arithmetic: host<->device and device copies, fills, casts, transposes",
    "collective": "NCCL / XLA collectives (all-reduce, all-gather, ...)",
    "other": "everything else (kept by name: see KernelBreakdown.other_names)",
}

# Ordered: the first pattern that matches (case-insensitively, anywhere in the name unless
# anchored) decides. Specific library kernels come before the generic words that their
# demangled template arguments may contain (a cutlass GEMM can mention 'Copy', a NCCL
# all-reduce says 'Reduce'), and the inductor/Triton prefixes come before any word because
# inductor names a kernel after every op it fused ('triton_poi_fused__to_copy_mul_0').
PATTERNS: tuple[tuple[str, str, str], ...] = (
    # (category, regex, where the names come from)
    ("collective", r"nccl|gloo|c10d::|(^|[^a-z])all[-_ ]?(reduce|gather|to[-_ ]?all)|reduce[-_ ]?scatter"
                   r"|collective[-_ ]?permute|collective[-_ ]?broadcast",
     "NCCL kernels (ncclDevKernel_AllReduce_...), torch c10d ops, XLA collective ops"),
    ("other", r"^autograd::|(?-i:^[A-Z][A-Za-z0-9]*Backward\d*$)",
     "CPU profiles: autograd engine wrappers and nodes (their self time is bookkeeping)"),
    ("other", r"^aten::(view|reshape|_reshape_alias|t|transpose|permute|expand|as_strided|slice"
              r"|select|unsqueeze|squeeze|_unsafe_view|split|split_with_sizes|chunk|unbind|narrow"
              r"|detach|alias|contiguous|empty|empty_like|empty_strided|resize_|lift_fresh)$",
     "CPU profiles: aten views and allocations (no arithmetic, no copy)"),
    ("attention", r"^triton_tem_.*(attention|flex)", "inductor flex-attention templates"),
    ("matmul", r"^triton_tem_", "inductor matmul templates (triton_tem_fused_mm_0)"),
    ("elementwise", r"^triton_poi_", "inductor pointwise kernels"),
    ("reduction/norm", r"^triton_(red|per)_", "inductor reductions (red) and persistent reductions (per)"),
    ("memcpy/memset", r"^(cuda)?mem(cpy|set)",
     "CUDA copy/fill activities: 'Memcpy HtoD (Pageable -> Device)', 'Memset (Device)', XLA 'MemcpyH2D'"),
    ("optimizer", r"multi_tensor_apply|adam|_foreach_|^optimizer\.|fused_sgd",
     "torch foreach/fused AdamW kernels, aten::_foreach_* ops, the Optimizer.step annotation"),
    ("attention", r"flash|fmha|sdpa|scaled_dot_product|efficient_attention|mem_eff|attention"
                  r"|cudnn.*(attn|mha)",
     "FlashAttention (flash_fwd_kernel), cuDNN SDPA (cudnn_generated_fort_native_sdpa_...), "
     "mem-efficient fmha_cutlassF, aten::_scaled_dot_product_*"),
    ("matmul", r"gemm|gemv|xmma|nvjet|cublas|cutlass|splitk|matmul|wgmma|hmma|s16816|s1688"
               r"|(^|[^a-z])dot([^a-z]|$)|^aten::(mm|addmm|bmm|baddbmm|linear|matmul|_addmm_activation)$",
     "cuBLAS(Lt) sm90_xmma_gemm_*, nvjet_*, cutlass, XLA dot / gemm_fusion / triton_gemm, aten mm ops"),
    ("matmul", r"cudnn.*(gemm|matmul|conv)", "cuDNN GEMM engines (XLA's cuDNN GEMM fusions)"),
    ("other", r"cudnn", "any other cuDNN kernel: its kind is not in its name (kept in other_names)"),
    ("memcpy/memset", r"copy|transpose|(^|_)convert",
     "device copies, dtype casts and layout changes: torch direct_copy_kernel, aten::copy_/_to_copy, "
     "XLA wrapped_copy / transpose_fusion / wrapped_convert"),
    ("other", r"^(ynn|xnn)_fusion",
     "XLA:CPU YNNPACK/XNNPACK fusions hold dots, reductions or pointwise work alike: the name "
     "cannot tell (pass the HLO text to resolve them)"),
    ("reduction/norm", r"reduc|layer_?norm|rms_?norm|group_?norm|batch_?norm|softmax|welford"
                       r"|gammabeta|gamma_beta|logsumexp|nll_loss|cross_entropy"
                       r"|^aten::(sum|mean|amax|amin|max|min|argmax|argmin|norm|linalg_vector_norm"
                       r"|var|std|var_mean|cumsum|prod)$",
     "torch reduce_kernel, layer-norm / softmax kernels, XLA input_reduce_fusion, aten reductions"),
    ("elementwise", r"elementwise|pointwise|fusion|^loop_|^input_|^wrapped_|^cpp_fused_"
                    r"|index|embedding|gather|scatter"
                    r"|^aten::(add|add_|sub|sub_|mul|mul_|div|div_|neg|exp|log|pow|sqrt|rsqrt|tanh"
                    r"|tanh_backward|gelu|gelu_backward|sigmoid|relu|threshold_backward|where|clamp"
                    r"|fill_|zero_|zeros|zeros_like|ones|ones_like|full|addcmul_?|addcdiv_?|lerp_?"
                    r"|cos|sin|cat|stack|rsub|masked_fill_?|maximum|minimum|abs|sign|reciprocal"
                    r"|square|arange|triu|tril|ge|gt|le|lt|eq|ne|clone|dropout|native_dropout"
                    r"|sqrt_|mul_|div_|exp_|neg_)$",
     "torch vectorized_elementwise_kernel, XLA loop_/input_/wrapped_ fusions, inductor cpp_fused_ "
     "(CPU), embedding gathers and their scatter-add gradients, aten pointwise ops"),
)

_COMPILED = tuple((cat, re.compile(rx, re.IGNORECASE)) for cat, rx, _ in PATTERNS)
for _cat, _rx, _why in PATTERNS:
    assert _cat in CATEGORIES, _cat


def categorize(name: str) -> str:
    """The category of one kernel / operator name (``'other'`` when no pattern matches)."""
    if not isinstance(name, str):
        raise TypeError(f"kernel name must be a str, got {type(name).__name__}: {name!r}")
    for cat, rx in _COMPILED:
        if rx.search(name):
            return cat
    return "other"


# -- the breakdown -------------------------------------------------------------------------------
@dataclass
class KernelStat:
    """One kernel (name + category) summed over the profiled steps."""
    name: str
    category: str
    total_us: float
    calls: int
    share: float            # of the breakdown's total kernel time

    def to_dict(self) -> dict:
        return {"name": self.name, "category": self.category, "total_us": self.total_us,
                "calls": self.calls, "share": self.share}


@dataclass
class KernelBreakdown:
    """Kernel time of ``steps`` profiled steps, by category and by kernel.

    ``device`` is ``'gpu'`` (device kernels) or ``'cpu'`` (CPU operators / XLA:CPU ops: the
    categories then describe operators, not GPU kernels). ``wall_us`` is the wall time of the
    profiled steps (profiler on, so a little inflated), ``None`` when not measured.
    """
    device: str
    steps: int
    total_us: float
    category_us: dict[str, float]
    top: list[KernelStat]
    num_kernels: int                       # distinct (name, category)
    num_events: int                        # kernel launches / op executions
    framework: str = ""
    wall_us: float | None = None
    other_names: list[str] = field(default_factory=list)   # names sorted into 'other', by time
    notes: list[str] = field(default_factory=list)

    @property
    def per_step_ms(self) -> float:
        """Kernel milliseconds per step."""
        return self.total_us / self.steps / 1000.0

    @property
    def category_share(self) -> dict[str, float]:
        return {c: (self.category_us.get(c, 0.0) / self.total_us if self.total_us else 0.0)
                for c in CATEGORIES}

    @property
    def busy(self) -> float | None:
        """Summed kernel time / profiled wall time (``None`` without ``wall_us``). Below 1: the
        device waited (launches, host work); above 1: kernels overlapped (streams, threads)."""
        return None if not self.wall_us else self.total_us / self.wall_us

    def share(self, category: str) -> float:
        if category not in CATEGORIES:
            raise ValueError(f"category={category!r} is not valid; valid choices: {CATEGORIES}")
        return self.category_share[category]

    def to_dict(self) -> dict:
        return {
            "framework": self.framework, "device": self.device, "steps": self.steps,
            "total_us": self.total_us, "per_step_ms": self.per_step_ms,
            "wall_us": self.wall_us, "busy": self.busy,
            "category_us": {c: self.category_us.get(c, 0.0) for c in CATEGORIES},
            "category_share": self.category_share,
            "top": [k.to_dict() for k in self.top],
            "num_kernels": self.num_kernels, "num_events": self.num_events,
            "other_names": list(self.other_names), "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "KernelBreakdown":
        """Rebuild a breakdown from ``to_dict()`` output (e.g. a rung's ``extra`` in a results JSON)."""
        missing = [k for k in ("device", "steps", "total_us", "category_us", "top") if k not in d]
        if missing:
            raise ValueError(f"not a KernelBreakdown dict: missing {missing}")
        unknown = sorted(set(d["category_us"]) - set(CATEGORIES))
        if unknown:
            raise ValueError(f"unknown categories {unknown}; valid choices: {CATEGORIES}")
        return cls(device=d["device"], steps=int(d["steps"]), total_us=float(d["total_us"]),
                   category_us={c: float(d["category_us"].get(c, 0.0)) for c in CATEGORIES},
                   top=[KernelStat(**{k: t[k] for k in ("name", "category", "total_us", "calls", "share")})
                        for t in d["top"]],
                   num_kernels=int(d.get("num_kernels", len(d["top"]))),
                   num_events=int(d.get("num_events", 0)), framework=d.get("framework", ""),
                   wall_us=d.get("wall_us"), other_names=list(d.get("other_names", [])),
                   notes=list(d.get("notes", [])))

    def _title(self) -> str:
        what = "kernels" if self.device == "gpu" else "CPU ops"
        head = (f"{self.framework + ' ' if self.framework else ''}{what} on {self.device}: "
                f"{self.per_step_ms:.3f} ms/step summed over {self.steps} profiled steps "
                f"({self.num_events / self.steps:.0f} launches/step, {self.num_kernels} distinct)")
        if self.busy is not None:
            head += f"; {100 * self.busy:.0f}% of the profiled wall time"
        return head

    def markdown(self, name_width: int = 80) -> str:
        """Two Markdown tables: time by category, then the top kernels."""
        ms = lambda us: f"{us / self.steps / 1000.0:.3f}"  # noqa: E731
        lines = [f"**{self._title()}**", "",
                 "| category | ms/step | share |", "|---|---:|---:|"]
        shares = self.category_share
        for c in sorted(CATEGORIES, key=lambda c: -self.category_us.get(c, 0.0)):
            lines.append(f"| {c} | {ms(self.category_us.get(c, 0.0))} | {100 * shares[c]:.1f}% |")
        lines.append(f"| **total** | **{ms(self.total_us)}** | 100% |")
        lines += ["", "| # | kernel | category | ms/step | calls/step | share |",
                  "|---:|---|---|---:|---:|---:|"]
        for i, k in enumerate(self.top, 1):
            lines.append(f"| {i} | `{_short(k.name, name_width)}` | {k.category} | {ms(k.total_us)} | "
                         f"{k.calls / self.steps:g} | {100 * k.share:.1f}% |")
        if self.notes:
            lines.append("")
            lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        shares = self.category_share
        parts = [f"{c} {100 * shares[c]:.1f}%" for c in
                 sorted(CATEGORIES, key=lambda c: -shares[c]) if shares[c] > 0]
        out = [self._title(), "  " + ", ".join(parts)]
        for i, k in enumerate(self.top, 1):
            out.append(f"  {i:>2}. {100 * k.share:5.1f}%  {k.category:<14} {_short(k.name, 70)}")
        return "\n".join(out)


def _short(name: str, width: int) -> str:
    name = name.replace("|", "/").replace("`", "'")
    return name if len(name) <= width else name[: width - 1] + "…"


def _check_int(name: str, v, lo: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{name}={v!r} must be an integer >= {lo}")
    return v


OTHER_WARN = 0.2      # a breakdown with more 'other' than this says so in its notes


def breakdown(events: Iterable, steps: int, top: int = 10, *, device: str = "gpu",
              framework: str = "", classify: Callable[[str], str] = categorize,
              wall_us: float | None = None, notes: Iterable[str] = ()) -> KernelBreakdown:
    """Sum ``events`` -- ``(name, duration_us)`` or ``(name, duration_us, category)`` -- of
    ``steps`` profiled steps into a ``KernelBreakdown`` with the ``top`` kernels by time.

    A third element, when given and not ``None``, is the event's category (a framework side
    that knows better than the name, e.g. "launched inside the optimizer step"); otherwise
    ``classify(name)`` decides. No events, a negative or non-finite duration, or an unknown
    category are errors: an empty breakdown would read as "nothing to see".
    """
    steps = _check_int("steps", steps, 1)
    top = _check_int("top", top, 1)
    if device not in ("gpu", "cpu"):
        raise ValueError(f"device={device!r} is not valid; valid choices: ('gpu', 'cpu')")
    per: dict[tuple[str, str], list] = {}
    n_events = 0
    for ev in events:
        if not isinstance(ev, (tuple, list)) or len(ev) not in (2, 3):
            raise ValueError(f"an event must be (name, duration_us) or (name, duration_us, category), "
                             f"got {ev!r}")
        name, dur = ev[0], ev[1]
        cat = ev[2] if len(ev) == 3 and ev[2] is not None else classify(name)
        if cat not in CATEGORIES:
            raise ValueError(f"category {cat!r} of kernel {name!r} is not valid; valid choices: {CATEGORIES}")
        if not isinstance(dur, (int, float)) or isinstance(dur, bool) or not math.isfinite(dur) or dur < 0:
            raise ValueError(f"duration of kernel {name!r} must be a finite number of microseconds "
                             f">= 0, got {dur!r}")
        slot = per.setdefault((name, cat), [0.0, 0])
        slot[0] += float(dur)
        slot[1] += 1
        n_events += 1
    if not n_events:
        raise ValueError("no kernel events to break down (the profile recorded nothing on the device)")
    total = sum(v[0] for v in per.values())
    cat_us = {c: 0.0 for c in CATEGORIES}
    for (_, cat), (us, _) in per.items():
        cat_us[cat] += us
    ranked = sorted(per.items(), key=lambda kv: (-kv[1][0], kv[0][0]))
    stats = [KernelStat(name=n, category=c, total_us=us, calls=calls,
                        share=(us / total if total else 0.0))
             for (n, c), (us, calls) in ranked[:top]]
    others = [n for (n, c), _ in ranked if c == "other"][:20]
    if wall_us is not None and (not isinstance(wall_us, (int, float)) or not wall_us > 0):
        raise ValueError(f"wall_us={wall_us!r} must be a positive number of microseconds or None")
    notes = list(notes)
    if total and cat_us["other"] / total > OTHER_WARN:
        notes.append(f"{100 * cat_us['other'] / total:.0f}% of the time is in kernels no pattern "
                     f"knows; read other_names (first: {others[0]!r})")
    return KernelBreakdown(device=device, steps=steps, total_us=total, category_us=cat_us, top=stats,
                           num_kernels=len(per), num_events=n_events, framework=framework,
                           wall_us=None if wall_us is None else float(wall_us),
                           other_names=others, notes=notes)


# -- Chrome / Perfetto traces ----------------------------------------------------------------------
class KernelEvents(list):
    """``[(name, duration_us), ...]`` picked out of a trace, plus what the caller must know.

    * ``device`` -- ``'gpu'`` (device kernels of the GPU planes) or ``'cpu'`` (XLA:CPU ops);
    * ``ops`` -- per event, ``(hlo_op, hlo_module)`` from the event's args (``None`` where absent);
    * ``lines`` -- the ``'process / thread'`` timelines the events came from.
    """

    def __init__(self, pairs=(), device: str = "gpu", ops=(), lines=()):
        super().__init__(pairs)
        self.device = device
        self.ops = list(ops)
        self.lines = sorted(set(lines))


_GPU_PROCESS = re.compile(r"/device:GPU|^(?!/host).*GPU", re.IGNORECASE)
_STREAM_LINE = re.compile(r"^Stream #")
_DERIVED_OPS_LINE = "XLA Ops"


def select_kernel_events(rows: Iterable, expect: str | None = None) -> KernelEvents:
    """Pick the kernel events out of ``rows`` of ``(process, thread, name, dur_us, args)``.

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
    for proc, thread, name, dur, args in picked:
        args = args if isinstance(args, dict) else {}
        out.append((str(name), float(dur)))
        out.ops.append((args.get("hlo_op"), args.get("hlo_module")))
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


def trace_rows(events: list[dict]) -> list[tuple[str, str, str, float, dict]]:
    """``(process, thread, name, dur_us, args)`` of every complete ('X') event, with process
    and thread names resolved from the metadata ('M') events."""
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
        rows.append((procs.get(pid, str(pid)), threads.get((pid, tid), str(tid)),
                     str(e.get("name", "")), float(e["dur"]), e.get("args") or {}))
    return rows


def parse_chrome_trace(path: str | Path, expect: str | None = None) -> KernelEvents:
    """The GPU kernel events (or, on a CPU-only trace, the XLA:CPU op events) of a
    Chrome/Perfetto trace JSON (``perfetto_trace.json.gz``, ``*.trace.json.gz``, plain JSON).

    Returns ``KernelEvents``: a list of ``(name, duration_us)`` with ``.device`` ('gpu' or
    'cpu'), ``.ops`` (``(hlo_op, hlo_module)`` per event) and ``.lines``. See
    ``select_kernel_events`` for which timelines count and for ``expect``. Only complete
    ('X') events are read -- what xprof writes; durations are in microseconds.
    """
    return select_kernel_events(trace_rows(read_trace_json(path)), expect=expect)


# -- HLO text: what a compiled op contains --------------------------------------------------------
_MATMUL_OPS = {"dot", "convolution", "ragged-dot", "scaled-dot"}
_REDUCE_OPS = {"reduce", "reduce-window", "select-and-scatter"}
_COLLECTIVE_OPS = {"all-reduce", "all-reduce-start", "all-reduce-done", "all-gather",
                   "all-gather-start", "all-gather-done", "reduce-scatter", "all-to-all",
                   "ragged-all-to-all", "collective-permute", "collective-permute-start",
                   "collective-permute-done", "collective-broadcast", "send", "recv",
                   "send-done", "recv-done"}
# no arithmetic: a fusion of only these moves (or casts) data
_DATA_OPS = {"parameter", "constant", "copy", "copy-start", "copy-done", "transpose", "bitcast",
             "bitcast-convert", "broadcast", "reshape", "slice", "dynamic-slice",
             "dynamic-update-slice", "concatenate", "pad", "reverse", "tuple",
             "get-tuple-element", "iota", "convert"}
_CONTROL_OPS = {"fusion", "call", "while", "conditional", "async-start", "async-done",
                "async-update"}
_ATTN_TARGET = re.compile(r"fmha|flash|attention|sdpa|splash", re.IGNORECASE)
_MATMUL_TARGET = re.compile(r"gemm|matmul|cublas|\$dot|dot_general", re.IGNORECASE)
_COLLECTIVE_TARGET = re.compile(r"nccl|all[-_]?reduce|all[-_]?gather", re.IGNORECASE)
# Python frames that make an op part of the optimizer update: optax (minus its losses, which
# the loss function calls), and the framework's optimizer wrapper (flax nnx Optimizer.update).
OPTIMIZER_FILES = re.compile(r"[/\\]optax[/\\](?!losses[/\\]|_src[/\\]loss\.py)")
OPTIMIZER_FUNCTIONS = re.compile(r"(^|\.)(Optimizer\.(update|step)|apply_updates)$")

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[^\s(]+)\s*(\(.*)?\{\s*$")
_INSTR = re.compile(r"^\s+(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*(?P<rest>.*)$")
_OPCODE = re.compile(r"\s*(?P<op>[a-z][\w\-]*)\(")
_TARGET = re.compile(r'custom_call_target="(?P<t>[^"]*)"')
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_SRC = re.compile(r'source_file="(?P<f>[^"]*)"')
_TOKEN = re.compile(r"[\w.\-$]+")


def _opcode(rest: str) -> str | None:
    """The opcode after ``name = <type>``; the type may be a parenthesised tuple."""
    i = 0
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
        i += 1
    else:
        i = rest.find(" ")
        if i < 0:
            return None
    m = _OPCODE.match(rest, i)
    return m.group("op") if m else None


class _Frames:
    """The FileNames / FunctionNames / FileLocations / StackFrames tables of an HLO dump, and
    the question asked of them: was this op traced from optimizer code?"""

    SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")

    def __init__(self, text: str):
        tables: dict[str, dict[int, str]] = {k: {} for k in self.SECTIONS}
        cur = None
        for line in text.splitlines():
            if line in tables:                    # an unindented section title
                cur = tables[line]
                continue
            idx, _, val = line.strip().partition(" ")
            if cur is None or not idx.isdigit():
                cur = None
                continue
            cur[int(idx)] = val.strip()
        num = lambda s: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", s)}  # noqa: E731
        self.files = {k: v.strip('"') for k, v in tables["FileNames"].items()}
        self.funcs = {k: v.strip('"') for k, v in tables["FunctionNames"].items()}
        self.locs = {k: num(v) for k, v in tables["FileLocations"].items()}
        self.frames = {k: num(v) for k, v in tables["StackFrames"].items()}
        # Some XLA versions print parent ids shifted by one (a root frame then names itself as
        # its parent); a frame can never be its own parent, so that tells the layouts apart.
        self.shift = int(any(f.get("parent_frame_id") == k for k, f in self.frames.items()))
        self._memo: dict[int, bool] = {}

    def optimizer(self, frame_id: int) -> bool:
        """Does the Python stack of ``frame_id`` pass through optax / ``Optimizer.update``?"""
        if frame_id in self._memo:
            return self._memo[frame_id]
        seen, fid, hit = set(), frame_id, False
        while fid and fid in self.frames and fid not in seen:
            seen.add(fid)
            loc = self.locs.get(self.frames[fid].get("file_location_id", 0), {})
            if (OPTIMIZER_FILES.search(self.files.get(loc.get("file_name_id", 0), ""))
                    or OPTIMIZER_FUNCTIONS.search(self.funcs.get(loc.get("function_name_id", 0), ""))):
                hit = True
                break
            fid = self.frames[fid].get("parent_frame_id", 0) - self.shift
        self._memo[frame_id] = hit
        return hit


def hlo_module_name(hlo_text: str) -> str | None:
    m = re.search(r"^HloModule\s+([^\s,]+)", hlo_text, re.MULTILINE)
    return m.group(1) if m else None


def hlo_op_categories(hlo_text: str) -> dict[str, str]:
    """``{op name: category}`` for every instruction of a compiled module's HLO text
    (``jitted.lower(...).compile().as_text()``).

    An op's category comes from what it contains (its own opcode plus, recursively, the
    computations it calls -- a fusion's body), in this order: collective; optimizer (the op
    was traced from optax / ``Optimizer.update``, read from the module's stack-frame tables or
    ``source_file`` metadata); attention (a fused-attention custom call); matmul (a dot or
    convolution, or a cuBLAS custom call); reduction/norm (a reduce); memcpy/memset (only
    data movement: copies, transposes, broadcasts, casts); elementwise (anything else
    arithmetic); an unknown custom call is 'other'.
    """
    if not isinstance(hlo_text, str) or "HloModule" not in hlo_text:
        raise ValueError("hlo_text must be the text of a compiled XLA module (it starts with "
                         "'HloModule'); get it with jitted.lower(*args).compile().as_text()")
    comps: dict[str, list[tuple[str, str, str]]] = {}      # computation -> [(name, opcode, line)]
    cur = None
    for line in hlo_text.splitlines():
        if not line.startswith((" ", "\t")):
            m = _HEADER.match(line)
            cur = comps.setdefault(m.group("name"), []) if m else None
            continue
        if cur is None:
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        op = _opcode(m.group("rest"))
        if op:
            cur.append((m.group("name"), op, m.group("rest")))
    frames = _Frames(hlo_text)
    comp_names = set(comps)
    contents: dict[str, tuple[set, set]] = {}

    def called(rest: str) -> list[str]:
        # computations referenced by the instruction (calls=, to_apply=, body=, ...): every
        # token after the operand list that names a computation
        return [t for t in _TOKEN.findall(rest) if t.lstrip("%") in comp_names]

    def content(comp: str, stack=()) -> tuple[set, set]:
        if comp in contents:
            return contents[comp]
        ops, targets = set(), set()
        if comp not in stack:
            for _, op, rest in comps.get(comp, ()):
                ops.add(op)
                t = _TARGET.search(rest)
                if t:
                    targets.add(t.group("t"))
                for c in called(rest):
                    o2, t2 = content(c.lstrip("%"), stack + (comp,))
                    ops |= o2
                    targets |= t2
        contents[comp] = (ops, targets)
        return ops, targets

    out: dict[str, str] = {}
    for comp, instrs in comps.items():
        for name, op, rest in instrs:
            ops, targets = {op}, set()
            t = _TARGET.search(rest)
            if t:
                targets.add(t.group("t"))
            for c in called(rest):
                o2, t2 = content(c.lstrip("%"))
                ops |= o2
                targets |= t2
            optimizer = False
            fm = _FRAME.search(rest)
            if fm:
                optimizer = frames.optimizer(int(fm.group(1)))
            sm = _SRC.search(rest)
            if sm and OPTIMIZER_FILES.search(sm.group("f")):
                optimizer = True
            out[name] = _op_category(ops, targets, optimizer)
    return out


def _op_category(ops: set, targets: set, optimizer: bool) -> str:
    if ops & _COLLECTIVE_OPS or any(_COLLECTIVE_TARGET.search(t) for t in targets):
        return "collective"
    if optimizer:
        return "optimizer"
    if any(_ATTN_TARGET.search(t) for t in targets):
        return "attention"
    if ops & _MATMUL_OPS or any(_MATMUL_TARGET.search(t) for t in targets):
        return "matmul"
    if ops & _REDUCE_OPS:
        return "reduction/norm"
    if "custom-call" in ops:
        return "other"
    if ops <= (_DATA_OPS | _CONTROL_OPS):
        return "memcpy/memset"
    return "elementwise"


_EXPLICIT_TRANSFER = re.compile(r"^(cuda)?mem(cpy|set)", re.IGNORECASE)


def refine(name: str, op_category: str | None) -> str:
    """Combine a kernel's name-based category with its HLO op's category (``None``: unknown).

    The op decides -- it knows what a fusion holds and whether it belongs to the optimizer --
    except that a library kernel's own name is more specific than the op that launched it
    (a cuBLAS gemm or a cuDNN attention kernel stays itself; an explicit memcpy/memset
    activity stays a copy), unless the op is the optimizer's or a collective.
    """
    by_name = categorize(name)
    if op_category is None:
        return by_name
    if op_category not in CATEGORIES:
        raise ValueError(f"op category {op_category!r} is not valid; valid choices: {CATEGORIES}")
    if op_category in ("optimizer", "collective"):
        return op_category
    if _EXPLICIT_TRANSFER.match(name):
        return "memcpy/memset"
    if by_name in ("matmul", "attention"):
        return by_name
    return op_category
