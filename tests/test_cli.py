"""perfladder.cli: plot / table on synthetic results JSON, and the run command's input errors."""
from __future__ import annotations

import json

import pytest
from conftest import make_result

from perfladder.cli import main, parse_rungs, CLIError

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
    assert "torch on NVIDIA H200 (full config), ratios to R0" in out
    assert "jax on NVIDIA H200" in out
    assert "| rung | torch tokens/s" in out                 # the side-by-side table


def test_malformed_json_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    data = make_result().to_dict()
    data["rungs"][0]["kind"] = "bonus"
    bad.write_text(json.dumps(data))
    assert main(["table", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "perfladder: error:" in err and "kind 'bonus'" in err and str(bad) in err
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
