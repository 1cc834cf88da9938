"""Synthetic version-2 ladders and a fake lab for the page tests (framework-free).

``result(...)`` builds a ``LadderResult`` from compact rung specs, with real ``Timing``
windows, so verdicts and regimes are derived by ``LadderResult.finalize()`` as for a real run.
``FakeLab`` is the backend ``perfladder.ladder.engine.LadderRun`` drives: its rungs "measure" the
windows they were declared with, so a page's live path runs through the real engine.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from perfladder.config import get_config
from perfladder.ladder.engine import LadderRun, Rung, registry
from perfladder.ladder.rung import Evidence
from perfladder.measure.evidence import (
    Compile,
    Gate,
    Memory,
    Prediction,
    ProfileSummary,
    Receipt,
    Timing,
)
from perfladder.measure.learning import check_learning
from perfladder.results.record import LadderResult, RungResult

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "benchmarks" / "results" / "h200-book"


def timing(windows, stable: bool = True, target: float = 0.03) -> Timing:
    return Timing(windows=list(windows), seconds=[1.0] * len(windows), settled=len(windows),
                  stable=stable, target_spread=target, steps_per_window=10, warmup=5,
                  batch_shape=[64, 128])


def host_bound(busy: float = 0.5, step_ms: float = 10.0) -> ProfileSummary:
    """A profile whose kernels are busy ``busy`` of a step of ``step_ms`` (batch 64 x 128)."""
    return ProfileSummary(tool="fake profiler", steps=2, host_ms=step_ms, device_ms=busy * step_ms,
                          shares={"matmul": 0.5, "elementwise": 0.5},
                          rows=[{"name": "small kernel", "device_ms": 0.1, "host_ms": 2.0, "calls": 3},
                                {"name": "big matmul", "device_ms": 3.0, "host_ms": 0.5, "calls": 1}])


def rung(name, key, windows=None, builds_on=None, kind="rung", stage="seed", stable=True, **slots) -> RungResult:
    """A measured rung (``windows`` given) or a skipped one (``error=...`` in ``slots``)."""
    t = timing(windows, stable) if windows else None
    mid = sorted(windows)[len(windows) // 2] if windows else None
    return RungResult(name=name, key=key, label=slots.pop("label", f"+{key}"), tokens_per_s=mid,
                      kind=kind if windows else "skipped", stage=stage, builds_on=builds_on, timing=t,
                      batch_size=slots.pop("batch_size", 64), seq_len=128, **slots)


def result(rungs, framework="torch", config="full", device="NVIDIA H200", baseline="R0",
           roofs=None) -> LadderResult:
    cfg = get_config(config).to_dict()
    res = LadderResult(framework=framework, device=device, config=cfg, baseline=baseline,
                       versions={"python": "3.12", framework: "9.9"}, command="pytest", roofs=roofs)
    for r in rungs:
        res.add(r)
    return res.finalize()


def seed_ladder(config="full", roofs=None, framework="torch") -> LadderResult:
    """R0 host-bound, R1 faster, R2 slower, R3c control, R3 faster, R4 slower, B1 unsettled,
    R5 skipped with a prediction."""
    return result([
        rung("R0", "eager", [100e3, 101e3, 102e3], profile=host_bound(0.5, 82.0)),
        rung("R1", "compile", [200e3, 202e3, 204e3], "R0", profile=host_bound(0.6, 41.0),
             gates=[Gate("compiled vs eager logits", True, {"max_abs_diff": 1e-4}, {"atol": 1e-2}, "R0")],
             compile=Compile(first_call_s=2.5)),
        rung("R2", "bf16", [150e3, 151e3, 152e3], "R1", label="+bf16",
             receipt=Receipt("bf16", {"logits": "bfloat16"}, "the timed step"),
             memory=Memory(2**30, "measured peak")),
        rung("R3c", "fp32_control", [300e3, 301e3, 302e3], "R1", kind="control", batch_size=512),
        rung("R3", "batch_up", [600e3, 606e3, 612e3], "R2", batch_size=512, memory=Memory(3 * 2**30, "measured peak")),
        rung("R4", "checkpoint", [500e3, 505e3, 510e3], "R3", batch_size=512, memory=Memory(2**30, "measured peak")),
        rung("B1", "fused_adamw", [400e3, 700e3, 900e3], "R3", stage="beyond", stable=False, batch_size=512),
        rung("R5", "data_parallel", None, "R3", stage="multi-gpu", error="needs at least 2 GPUs",
             prediction=Prediction("two-term cost model", 1.1e6, {"beta_gbps": 4.5})),
    ], config=config, roofs=roofs, framework=framework)


# -- a fake lab for perfladder.ladder.engine.LadderRun --------------------------------------------------
@dataclass(frozen=True)
class FakeRecipe:
    batch_size: int = 8
    bf16: bool = False

    def replace(self, **kw) -> "FakeRecipe":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _declare(name, key, label, windows, rung_kw=None, **slots) -> Rung:
    """A declaration whose rung "measures" ``windows`` and records ``slots``."""
    slots.pop("kind", None)                     # the declaration says what a measurement is
    def fn(lab, given):
        lab.calls.append(name)
        return Evidence(timing=timing(windows, True), recipe=given.recipe, **slots)
    return Rung(name, key, label, fn, **(rung_kw or {}))


def fake_rungs() -> dict[str, Rung]:
    """A small torch-like registry: seed rungs, a control, a beyond rung, a GPU-only rung."""
    big = lambda r, c: r.replace(batch_size=32)  # noqa: E731
    return registry([
        _declare("R0", "eager", "eager", [10e3, 10.1e3, 10.2e3], dict(),
                 profile=host_bound(0.5, 80.0)),
        _declare("R1", "compile", "compile", [20e3, 20.2e3, 20.4e3], dict(builds_on="R0"),
                 gates=[Gate("compiled vs eager logits", True, {"max_abs_diff": 1e-5}, {"atol": 1e-2})]),
        _declare("R2", "bf16", "+bf16", [21e3, 21.1e3, 21.2e3],
                 dict(builds_on="R1", change=lambda r, c: r.replace(bf16=True)),
                 receipt=Receipt("bf16", {"logits": "bfloat16"}, "the timed step")),
        _declare("R3c", "fp32_control", "fp32 @ big batch", [30e3, 30.3e3, 30.6e3],
                 dict(builds_on="R1", kind="control", change=big), kind="control"),
        _declare("R3", "batch_up", "+batch", [40e3, 40.4e3, 40.8e3],
                 dict(builds_on="R2", change=big)),
        _declare("B1", "fused_adamw", "+fused AdamW", [41e3, 41.4e3, 41.8e3], dict(stage="beyond")),
        _declare("R5", "data_parallel", "data parallel", [1.0, 1.0, 1.0],
                 dict(stage="multi-gpu", kind="multi-gpu", builds_on="R3", needs_gpu="needs at least 2 GPUs")),
    ])


class FakeLab:
    """The backend ``LadderRun`` drives (see ``perfladder.ladder.engine``); nothing is timed."""
    framework = "torch"
    seed_top = "R3"

    def __init__(self, config, device: str = "cpu"):
        self.config, self.device_name, self.on_gpu = config, device, False
        self.calls: list[str] = []
        self.result = LadderResult(framework=self.framework, device=device, config=config.to_dict(),
                                   baseline="R0", versions={"python": "3.12"}, command="pytest")

    def seed_recipe(self) -> FakeRecipe:
        return FakeRecipe()

    def recipe_from_dict(self, d: dict) -> FakeRecipe:
        return FakeRecipe(**d)

    def free(self) -> None:
        pass

    def use(self, **code) -> None:
        self.code = code

    def precision(self, recipe) -> str:
        return "bf16" if recipe.bf16 else "fp32"

    def flops_per_token(self, seq_len: int) -> int:
        return 118_000_000

    def kernel_report(self, name, recipe) -> dict:
        self.calls.append(f"kernels:{name}")
        return {"framework": "torch", "device": "cpu", "steps": 2, "total_us": 4000.0, "per_step_ms": 2.0,
                "wall_us": 5000.0, "busy": 0.8,
                "category_us": {"matmul": 3000.0, "elementwise": 1000.0},
                "category_share": {"matmul": 0.75, "elementwise": 0.25},
                "top": [{"name": "aten::mm", "category": "matmul", "total_us": 3000.0, "calls": 4, "share": 0.75}],
                "num_kernels": 1, "num_events": 4, "other_names": [], "notes": []}

    def learning_check(self, name, recipe, watch=None):
        self.calls.append(f"learning:{name}")
        return check_learning([3.0 - 0.02 * i for i in range(60)])


class FakeModule:
    """Stands in for ``perfladder.torch``: ``RUNGS``, ``has_gpu()``, ``Ladder(config, command)``."""

    def __init__(self, device: str = "cpu"):
        self.RUNGS = fake_rungs()
        self.device = device
        self.labs: list[FakeLab] = []

    def has_gpu(self) -> bool:
        return False

    def Ladder(self, config, command: str = "") -> LadderRun:  # noqa: N802 (the framework's name)
        lab = FakeLab(config, self.device)
        self.labs.append(lab)
        return LadderRun(lab, self.RUNGS)


def gate_clocks(result) -> set[str]:
    """The per-gate clocks (``gates/...``) a real ladder's rungs recorded, each rung's inside its
    ``gates`` phase (asserted)."""
    seen: set[str] = set()
    for r in result.rungs:
        secs = r.details.get("seconds") or {}
        parts = {k: v for k, v in secs.items() if k.startswith("gates/")}
        if parts:
            assert sum(parts.values()) <= secs["gates"] + 1e-6, (r.name, secs)
        seen |= set(parts)
    return seen
