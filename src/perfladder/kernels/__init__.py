"""Where the time of a step goes, kernel by kernel (no framework imports).

The framework sides (``perfladder.torch.kernels`` / ``perfladder.jax.kernels``) profile a few
steps and hand this package ``(kernel name, microseconds)`` pairs:

* ``taxonomy`` -- ``categorize(name)``: a kernel or operator name to one of ``CATEGORIES``;
* ``breakdown`` -- ``breakdown(events, steps)``: the ``KernelBreakdown`` (total kernel time,
  per-category time and share, the top kernels);
* ``trace`` -- ``parse_chrome_trace(path)``: the device kernels of a Chrome/Perfetto trace
  (``union_us``: the time they kept the device busy, each instant once);
* ``roofline`` -- the floor of each kernel group; ``accounting`` -- the workload of a recipe,
  judged rooflines and the derived fields of a file re-derived on reading; ``ceiling`` -- the
  model's ceiling of a run, at its own probe.
"""
from perfladder.kernels.breakdown import KernelBreakdown, KernelStat, breakdown
from perfladder.kernels.taxonomy import CATEGORIES, CATEGORY_HELP, PATTERNS, categorize
from perfladder.kernels.trace import (
    KernelEvents,
    parse_chrome_trace,
    read_trace_json,
    select_kernel_events,
    trace_rows,
)

__all__ = ["CATEGORIES", "CATEGORY_HELP", "PATTERNS", "categorize", "KernelStat",
           "KernelBreakdown", "breakdown", "KernelEvents", "select_kernel_events",
           "read_trace_json", "trace_rows", "parse_chrome_trace"]
