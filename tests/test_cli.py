"""perfladder.cli: plot / table on synthetic results JSON, and the run command's input errors."""
from __future__ import annotations

import json

import pytest
from conftest import make_result

from perfladder.cli import CLIError, main, parse_rungs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def two_files(tmp_path):
    a = make_result("torch").write(tmp_path / "torch.json")
    b = make_result("jax", rates=(80_000.0, 160_000.0)).write(tmp_path / "jax.json")
    return a, b


def test_plot_one(tmp_path, two_files, capsys):
    out = tmp_path / "png" / "torch.png"
    assert main(["plot", str(two_files[0]), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert f"wrote {out}" in capsys.readouterr().out


def test_plot_two_side_by_side(tmp_path, two_files):
    out = tmp_path / "both.png"
    assert main(["plot", *map(str, two_files), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_table(two_files, capsys):
    assert main(["table", *map(str, two_files)]) == 0
    out = capsys.readouterr().out
    assert "torch on NVIDIA H200 (full config)" in out and "slower" in out
    assert "jax on NVIDIA H200" in out
    assert "| technique | torch" in out                     # the side-by-side table, by technique key


def test_malformed_json_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    data = make_result().to_dict()
    data["rungs"][0]["kind"] = "bonus"
    bad.write_text(json.dumps(data))
    assert main(["table", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "perfladder: error:" in err and "'bonus' is not one of" in err and str(bad) in err
    assert "rungs[0].kind (rung R0)" in err
    bad.write_text("{not json")
    assert main(["plot", str(bad), "-o", str(tmp_path / "x.png")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["table", str(tmp_path / "missing.json")]) == 2
    assert "no such results file" in capsys.readouterr().err


def test_plot_with_no_measured_rung_exits_2(tmp_path, capsys):
    r = make_result()
    r.rungs = [x for x in r.rungs if x.kind == "skipped"]
    path = r.write(tmp_path / "empty.json")
    assert main(["plot", str(path), "-o", str(tmp_path / "e.png")]) == 2
    assert "no measured rungs" in capsys.readouterr().err


def test_run_config_typo_lists_choices(capsys):
    assert main(["run", "torch", "--config", "smok"]) == 2
    err = capsys.readouterr().err
    assert "--config 'smok' is not valid; valid choices: full, smoke" in err


def test_run_unknown_framework(capsys):
    assert main(["run", "tensorflow", "--config", "smoke"]) == 2
    assert "framework 'tensorflow' is not valid; valid choices: ('torch', 'jax')" in capsys.readouterr().err


def test_run_bad_env_config(monkeypatch, capsys):
    monkeypatch.setenv("PERFLADDER_CONFIG", "tiny")
    assert main(["run", "torch", "--rungs", "R0"]) == 2
    assert "'tiny'" in capsys.readouterr().err


def test_run_unknown_rung_lists_valid_names(capsys):
    """Needs the real rung table: perfladder.torch.RUNGS (nothing runs: the name is refused first)."""
    import perfladder.torch as ladder
    assert main(["run", "torch", "--config", "smoke", "--rungs", "R0,R9", "--no-learn"]) == 2
    err = capsys.readouterr().err
    assert "unknown rung(s) 'R9'" in err
    assert "valid choices: " + ", ".join(ladder.RUNGS) in err


class FakeRun:
    """Stands in for ``perfladder.torch.run_ladder``: records what the CLI asked for."""

    def __init__(self, learning=None):
        self.calls, self.learning = [], learning

    def __call__(self, cfg, rungs=None, learn=True, progress=None, command="", resume=None,
                 checkpoint=None):
        self.calls.append(dict(config=cfg.name, rungs=rungs, learn=learn, command=command))
        if progress is not None:
            for name in rungs:
                progress("start", name, None)
                progress("end", name, "measured")
        res = make_result(config_name=cfg.name)
        res.learning = self.learning
        if checkpoint is not None:
            checkpoint(res)
        return res


def test_run_asks_the_engine_for_the_default_rungs(monkeypatch, tmp_path, capsys):
    """No --rungs: every rung but the optional ones (torch's B11), in ladder order, through the
    engine's check_rungs; named ones are passed as named (an optional one too)."""
    import perfladder.torch as pt
    from perfladder.ladder.engine import check_rungs
    fake = FakeRun()
    monkeypatch.setattr(pt, "run_ladder", fake)
    out = tmp_path / "torch.json"
    assert main(["run", "torch", "--config", "smoke", "--out", str(out), "--no-learn"]) == 0
    call = fake.calls[-1]
    assert call["rungs"] == check_rungs(pt.RUNGS) and "B11" not in call["rungs"]
    assert call["config"] == "smoke" and call["learn"] is False
    assert call["command"].startswith("perfladder ")
    assert main(["run", "torch", "--config", "smoke", "--rungs", "B11,R0", "--quiet"]) == 0
    assert fake.calls[-1]["rungs"] == ["R0", "B11"] and fake.calls[-1]["learn"] is True
    captured = capsys.readouterr()
    assert f"wrote {out}" in captured.out and "[1/" in captured.err     # progress lines unless --quiet
    assert out.is_file()


def test_a_failed_learning_check_exits_1_after_writing(monkeypatch, tmp_path, capsys):
    import perfladder.torch as pt
    from perfladder.measure.learning import LearningCheck
    from perfladder.results.record import LadderResult
    diverged = LearningCheck(steps=40, first=3.0, last=float("nan"), window=20,
                             losses=[3.0] * 20 + [float("nan")] * 20)
    monkeypatch.setattr(pt, "run_ladder", FakeRun(learning=diverged))
    out = tmp_path / "torch.json"
    png = tmp_path / "torch.png"
    assert main(["run", "torch", "--config", "smoke", "--out", str(out), "--png", str(png),
                 "--quiet"]) == 1
    captured = capsys.readouterr()
    assert "perfladder: error: the learning check failed" in captured.err
    assert f"wrote {out}" in captured.out and png.read_bytes()[:8] == PNG_MAGIC
    back = LadderResult.read(out)                          # the measurements are kept
    assert back.learning.passed is False and [r.name for r in back.rungs] == [
        r.name for r in make_result().rungs]
    monkeypatch.setattr(pt, "run_ladder", FakeRun(learning=LearningCheck(
        steps=40, first=3.0, last=2.0, window=20)))
    assert main(["run", "torch", "--config", "smoke", "--out", str(out), "--quiet"]) == 0


def test_parse_rungs():
    valid = ["R0", "R1", "R2"]
    assert parse_rungs(None, valid) is None
    assert parse_rungs(" R0, R2 ,", valid) == ["R0", "R2"]
    with pytest.raises(CLIError, match="names no rung; valid choices: R0, R1, R2"):
        parse_rungs(",", valid)
    with pytest.raises(CLIError, match="unknown rung.*'r1'"):
        parse_rungs("r1", valid)


def test_missing_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2


def test_no_learn_says_that_the_targets_go_unchecked(monkeypatch, capsys):
    """The learning check is the only runtime guard against misaligned targets: turning it off
    is said on stderr, --quiet or not; a run with it says nothing of the kind."""
    import perfladder.torch as pt
    monkeypatch.setattr(pt, "run_ladder", FakeRun())
    assert main(["run", "torch", "--config", "smoke", "--rungs", "R0", "--no-learn", "--quiet"]) == 0
    assert "--no-learn: no learning check" in capsys.readouterr().err
    assert main(["run", "torch", "--config", "smoke", "--rungs", "R0", "--quiet"]) == 0
    assert "no learning check" not in capsys.readouterr().err


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_compile_ahead_reaches_the_ladder(monkeypatch, tmp_path, framework):
    """--compile-ahead / --no-compile-ahead reach the framework's run_ladder as ahead=True /
    False; without either the ladder's own default decides (what the ladder then does with it:
    tests/ahead/test_door.py and each side's test there)."""
    import importlib
    fw, asked = importlib.import_module(f"perfladder.{framework}"), []
    fake = FakeRun()

    def run_ladder(cfg, **kw):
        asked.append(kw.pop("ahead", "default"))
        return fake(cfg, **kw)
    monkeypatch.setattr(fw, "run_ladder", run_ladder)
    for flag, want in (["--compile-ahead"], True), (["--no-compile-ahead"], False), ([], "default"):
        assert main(["run", framework, "--config", "smoke", "--rungs", "R0", "--no-learn", "--quiet",
                     *flag, "--out", str(tmp_path / "r.json"), "--overwrite"]) == 0
        assert asked[-1] == want


@pytest.mark.parametrize("bad", ["0", "-1", "lots"])
def test_a_bad_memory_cap_is_one_line(bad, capsys):
    assert main(["run", "torch", "--config", "smoke", "--memory-cap-gib", bad]) == 2
    err = capsys.readouterr().err
    assert f"--memory-cap-gib={bad!r} is not valid; valid: a number of GiB > 0" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_memory_cap_reaches_the_lab_and_the_file(monkeypatch, tmp_path):
    """--memory-cap-gib is put where the lab reads it (and JAX's settings, and every process
    the run starts), before the framework is imported; the file keeps what the lab recorded
    (the labs' own tests: tests/torch/test_lab_fit.py, tests/jax/test_lab_fit.py)."""
    import perfladder.torch as pt
    from perfladder.ladder.fit import MEMORY_CAP_VARIABLE, memory_cap_gib
    monkeypatch.setenv(MEMORY_CAP_VARIABLE, "99")     # restored after the test, whatever the CLI sets
    seen = []

    def run_ladder(cfg, **kw):
        seen.append(memory_cap_gib())
        res = make_result(config_name=cfg.name)
        res.memory_cap_gib = seen[-1]
        return res
    monkeypatch.setattr(pt, "run_ladder", run_ladder)
    out = tmp_path / "r.json"
    assert main(["run", "torch", "--config", "smoke", "--rungs", "R0", "--no-learn", "--quiet",
                 "--memory-cap-gib", "12", "--out", str(out)]) == 0
    assert seen == [12.0] and json.loads(out.read_text())["memory_cap_gib"] == 12.0
    assert main(["run", "torch", "--config", "smoke", "--rungs", "R0", "--no-learn", "--quiet"]) == 0
    assert seen[-1] == 12.0                           # without the flag: the variable


def test_the_packages_checked_before_a_run_are_perfladders_own_dependencies():
    from pathlib import Path

    import tomllib

    from perfladder.run_checks import RUNTIME_PACKAGES
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert sorted(RUNTIME_PACKAGES.values()) == sorted(project["project"]["dependencies"])


def test_a_missing_results_package_is_named_before_any_work(monkeypatch, capsys):
    """A python with the frameworks but without perfladder's install (jsonschema missing) is
    refused in one line before the ladder starts, not after its compiles and first rung."""
    import importlib.util

    import perfladder.torch as pt
    fake, real = FakeRun(), importlib.util.find_spec
    monkeypatch.setattr(pt, "run_ladder", fake)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jsonschema" else real(name, *a))
    assert main(["run", "torch", "--config", "smoke", "--rungs", "R0", "--no-learn", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert fake.calls == [] and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "jsonschema is not installed" in err and "pip install 'jsonschema>=4'" in err
