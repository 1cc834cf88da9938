"""Bad input gets one clear line naming the value (and the valid choices), a non-zero exit
from the command line, no traceback and nothing half-written. One test (or group) per
category: command-line outputs, hardware names and rates, corpus and stream sizes, and the
environment variables."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tracemalloc
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import make_result

from perfladder import __version__, cli
from perfladder.book.paths import build_results_dir
from perfladder.cli import main
from perfladder.config import GPTConfig, pick_config
from perfladder.data import TimeMachine, check_batch_size, preprocess, read_corpus
from perfladder.hardware import achieved_tflops, mfu, peak_for
from perfladder.outputs import OutputError, check_output_path, write_all

CORPUS_LEN = len(preprocess(read_corpus()))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- 1. command-line outputs ------------------------------------------------------------------
@pytest.fixture
def afile(tmp_path) -> Path:
    f = tmp_path / "afile"
    f.write_text("x")
    return f


@pytest.mark.parametrize("value, kind, match", [
    ("", "json", r"--opt is empty"),
    ("   ", "figure", r"--opt is empty"),
    ("{tmp}", "json", r"is a directory"),
    ("{tmp}/newdir/", "figure", r"newdir/' is a directory"),
    ("{tmp}/out.txt", "json", r"--opt '.*out.txt': .*must end in \.json \(got \.txt\)"),
    ("{tmp}/out", "json", r"must end in \.json \(got no suffix\)"),
    ("{tmp}/fig.docx", "figure", r"cannot write \.docx figures.*valid choices: png, pdf, svg"),
    ("{tmp}/afile/out.json", "json", r"afile is a file, so .*afile cannot be a directory"),
    ("{tmp}/afile/deeper/fig.png", "figure", r"afile is a file"),
])
def test_output_paths_refused_with_the_value(tmp_path, afile, value, kind, match):
    with pytest.raises(OutputError, match=match):
        check_output_path(value.format(tmp=tmp_path), kind, "--opt")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (unwritable even as root)")
def test_output_path_in_an_unwritable_folder():
    with pytest.raises(OutputError, match=r"cannot create files in /proc"):
        check_output_path("/proc/perfladder-test/out.json", "json", "--out")


def test_output_paths_accepted(tmp_path):
    assert check_output_path(tmp_path / "new" / "deep" / "r.JSON", "json") == tmp_path / "new/deep/r.JSON"
    assert check_output_path(tmp_path / "both", "figure") == tmp_path / "both.png"   # what savefig writes
    assert check_output_path(tmp_path / "w.svg", "figure") == tmp_path / "w.svg"
    assert not (tmp_path / "new").exists()                                           # checking creates nothing


def test_write_all_is_all_or_nothing(tmp_path):
    def fails(p):
        raise OSError("disk full")
    a, b = tmp_path / "new" / "a.json", tmp_path / "new" / "b.png"
    with pytest.raises(OSError, match="disk full"):
        write_all([(a, lambda p: p.write_text("{}")), (b, fails)])
    assert list(tmp_path.iterdir()) == []            # no file, no temp file, no folder left
    assert write_all([(a, lambda p: p.write_text("{}"))]) == [a] and a.read_text() == "{}"
    assert [p.name for p in a.parent.iterdir()] == ["a.json"]


def fake_framework(calls: list):
    """Stands in for perfladder.torch: records run_ladder calls, returns a synthetic ladder."""
    def run_ladder(cfg, **kw):
        calls.append(kw)
        return make_result("torch", config_name=cfg.name)
    from perfladder.ladder.engine import Rung, registry
    rungs = registry([Rung("R0", "eager", "eager", None), Rung("R1", "compile", "compile", None)])
    return types.SimpleNamespace(RUNGS=rungs, has_gpu=lambda: False, run_ladder=run_ladder)


@pytest.fixture
def calls(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "perfladder.torch", fake_framework(calls))
    return calls


@pytest.mark.parametrize("opts, match", [
    (["--out", "r.txt"], r"--out 'r.txt': .*\.json"),
    (["--out", ""], r"--out is empty"),
    (["--png", "w.docx"], r"--png 'w.docx': matplotlib cannot write \.docx"),
    (["--out", "{afile}/r.json"], r"is a file"),
])
def test_run_checks_outputs_before_any_work(tmp_path, afile, calls, capsys, opts, match):
    opts = [o.format(afile=afile) for o in opts]
    assert main(["run", "torch", "--config", "smoke", *opts]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfladder: error: ") and len(err.strip().splitlines()) == 1
    assert re.search(match, err), err
    assert calls == []                                # the ladder never started


def test_run_whose_figure_fails_leaves_no_results_json(tmp_path, calls, monkeypatch, capsys):
    import perfladder.pages.plot
    def broken(result, path=None, **kw):
        raise OSError("no space left on device")
    monkeypatch.setattr(perfladder.pages.plot, "waterfall", broken)
    out, png = tmp_path / "res" / "torch.json", tmp_path / "res" / "torch.png"
    assert main(["run", "torch", "--config", "smoke", "--quiet", "--out", str(out), "--png", str(png)]) == 2
    assert len(calls) == 1
    assert "nothing written: no space left on device" in capsys.readouterr().err
    assert not (tmp_path / "res").exists()


def test_run_writes_both_and_says_where(tmp_path, calls, capsys):
    out, fig = tmp_path / "torch.json", tmp_path / "torch"
    assert main(["run", "torch", "--config", "smoke", "--quiet", "--out", str(out), "--png", str(fig)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and f"wrote {fig}.png" in printed
    assert Path(f"{fig}.png").read_bytes()[:8] == PNG_MAGIC and out.read_text().startswith("{")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["torch.json", "torch.png"]


def test_plot_reports_the_file_it_wrote(tmp_path, capsys):
    res = make_result().write(tmp_path / "torch.json")
    assert main(["plot", str(res), "-o", str(tmp_path / "waterfall")]) == 0
    assert f"wrote {tmp_path / 'waterfall.png'}" in capsys.readouterr().out
    assert (tmp_path / "waterfall.png").read_bytes()[:8] == PNG_MAGIC
    assert main(["plot", str(res), "-o", str(tmp_path / "w.docx")]) == 2
    assert "-o '" in capsys.readouterr().err and not (tmp_path / "w.docx").exists()


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"perfladder {__version__}"


def test_cli_bad_output_no_traceback_in_a_real_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-m", "perfladder", "run", "torch", "--out", "r.txt"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "--out 'r.txt'" in out.stderr
    assert list(tmp_path.iterdir()) == []


# -- 2. hardware: names and rates -------------------------------------------------------------
@pytest.mark.parametrize("name, expected", [
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
    ("Tesla A100-PCIE-40GB", "NVIDIA A100"),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H200 NVL", "NVIDIA H200 NVL"),
    ("NVIDIA RTX A1000", None),                 # contains 'a100', is not an A100
    ("NVIDIA GeForce RTX 4090 D", None),        # a different, slower card
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None),  # a slice, not the card
    ("NVIDIA GH200 480GB", "NVIDIA GH200"),    # the size is Grace's and the GPU's memory
])
def test_gpu_names_match_whole_models(name, expected):
    peak = peak_for(name)
    assert (peak.name if peak else None) == expected


@pytest.mark.parametrize("bad", [42, b"NVIDIA H200", ["NVIDIA H200"]])
def test_gpu_name_must_be_a_string(bad):
    with pytest.raises(TypeError, match=rf"device_name must be a str or None, got {type(bad).__name__}"):
        peak_for(bad)


@pytest.mark.parametrize("tokens, flops, name", [
    (0, 1e8, "tokens_per_s"), (-5.0, 1e8, "tokens_per_s"), (float("nan"), 1e8, "tokens_per_s"),
    (1e6, float("inf"), "flops_per_token"), (1e6, 0, "flops_per_token"), (True, 1e8, "tokens_per_s"),
])
def test_rates_and_flops_must_be_finite_and_positive(tokens, flops, name):
    for fn in (lambda: achieved_tflops(tokens, flops), lambda: mfu(tokens, flops, "NVIDIA H200"),
               lambda: mfu(tokens, flops, "cpu")):
        with pytest.raises(ValueError, match=rf"{name}=.* must be a finite number > 0"):
            fn()
    assert mfu(np.float32(1e6), np.int64(10**8), "NVIDIA H200") > 0     # numpy scalars are numbers


# -- 3. corpus and streams --------------------------------------------------------------------
def test_long_context_builds_no_window_copies():
    tracemalloc.start()
    try:
        tm = TimeMachine(batch_size=2, num_steps=50_000, num_train=100, num_val=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB for a TimeMachine"   # all windows: 46 GiB
    assert tm.X.shape == (CORPUS_LEN - 50_000, 50_000)                     # every window, as d2l
    np.testing.assert_array_equal(tm.Y[7, :-1], tm.X[7, 1:])
    assert not tm.X.flags.writeable                                         # a view, shared rows


def test_context_longer_than_the_corpus_says_its_length():
    with pytest.raises(ValueError, match=rf"num_steps={CORPUS_LEN} is longer than the corpus.*"
                                         rf"has {CORPUS_LEN}"):
        TimeMachine(batch_size=2, num_steps=CORPUS_LEN)


def test_booleans_are_not_sizes():
    with pytest.raises(ValueError, match="batch_size=True"):
        TimeMachine(batch_size=True, num_steps=16)
    with pytest.raises(ValueError, match="num_steps=False"):
        TimeMachine(batch_size=2, num_steps=False)
    with pytest.raises(ValueError, match="batch_size=True"):
        check_batch_size(True, 100)
    with pytest.raises(ValueError, match="num_blks=True"):
        GPTConfig(num_blks=True)
    assert check_batch_size(np.int64(8), 100) == 12


def _stream():
    while True:
        yield np.zeros((2, 4)), np.zeros((2, 4))


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_stream_and_timer_refuse_boolean_sizes(framework):
    pytest.importorskip(framework)
    import importlib
    fw = importlib.import_module(f"perfladder.{framework}")
    data = TimeMachine(batch_size=2, num_steps=8, num_train=50, num_val=5)
    args = (data, True, "cpu") if framework == "torch" else (data, True)
    with pytest.raises(ValueError, match="batch_size=True"):
        fw.batches(*args)
    for kw, name in ((dict(warmup=True), "warmup"), (dict(timed=False), "timed"),
                     (dict(windows=True), "windows")):
        with pytest.raises(ValueError, match=rf"{name}=(True|False) must be an? (positive |non-negative )?integer"):
            fw.throughput(lambda X, Y: X, _stream(), **kw)


# -- 4. environment variables -----------------------------------------------------------------
def test_bad_config_variable_names_variable_and_value(monkeypatch):
    monkeypatch.setenv("PERFLADDER_CONFIG", "fulll")
    monkeypatch.setenv("PERFLADDER_CONFIG_SOURCE", "set by scripts/build_book.sh")
    with pytest.raises(ValueError, match=r"unknown config 'fulll'; valid choices: .*'smoke'.*"
                                         r"\$PERFLADDER_CONFIG='fulll'"):
        pick_config(has_gpu=False, verbose=False)


@pytest.mark.parametrize("under", ["", "sub"])
def test_results_dir_variable_that_is_a_file(monkeypatch, afile, under):
    value = str(afile / under) if under else str(afile)
    monkeypatch.setenv("PERFLADDER_RESULTS_DIR", value)
    with pytest.raises(ValueError, match=rf"\$PERFLADDER_RESULTS_DIR='{value}' cannot be a folder: "
                                         rf"{afile} is a file"):
        build_results_dir()


def test_results_dir_variable_ok(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFLADDER_RESULTS_DIR", str(tmp_path / "r" / "s"))
    assert build_results_dir() == tmp_path / "r" / "s" and (tmp_path / "r" / "s").is_dir()
