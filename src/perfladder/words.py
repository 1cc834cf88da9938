"""Numbers as words: one formatter per unit, for every page, the CLI's table and the cost
model's printed lines (no imports: anything may read it without pulling in the page layer).

Rates come bare, for the caller to name (``f"{rate(v)} tokens/s"``, ``f"{tflops(v)} TFLOP/s"``,
``f"{gbps(v)} GB/s"``); sizes, times, fractions and ratios carry their unit. ``None`` (nothing
measured) is ``"-"`` everywhere.
"""
from __future__ import annotations

NONE = "-"


def rate(v: float | None) -> str:
    """Tokens/s with three significant digits: 555k, 2.48M, 9.00k, 812."""
    if v is None:
        return NONE
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e5:
        return f"{v / 1e3:.0f}k"
    if v >= 1e4:
        return f"{v / 1e3:.1f}k"
    if v >= 1e3:
        return f"{v / 1e3:.2f}k"
    return f"{v:.0f}"


def tflops(v: float | None) -> str:
    """TFLOP/s with one decimal when large, two significant digits when small (a smoke run on
    a CPU achieves ~0.001 TFLOP/s, which ``.1f`` would print as a misleading 0.0)."""
    if v is None:
        return NONE
    return f"{v:.1f}" if v >= 1 else f"{v:.2g}"


def gbps(bytes_per_s: float | None) -> str:
    """A bandwidth in GB/s (10^9 bytes per second, as links are quoted), three significant digits."""
    return NONE if bytes_per_s is None else f"{bytes_per_s / 1e9:.3g}"


def gib(n: int | float | None) -> str:
    """Bytes of memory: 2.00 GiB from a quarter GiB up, 512 MiB below."""
    if n is None:
        return NONE
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def ms(seconds: float | None, digits: int = 2) -> str:
    """Seconds as milliseconds: 12.34 ms."""
    return NONE if seconds is None else f"{1e3 * seconds:.{digits}f} ms"


def seconds(s: float | None) -> str:
    """A duration a reader waits through: 35 s, 1.9 s."""
    return NONE if s is None else (f"{s:.0f} s" if s >= 10 else f"{s:.1f} s")


def percent(fraction: float | None, digits: int = 0) -> str:
    """A fraction as a percentage: 0.8 -> 80%, with ``digits`` decimals."""
    return NONE if fraction is None else f"{100 * fraction:.{digits}f}%"


def ratio(x: float | None, digits: int = 2) -> str:
    """One rate over another: 1.23x."""
    return NONE if x is None else f"{x:.{digits}f}x"
