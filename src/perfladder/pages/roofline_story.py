"""What a page says of the fastest configuration's roofline table (``perfladder.pages.kernel_report``):
the check that one group stands furthest above its floor, which group that is in words, and the
glue values of its rows."""
from __future__ import annotations

from typing import Callable

from perfladder.pages.kernel_report import fastest_roofline
from perfladder.results.record import LadderResult
from perfladder.words import ms as words_ms

Test = Callable[[LadderResult], tuple[bool, str]]


def _ms(milliseconds: float | None) -> str:
    return words_ms(None if milliseconds is None else milliseconds / 1e3, 1)


def _roofline_rows(result: LadderResult) -> dict[str, dict]:
    return {row["group"]: row for row in fastest_roofline(result)["rows"]}


# each roofline group (``kernels.taxonomy.ROOFLINE_GROUPS``) as the prose names it
GROUP_WORDS = {"matmul": "the matmuls", "attention": "attention", "elementwise": "the elementwise kernels",
               "elementwise: RoPE": "RoPE's elementwise kernels",
               "elementwise: GELU": "GELU's elementwise kernels",
               "elementwise: rest": "the other elementwise kernels",
               "layernorm/reductions": "the LayerNorms and reductions",
               "optimizer": "the optimizer's kernels", "copies": "the copies",
               "other": "the uncategorised kernels"}


def _furthest(result: LadderResult) -> dict:
    return max(_roofline_rows(result).values(), key=lambda row: row.get("above_ms") or 0.0)


def _furthest_in_words(result: LadderResult) -> str:
    group = _furthest(result)["group"]
    return GROUP_WORDS.get(group, group)


def largest_gap(group: str | None = None) -> Test:
    """In the fastest configuration's roofline, ``group`` stands furthest above its floor
    (``None``: some group does, i.e. the run recorded a roofline)."""
    def test(result):
        top = _furthest(result)
        return group is None or top["group"] == group, (
            f"the group furthest above its floor is {top['group']} ({top['above_ms']:.2f} ms above)")
    return test


def roofline_of(group: str | None, field: str) -> Callable[[LadderResult], str]:
    """The glue value of one roofline row's ``field`` (time_ms, floor_ms, above_ms) in the
    fastest configuration's kernel report; ``group`` None: the whole step's."""
    return lambda result: _ms((fastest_roofline(result) if group is None else _roofline_rows(result)[group])[field])


def roofline_numbers() -> dict[str, Callable[[LadderResult], str]]:
    """The glue values a page's reading of its roofline table uses: the step's kernels, the
    attention and matmul groups, each with its floor, and the group furthest above its floor
    (``gap_group``, in words) with how far (``gap_above_ms``)."""
    return {"kernels_ms": roofline_of(None, "time_ms"), "kernels_floor_ms": roofline_of(None, "floor_ms"),
            "gap_group": _furthest_in_words,
            "gap_above_ms": lambda result: _ms(_furthest(result)["above_ms"]),
            **{f"{short}_{k}": roofline_of(group, field) for short, group in (("attn", "attention"),
                                                                            ("matmul", "matmul"))
               for k, field in (("kernel_ms", "time_ms"), ("floor_ms", "floor_ms"))}}
