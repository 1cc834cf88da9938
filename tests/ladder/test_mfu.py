"""MFU by the rung's own precision: the engine divides each rung's rate by the peak of the
precision it computes in -- bf16's for a bf16 rung, TF32's for an fp32 or tf32 one -- names
that peak in the record (``RungResult.mfu_peak``), and ``check_mfu`` refuses a record whose MFU
was divided by another (the gate ``mfu peak``). A lab reporting an H200, checked against the
peak table; a CPU has no peak and no MFU."""
from __future__ import annotations

import pytest
from _fake_ladder import FakeLab
from conftest import timing_of

from perfladder.hardware import peak_for
from perfladder.ladder import engine
from perfladder.ladder.engine import LadderRun, Rung, registry
from perfladder.ladder.rung import Evidence
from perfladder.measure.counts import CountError, check_mfu
from perfladder.results.record import LadderResult, RungResult

H200 = peak_for("NVIDIA H200")
RATE = 250_000.0


class GpuLab(FakeLab):
    device_name = "NVIDIA H200"

    def precision(self, recipe):
        return recipe["precision"]


def rung(devices=1):
    def fn(lab, given):
        return Evidence(timing=timing_of([RATE] * 3), recipe=given.recipe, devices=devices)
    return fn


def computes(precision):
    return lambda recipe, config: recipe.replace(precision=precision)


RUNGS = registry([
    Rung("R0", "eager", "fp32", rung(), change=computes("fp32")),
    Rung("R1", "compile", "tf32", rung(), builds_on="R0", change=computes("tf32")),
    Rung("R2", "bf16", "bf16", rung(), builds_on="R1", change=computes("bf16")),
    Rung("M1", "data_parallel", "two devices", rung(devices=2), stage="multi-gpu", kind="multi-gpu",
         builds_on="R2"),
])


def ladder(lab_class=GpuLab):
    from perfladder.config import get_config
    run = LadderRun(lab_class(get_config("smoke")), RUNGS)
    return {name: run.run(name) for name in RUNGS}


def test_each_rung_is_divided_by_its_own_precisions_peak_in_the_table():
    got = ladder()
    tflops = RATE * 1000 / 1e12                                  # the fake lab's 1000 FLOPs a token
    for name, column, devices in (("R0", "tf32", 1), ("R1", "tf32", 1), ("R2", "bf16", 1),
                                  ("M1", "bf16", 2)):
        r = got[name]
        assert r.outcome == "measured", r.error
        peak = getattr(H200, column)
        assert r.mfu_peak == {"precision": column, "tflops": peak}
        assert r.mfu == pytest.approx(tflops / devices / peak) and r.tflops == pytest.approx(tflops)
    assert got["R2"].mfu / got["R1"].mfu == pytest.approx(H200.tf32 / H200.bf16)   # one rate, two peaks


def test_a_cpu_has_no_peak_and_no_mfu():
    class CpuLab(GpuLab):
        device_name = "cpu"
    for r in ladder(CpuLab).values():
        assert r.outcome == "measured" and r.mfu is None and r.mfu_peak is None


@pytest.mark.planted
@pytest.mark.parametrize("planted", ["the other column", "the other value"])
def test_an_mfu_divided_by_the_other_precisions_peak_is_refused(monkeypatch, planted):
    """The planted kinds: bf16 against the TF32 peak and the reverse, recorded as such, or
    recorded under the right peak's name with the other's value."""
    real = engine.rung_mfu

    def swapped(rate, fpt, device, precision):
        other = real(rate, fpt, device, "tf32" if precision == "bf16" else "bf16")
        return other if planted == "the other column" else {**other, "mfu_peak": real(
            rate, fpt, device, precision)["mfu_peak"]}
    monkeypatch.setattr(engine, "rung_mfu", swapped)
    for r in ladder().values():
        assert r.outcome == "error" and r.error.startswith("CountError"), r
        assert ("must be divided by" in r.error if planted == "the other column"
                else "divided by another peak" in r.error)


def test_check_mfu_names_the_bad_value():
    r = RungResult(name="R2", key="bf16", label="bf16", tokens_per_s=RATE, precision="bf16",
                   tflops=1.0, mfu=1.0 / H200.bf16, mfu_peak={"precision": "bf16", "tflops": H200.bf16})
    assert check_mfu(r, "NVIDIA H200") is r
    with pytest.raises(CountError, match="'cpu' has no bf16 peak in the table") as e:
        check_mfu(r, "cpu")
    assert e.value.gate == "mfu peak"
    r.mfu_peak = None
    with pytest.raises(CountError, match="R2 computes in bf16: its MFU must be divided by NVIDIA H200's bf16 peak"):
        check_mfu(r, "NVIDIA H200")


def test_the_peak_is_kept_in_the_results_file_and_older_files_still_load(tmp_path):
    got = ladder()
    res = LadderResult(framework="torch", device="NVIDIA H200", config={}, baseline="R0",
                       rungs=list(got.values()))
    back = LadderResult.read(res.write(tmp_path / "r.json"))
    assert [r.mfu_peak for r in back.rungs] == [r.mfu_peak for r in got.values()]
    d = res.to_dict()
    for r in d["rungs"]:
        del r["mfu_peak"]                                  # written before the field existed
    assert all(r.mfu_peak is None for r in LadderResult.from_dict(d).rungs)
