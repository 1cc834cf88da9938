"""Prose that depends on the machine a run comes from (framework-free).

At the chapter's batch of 64 sequences a step is short, and whether the host (Python issuing
kernels) or the device (the kernels themselves) sets its pace decides what compile and bf16
can do: on the chapter's RTX 4090 the kernels were slow enough to hide the host, on the H200 of
this book's runs they often are not. A passage about those rungs is therefore written once per
kind of run, and the page prints the version the run's own evidence supports:

* ``Story(key, versions, otherwise)``: each version is ``(when, text)``, ``when`` a test of the
  run (``perfladder.pages.story`` predicates) that must hold for every sentence of ``text``;
  the first version whose test holds is printed, else ``otherwise``, which claims nothing
  beyond the run's own numbers. Texts hold ``{key}`` fields filled from the page's glue values,
  never a typed number;
* ``hardware_numbers()``: ratios between GPUs from the package's peak table
  (``perfladder.hardware.PEAKS``), e.g. ``hw_bf16_vs_4090``;
* ``chapter_device()``: what the chapter's run was measured on, from its one transcribed table
  (``perfladder.pages.comparison.CHAPTER``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from perfladder.hardware import peak_for
from perfladder.pages.comparison import CHAPTER
from perfladder.pages.story import glue_values, largest_gap
from perfladder.results.record import LadderResult
from perfladder.words import ratio

CHAPTER_GPU = "NVIDIA GeForce RTX 4090"      # the chapter's GPU, by the peak table's name


class _Values(dict):
    def __missing__(self, key):
        raise KeyError(f"a story names {{{key}}}, which the page does not compute")


@dataclass(frozen=True)
class Story:
    """A passage written for each kind of run, printed in the version the run supports."""
    key: str
    versions: tuple[tuple[Callable[[LadderResult], tuple[bool, str]], str], ...]
    otherwise: str
    values: Callable[[LadderResult], dict[str, str]] | None = None   # the page's glue values

    def version(self, result: LadderResult) -> int | None:
        """The index of the version the run supports (``None``: ``otherwise``)."""
        for i, (when, _) in enumerate(self.versions):
            try:
                holds, _ = when(result)
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                holds = False
            if holds:
                return i
        return None

    def texts(self) -> list[str]:
        """Every version's text, ``otherwise`` last (what the prose test reads)."""
        return [t for _, t in self.versions] + [self.otherwise]

    def __call__(self, result: LadderResult) -> str:
        i = self.version(result)
        text = self.otherwise if i is None else self.versions[i][1]
        values = _Values(self.values(result) if self.values is not None else {})
        return text.format_map(values)


def values_of(numbers: dict) -> Callable[[LadderResult], dict[str, str]]:
    """The page's glue values for a run (``story.glue_values`` with the page's ``numbers``),
    computed once for each state of the run however many stories read them."""
    cache: dict = {}

    def values(result: LadderResult) -> dict[str, str]:
        state = tuple((r.name, r.tokens_per_s, (r.regime or {}).get("regime")) for r in result.rungs)
        if (id(result), state) not in cache:
            cache.clear()
            cache[id(result), state] = glue_values(result, (), numbers)
        return cache[id(result), state]
    return values


def _peak_ratio(precision: str, a: str | None, b: str | None) -> str:
    pa, pb = peak_for(a), peak_for(b)
    if pa is None or pb is None:
        return "–"
    return ratio(pa.tflops(precision) / pb.tflops(precision))


def hardware_numbers() -> dict[str, Callable[[LadderResult], str]]:
    """Glue values comparing the run's GPU with the chapter's, from the peak table's dense
    datasheet peaks: ``hw_bf16_vs_chapter`` ("5.99x": this GPU's bf16 peak over the 4090's),
    ``hw_tf32_vs_chapter``; "–" for a GPU the table does not know."""
    return {f"hw_{p}_vs_chapter": (lambda result, p=p: _peak_ratio(p, result.device, CHAPTER_GPU))
            for p in ("bf16", "tf32")}


def chapter_device() -> str:
    """What the chapter's numbers were measured on, in words (its transcribed table's own)."""
    return CHAPTER["device"]


def roofline_story(values: Callable[[LadderResult], dict[str, str]], ours: str) -> Story:
    """The reading of the fastest configuration's roofline table (``s_gap``): which group stands
    furthest above its floor, and so which rung is worth writing next. Attention on most runs
    (``ours``: why the page's own attention kernel leaves time behind); where another group
    leads, by however little, the page names that group instead."""
    return Story("s_gap", (
        (largest_gap("attention"),
         "Attention stands furthest above its floor: {attn_kernel_ms} for a floor of {attn_floor_ms}, "
         "while the matmuls take {matmul_kernel_ms} against {matmul_floor_ms}. So the next rung worth "
         f"writing is a faster attention kernel ({ours}), not another pass over the activations."),
        (largest_gap(),
         "On this run {gap_group} stand furthest above their floor, {gap_above_ms} above it; attention "
         "takes {attn_kernel_ms} for a floor of {attn_floor_ms}, and the matmuls {matmul_kernel_ms} "
         "against {matmul_floor_ms}. So the next rung worth writing is one that cuts the time of "
         "{gap_group}, before attention."),
    ), "", values)
