"""``KernelBreakdown``: kernel time of a few profiled steps, by category and by kernel.

Times are summed kernel durations: kernels that overlap (several CUDA streams, XLA:CPU's
thread pool) are counted in full, and the gaps between kernels (launch overhead, host
stalls) are not in ``total_us``. How busy the device was is a different number: the union
of the kernels' intervals (``busy_us``) over the same steps' wall time (``wall_us``), which
cannot exceed 1; the sum can, and is never read as a busy fraction.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

from perfladder.checks import check_int
from perfladder.kernels.taxonomy import CATEGORIES, categorize
from perfladder.kernels.trace import union_us


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
    busy_us: float | None = None           # union of the kernels' intervals (None: not known)

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
        """The share of the profiled wall time the device ran at least one kernel: the union of
        the kernels' intervals over ``wall_us`` (``busy_fraction``)."""
        return busy_fraction(self.busy_us, self.total_us, self.wall_us)

    def share(self, category: str) -> float:
        if category not in CATEGORIES:
            raise ValueError(f"category={category!r} is not valid; valid choices: {CATEGORIES}")
        return self.category_share[category]

    def to_dict(self) -> dict:
        return {
            "framework": self.framework, "device": self.device, "steps": self.steps,
            "total_us": self.total_us, "per_step_ms": self.per_step_ms,
            "wall_us": self.wall_us, "busy_us": self.busy_us, "busy": self.busy,
            "category_us": {c: self.category_us.get(c, 0.0) for c in CATEGORIES},
            "category_share": self.category_share,
            "top": [k.to_dict() for k in self.top],
            "num_kernels": self.num_kernels, "num_events": self.num_events,
            "other_names": list(self.other_names), "notes": list(self.notes),
        }

    def recategorized(self) -> "KernelBreakdown":
        """This breakdown with each named kernel that was sorted into 'other' read again by
        today's taxonomy: a kernel it has learned to name since the profile was taken moves
        its time to its category. Only 'other' is re-read: every other category may come from
        more than a name (the HLO of an XLA fusion), which the name alone cannot overrule."""
        cat, top, moved = dict(self.category_us), [], []
        for k in self.top:
            new = categorize(k.name) if k.category == "other" else k.category
            if new != k.category:
                cat["other"] = max(0.0, cat.get("other", 0.0) - k.total_us)
                cat[new] = cat.get(new, 0.0) + k.total_us
                moved.append(k.name)
            top.append(dataclasses.replace(k, category=new))
        if not moved:
            return self
        return dataclasses.replace(
            self, category_us=cat, top=top,
            other_names=[n for n in self.other_names if n not in moved],
            notes=[*self.notes, f"re-sorted on reading by the current taxonomy: {', '.join(moved)}"])

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
                   notes=list(d.get("notes", [])), busy_us=d.get("busy_us"))

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


OTHER_WARN = 0.2      # a breakdown with more 'other' than this says so in its notes
# Kernel time a few percent over the wall time it was measured in is clock granularity and the
# trace's own edges; more than this is overlap counted twice (or steps not the ones timed).
OVER_WALL = 0.05


def busy_fraction(busy_us: float | None, total_us: float, wall_us: float | None) -> float | None:
    """The device's busy share of ``wall_us``: ``busy_us`` (the union of kernel intervals) over
    it when known; without the union, the summed ``total_us`` only where it fits in the wall
    time (within ``OVER_WALL``, capped at 1). ``None`` otherwise: a sum of kernels that
    overlapped is not a busy fraction, and a number over 1 is never reported as one."""
    if not wall_us:
        return None
    used = busy_us if busy_us is not None else total_us
    if used > (1 + OVER_WALL) * wall_us:
        return None
    return min(1.0, used / wall_us)


def breakdown(events: Iterable, steps: int, top: int = 10, *, device: str = "gpu",
              framework: str = "", classify: Callable[[str], str] = categorize,
              wall_us: float | None = None, notes: Iterable[str] = (),
              spans: Iterable | None = None) -> KernelBreakdown:
    """Sum ``events`` -- ``(name, duration_us)`` or ``(name, duration_us, category)`` -- of
    ``steps`` profiled steps into a ``KernelBreakdown`` with the ``top`` kernels by time.
    ``spans`` (``(start_us, end_us)`` per event, when the profiler says when each ran) gives
    ``busy_us``, their union.

    A third element, when given and not ``None``, is the event's category (a framework side
    that knows better than the name, e.g. "launched inside the optimizer step"); otherwise
    ``classify(name)`` decides. No events, a negative or non-finite duration, or an unknown
    category are errors: an empty breakdown would read as "nothing to see".
    """
    steps = check_int("steps", steps, 1)
    top = check_int("top", top, 1)
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
    busy_us = None if spans is None else union_us(spans)
    if busy_us is not None and total > (1 + OVER_WALL) * busy_us:
        notes.append(f"kernels overlapped: {total / steps / 1e3:.2f} ms/step summed, "
                     f"{busy_us / steps / 1e3:.2f} ms/step with the device busy")
    if total and cat_us["other"] / total > OTHER_WARN:
        notes.append(f"{100 * cat_us['other'] / total:.0f}% of the time is in kernels no pattern "
                     f"knows; read other_names (first: {others[0]!r})")
    return KernelBreakdown(device=device, steps=steps, total_us=total, category_us=cat_us, top=stats,
                           num_kernels=len(per), num_events=n_events, framework=framework,
                           wall_us=None if wall_us is None else float(wall_us),
                           other_names=others, notes=notes, busy_us=busy_us)
