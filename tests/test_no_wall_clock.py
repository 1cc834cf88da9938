"""No test asserts on wall-clock time: a first-call time, a window's seconds or a rate compared
with a threshold or a factor passes or fails with the machine's load and the compile cache.

The only comparisons allowed are with zero (it was measured at all) and, in the sync tests,
of a window's seconds with the same device work measured by the device (``device_s``): a
lower bound that a slower machine can only satisfy more easily."""
from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
TIMED = re.compile(r"(?<!predicted_)(?<!linear_)(first_call_s|\.seconds\b|step_time_s|tokens_per_s"
                   r"|_ms\b|elapsed|wall_s)")
OPS = re.compile(r"\s(<=|>=|<|>)\s")
FACTOR = re.compile(r"(^|[^\w.])(\d+(\.\d*)?|\.\d+)(\s*\*|$)")


# comparisons of recorded numbers with each other that are identities, not thresholds
IDENTITIES = {
    "case[\"host_bound\"][way] ==": "the recorded verdict recomputed from the recorded numbers",
    "p[\"predicted_tokens_per_s\"] <= 4 *": "cost-model arithmetic: a prediction is at most linear",
}


def offending_lines():
    """Assert lines where a measured time or rate is compared with a number other than zero,
    or with a factor times something (``x > 3 * y``)."""
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == Path(__file__).name:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if "assert" not in code or "device_s" in code or any(k in code for k in IDENTITIES):
                continue
            for clause in re.split(r"\band\b|\bor\b|,", code.split("assert", 1)[1]):
                sides = OPS.split(clause)
                if len(sides) < 3:
                    continue
                exprs = [x.strip() for x in sides[::2]]
                if not any(TIMED.search(x) for x in exprs):
                    continue
                others = [x for x in exprs if not TIMED.search(x) or FACTOR.search(x)]
                if any(FACTOR.search(x) and x not in ("0", "0.0") for x in others):
                    yield f"{path.relative_to(TESTS)}:{n}: {line.strip()}"
                    break


def test_no_assertion_compares_a_time_or_a_rate_with_a_threshold():
    assert list(offending_lines()) == []


def test_the_scan_finds_a_planted_factor(tmp_path, monkeypatch):
    planted = TESTS / "_planted_wall_clock_probe.py"
    planted.write_text("def test_x(r):\n    assert r.compile.first_call_s > 3 * r0.compile.first_call_s\n")
    try:
        assert any("_planted_wall_clock_probe.py" in line for line in offending_lines())
    finally:
        planted.unlink()
