"""Typed evidence a rung records (framework-free).

Each record is a small dataclass with ``to_dict`` / ``from_dict``; a ``RungResult`` holds
them in named slots (``timing``, ``profile``, ``receipt``, ``gates``, ``memory``,
``compile``, ``prediction``), so a page or a verdict reads a field, never a prose note.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from perfladder.measure.timing import SettledWindows, Throughput


def _plain(x):
    """JSON types only (numpy / framework scalars become Python numbers, tuples lists)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if x is None or isinstance(x, (bool, int, str, float)):
        return x
    if dataclasses.is_dataclass(x):
        return _plain(dataclasses.asdict(x))
    if hasattr(x, "item"):
        try:
            return x.item()
        except (TypeError, ValueError):
            pass
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


class Record:
    """``to_dict`` / ``from_dict`` for the evidence dataclasses (unknown keys are ignored,
    so a newer file still loads)."""

    def to_dict(self) -> dict:
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict | None):
        if d is None:
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Timing(Record, SettledWindows):
    """The windows a rung was timed with (all of them) and what settled."""
    windows: list[float]                # tokens/s of every window, in order
    seconds: list[float]
    settled: int                        # the median is over the last ``settled`` windows
    stable: bool
    target_spread: float
    steps_per_window: int
    warmup: int
    batch_shape: list[int] = field(default_factory=list)
    remeasured: bool = False            # the first attempt did not settle
    window_s: float | None = None       # the longest a window was to take (its steps priced first)

    @classmethod
    def of(cls, t: Throughput, remeasured: bool = False) -> "Timing":
        pilot = t.extra.get("pilot") or {}
        return cls(windows=list(t.windows), seconds=list(t.seconds), settled=t.settled,
                   stable=t.stable, target_spread=t.target_spread,
                   steps_per_window=t.steps_per_window, warmup=t.warmup,
                   batch_shape=list(t.batch_shape), remeasured=remeasured,
                   window_s=pilot.get("window_s"))


@dataclass
class ProfileSummary(Record):
    """Where one step's time goes, from a profiler run outside any timed window.

    ``host_ms`` is the CPU time the framework's own operators take per step (PyTorch:
    self CPU time of the profiled ops; JAX: the time Python takes to issue one step with the
    device idle, so that no queue of earlier steps holds the call back); ``device_ms`` the
    kernels' summed time per step (kernels on several streams each counted); ``busy_ms`` the
    time per step in which the device ran at least one kernel (the union of their intervals,
    each instant counted once; ``None`` where the profiler gave no intervals); ``wall_ms`` the
    profiled steps' wall time per step (profiler on); ``shares`` the fraction of device time per
    kernel category; ``rows`` the profile's top operators, device time first.
    """
    tool: str                                  # "torch.profiler" | "jax.profiler" | ...
    steps: int
    host_ms: float | None = None
    device_ms: float | None = None
    shares: dict[str, float] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)   # {"name", "device_ms", "host_ms", "calls"}
    busy_ms: float | None = None               # union of the kernels' intervals, per step
    wall_ms: float | None = None               # profiled wall time per step (profiler on)

    @property
    def host_over_device(self) -> float | None:
        if self.host_ms is None or not self.device_ms:
            return None
        return self.host_ms / self.device_ms

    def recategorized(self) -> "ProfileSummary":
        """This summary with its top kernels read again by today's taxonomy (the one
        ``perfladder.kernels.categorize`` every page and the kernel report use): a row filed
        under 'other' that a pattern now names moves its share to its category. Only 'other'
        is re-read (a category from more than a name, an XLA fusion's HLO, stands)."""
        from perfladder.kernels.taxonomy import categorize
        if not self.device_ms or not self.rows:
            return self
        shares, rows, moved = dict(self.shares), [], False
        for row in self.rows:
            old = row.get("category")
            new = categorize(row["name"]) if old == "other" else old
            if new != old and row.get("device_ms") is not None:
                share = row["device_ms"] / self.device_ms
                shares["other"] = max(0.0, shares.get("other", 0.0) - share)
                shares[new] = shares.get(new, 0.0) + share
                moved = True
            rows.append({**row, "category": new} if new != old else row)
        return dataclasses.replace(self, shares=shares, rows=rows) if moved else self


def dtype_name(dtype) -> str:
    """The one spelling of a dtype in a receipt: 'torch.bfloat16' / 'bfloat16' / jnp.bfloat16 /
    torch.bfloat16 -> 'bfloat16'."""
    s = str(getattr(dtype, "__name__", dtype))
    return s.rsplit(".", 1)[-1]


@dataclass
class Receipt(Record):
    """What precision the timed step actually computed in, read from the timed path."""
    claimed: str                               # "bf16" | "fp32" | "tf32"
    observed: dict[str, str]                   # e.g. {"logits": "bfloat16", "matmul": "bfloat16"}
    where: str                                 # how it was read ("TrainStep.__call__", "trace")

    @property
    def ok(self) -> bool:
        want = {"bf16": "bfloat16", "fp32": "float32", "tf32": "float32"}[self.claimed]
        return bool(self.observed) and all(dtype_name(v) == want for v in self.observed.values())


@dataclass
class Gate(Record):
    """One correctness check a rung passed before it was timed."""
    name: str                                  # "logits+grads vs R2", "mirror", ...
    passed: bool
    values: dict[str, float] = field(default_factory=dict)      # measured
    tolerances: dict[str, float] = field(default_factory=dict)  # the limits they met
    reference: str = ""                                        # what it was compared with
    detail: dict[str, Any] = field(default_factory=dict)


# What a Memory record measured (``Memory.kind``): the one word per measurement.
PEAK_RESERVED = "peak reserved"          # torch: max_memory_reserved over the timed windows,
                                         # every pool the caching allocator holds (CUDA graphs' too)
PEAK_ALLOCATED = "peak allocated"        # torch, files written before: max_memory_allocated,
                                         # blind to what a CUDA graph's private pool holds
PLANNED = "planned temporaries"          # jax: the compiled step's temporaries, from XLA's plan
RESERVED_NOTE = ("torch.cuda.max_memory_reserved over the timed windows after a reset: every "
                 "segment the caching allocator held, CUDA graphs' private pools included "
                 "(allocated: the tensors' own peak, which a graph's replays do not show)")


@dataclass
class Memory(Record):
    """Device memory of the timed step: the peak the allocator reserved (PyTorch, CUDA graph
    pools included) or the compiler's plan (JAX). ``kind`` names what was measured."""
    bytes: int | None
    kind: str                                  # PEAK_RESERVED | PEAK_ALLOCATED | PLANNED | "n/a"
    note: str = ""
    allocated: int | None = None               # torch: the peak allocated beside it (tensors only)

    @classmethod
    def from_dict(cls, d: dict | None):
        m = super().from_dict(d)
        if m is not None and m.kind == "measured peak":      # files written before the kinds
            m = dataclasses.replace(m, kind=PEAK_ALLOCATED, note=m.note or (
                "torch.cuda.max_memory_allocated after a reset: tensors only, blind to a CUDA "
                "graph's private pool; the run recorded no reserved peak"))
        return m


@dataclass
class Compile(Record):
    """The first (compiling) call, outside any timed window."""
    first_call_s: float
    compilations: int | None = None
    cache_hits: int | None = None     # graphs the first call loaded from the compiler's cache


@dataclass
class Prediction(Record):
    """A cost-model prediction written down before a measurement (R5): the rung's own k in
    ``predicted_tokens_per_s``, every k predicted in ``points``
    (``perfladder.multigpu.costmodel.Estimate.to_dict()`` each)."""
    model: str                                 # what was modelled
    predicted_tokens_per_s: float
    assumptions: dict[str, Any] = field(default_factory=dict)
    measured_tokens_per_s: float | None = None
    points: list[dict] = field(default_factory=list)

