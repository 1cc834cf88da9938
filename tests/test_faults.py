"""Faults a user meets, planted for real: signals to a running ``perfladder run``, a closed
pipe and a full disk behind stdout, a full disk under the results file, two writers of one
file, and files from another run. Each ends in one line naming what went wrong, and the
user's files as they were or better. The ladders here are ``tests/_fake_ladder.py``: the
real engine and CLI on rungs that take no time."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_result

from perfladder import faults
from perfladder.cli import main
from perfladder.results.record import LadderResult, LearningCheck, ResultsError

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parent / "src")
FAKE = str(HERE / "_fake_ladder.py")
ENV = {**os.environ, "PYTHONPATH": SRC, "MPLBACKEND": "Agg"}


@pytest.fixture
def fake(monkeypatch):
    """``perfladder.torch`` replaced by the fake ladder in this process (no torch import)."""
    sys.path.insert(0, str(HERE))
    import _fake_ladder
    module = _fake_ladder.module()
    monkeypatch.setitem(sys.modules, "perfladder.torch", module)
    return module


def fake_cli(*args, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, FAKE, *args], capture_output=True, text=True,
                          timeout=60, env={**ENV, **(env or {})}, **kw)


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def no_temporaries(folder: Path) -> None:
    left = [p.name for p in folder.iterdir() if p.name.startswith(".") or ".tmp" in p.name]
    assert left == [], left


# -- interrupts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_a_rung_keeps_the_finished_rungs(tmp_path, sig, code):
    out, ready = tmp_path / "torch.json", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, FAKE, "run", "torch", "--config", "smoke", "--quiet",
                             "--out", str(out), "--png", str(tmp_path / "torch.png")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, "FAKE_BLOCK": "R2", "FAKE_READY": str(ready)})
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    line = one_line(err)
    assert line == (f"perfladder: interrupted ({sig.name}) during R2; R0, R1 saved to {out}, "
                    f"continue with --resume {out}")
    assert [r.name for r in LadderResult.read(out).rungs] == ["R0", "R1"]
    ready.unlink()
    no_temporaries(tmp_path)
    # the resumed run measures only what is missing and finishes the file
    calls = tmp_path / "calls"
    done = fake_cli("run", "torch", "--config", "smoke", "--quiet", "--out", str(out),
                    "--resume", str(out), env={"FAKE_CALLS": str(calls)})
    assert done.returncode == 0, done.stderr
    assert calls.read_text().split() == ["R2", "R3"]
    back = LadderResult.read(out)
    assert [r.name for r in back.rungs] == ["R0", "R1", "R2", "R3"] and back.learning.passed


def test_sigterm_while_the_figure_is_written_leaves_no_temporary(tmp_path):
    out, png, ready = tmp_path / "torch.json", tmp_path / "torch.png", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, FAKE, "run", "torch", "--config", "smoke", "--quiet",
                             "--out", str(out), "--png", str(png)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, "FAKE_BLOCK_FIGURE": "1", "FAKE_READY": str(ready)})
    while not ready.exists() and proc.poll() is None:
        time.sleep(0.05)
    assert any(".tmp" in p.name for p in tmp_path.iterdir())          # the figure is half written
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert one_line(err) == ("perfladder: interrupted (SIGTERM) while writing the results; "
                             f"R0, R1, R2, R3 saved to {out}, continue with --resume {out}")
    ready.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["torch.json"]   # no half figure
    assert LadderResult.read(out).learning.passed


def test_an_interrupt_before_anything_was_saved_says_nothing_written(tmp_path):
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, FAKE, "run", "torch", "--config", "smoke", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, "FAKE_BLOCK": "R0", "FAKE_READY": str(ready)})
    while not ready.exists() and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert one_line(err) == "perfladder: interrupted (SIGINT) during R0; nothing written (no --out given)"


def test_an_interrupt_that_a_library_wraps_is_still_an_interrupt():
    """A compile worker killed by the same Ctrl-C fails its parent with an ordinary error
    (raised from the interrupt, or while the signal is pending): never a skipped rung."""
    from perfladder.ladder.engine import Rung, registry, run_ladder
    sys.path.insert(0, str(HERE))
    from _fake_ladder import FakeLab

    from perfladder.config import get_config

    def wrapped(lab, given):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise RuntimeError("compile worker died") from e
    lab = FakeLab(get_config("smoke"))
    with pytest.raises(faults.Interrupted):
        run_ladder(lab, registry([Rung("R0", "eager", "eager", wrapped)]), learn=False)
    assert lab.result.rungs == []


def test_the_engine_hands_every_finished_rung_to_the_checkpoint():
    from _fake_ladder import RUNGS, FakeLab

    from perfladder.config import get_config
    from perfladder.ladder.engine import run_ladder
    seen = []
    run_ladder(FakeLab(get_config("smoke")), RUNGS, checkpoint=lambda r: seen.append(
        ([x.name for x in r.rungs], r.learning is not None)))
    assert seen == [(["R0"], False), (["R0", "R1"], False), (["R0", "R1", "R2"], False),
                    (["R0", "R1", "R2", "R3"], False), (["R0", "R1", "R2", "R3"], True)]


# -- what a run may replace ---------------------------------------------------------------------
def test_a_run_that_measures_nothing_keeps_the_existing_results(tmp_path, fake, monkeypatch, capsys):
    out = make_result(config_name="smoke").write(tmp_path / "torch.json")
    before = out.read_bytes()
    run = ["run", "torch", "--config", "smoke", "--quiet", "--out", str(out)]
    monkeypatch.setenv("FAKE_SKIP", "all")
    assert main(run) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("perfladder: error")]
    assert len(err) == 1 and "no rung was measured" in err[0] and "kept as it was" in err[0]
    assert out.read_bytes() == before
    partial = tmp_path / "torch.partial.json"
    assert all(not x.measured for x in LadderResult.read(partial).rungs)
    # a later run must not silently throw the partial away ...
    monkeypatch.delenv("FAKE_SKIP")
    assert main(run) == 2 and "--resume" in one_line(capsys.readouterr().err)
    assert out.read_bytes() == before
    # ... and --overwrite is the user saying so
    monkeypatch.setenv("FAKE_SKIP", "all")
    assert main(run + ["--overwrite"]) == 1 and out.read_bytes() != before


def test_a_failed_learning_check_does_not_replace_a_good_file(tmp_path, fake, monkeypatch, capsys):
    out = make_result(config_name="smoke").write(tmp_path / "torch.json")
    before = out.read_bytes()

    def diverged(cfg, checkpoint=None, **kw):
        res = make_result(config_name=cfg.name)
        res.learning = LearningCheck(steps=40, first=3.0, last=4.0, window=20)
        checkpoint(res)
        return res
    monkeypatch.setattr(fake, "run_ladder", diverged)
    assert main(["run", "torch", "--config", "smoke", "--quiet", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "the learning check failed" in err and f"{out} kept as it was" in err
    assert out.read_bytes() == before
    assert LadderResult.read(tmp_path / "torch.partial.json").learning.passed is False


def test_a_table_that_cannot_be_printed_loses_nothing(tmp_path, fake, monkeypatch, capsys):
    monkeypatch.setattr(fake, "run_ladder", lambda cfg, **kw: make_result(config_name=cfg.name))

    class HeadOfOne:            # `perfladder run ... | head -n 1`: one line, then a closed pipe
        lines = 0

        def write(self, s):
            if self.lines:
                raise BrokenPipeError(errno.EPIPE, "Broken pipe")
            self.lines += s.count("\n")

        def flush(self):
            pass
    monkeypatch.setattr(sys, "stdout", HeadOfOne())
    out = tmp_path / "torch.json"
    assert main(["run", "torch", "--config", "smoke", "--quiet", "--no-learn", "--out", str(out)]) == 141
    assert [r.name for r in LadderResult.read(out).rungs] == [r.name for r in make_result().rungs]
    assert f"results written to {out}" in capsys.readouterr().err


def test_table_into_a_closed_pipe_and_a_full_disk(tmp_path):
    path = make_result().write(tmp_path / "torch.json")
    cmd = [sys.executable, "-m", "perfladder", "table", str(path), str(path)]
    head = subprocess.Popen(["head", "-n", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    first = subprocess.run(cmd, stdout=head.stdin, stderr=subprocess.PIPE, text=True, env=ENV,
                           timeout=60)
    head.stdin.close()
    head.wait()
    assert first.stderr == "" and first.returncode in (0, 141)      # 0: it all fit the pipe
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        r = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, env=ENV, timeout=60)
    assert r.returncode == 1
    assert one_line(r.stderr) == ("perfladder: error: cannot write to standard output "
                                  "(No space left on device)")


# -- inputs that look valid until read: another ladder's file, a missing user, a damaged corpus
@pytest.mark.parametrize("framework, config, says", [
    ("jax", "smoke", "is a jax 'smoke' ladder; this run is torch 'smoke'"),
    ("torch", "full", "is a torch 'full' ladder; this run is torch 'smoke'"),
])
def test_resume_with_another_ladders_file(tmp_path, fake, capsys, framework, config, says):
    other = make_result(framework, config_name=config).write(tmp_path / "other.json")
    assert main(["run", "torch", "--config", "smoke", "--resume", str(other)]) == 2
    line = one_line(capsys.readouterr().err)
    assert says in line and str(other) in line


@pytest.mark.parametrize("args", [["run", "torch", "--config", "smoke", "--out", "~no-such-user-x/r.json"],
                                  ["table", "~no-such-user-x/r.json"],
                                  ["run", "torch", "--config", "smoke", "--resume", "~no-such-user-x/r.json"]])
def test_a_tilde_user_that_does_not_exist(fake, capsys, args):
    assert main(args) == 2
    assert "no user 'no-such-user-x' on this machine" in one_line(capsys.readouterr().err)


def test_a_damaged_corpus_in_the_package(tmp_path, fake, monkeypatch, capsys):
    import perfladder.data
    bad = tmp_path / "timemachine.txt"
    bad.write_text("not the novel")
    monkeypatch.setattr(perfladder.data, "corpus_path", lambda: bad)
    assert main(["run", "torch", "--config", "smoke", "--no-learn"]) == 2
    err = capsys.readouterr().err
    assert one_line(err).startswith(f"perfladder: error: corpus {bad} has sha1") and "reinstall" in err
    bad.unlink()
    assert main(["run", "torch", "--config", "smoke", "--no-learn"]) == 2
    assert f"corpus file not found: {bad}" in one_line(capsys.readouterr().err)


def test_a_compile_cache_folder_that_cannot_be_created(tmp_path, fake, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(blocker / "cache"))
    assert main(["run", "torch", "--config", "smoke"]) == 2
    assert (f"$TORCHINDUCTOR_CACHE_DIR='{blocker / 'cache'}' cannot be used"
            in one_line(capsys.readouterr().err))


def test_debug_shows_the_traceback_and_a_bad_debug_word_is_one_line(tmp_path, monkeypatch, capsys):
    missing = str(tmp_path / "missing.json")
    assert main(["table", missing]) == 2 and "no such results file" in one_line(capsys.readouterr().err)
    r = fake_cli("--debug", "table", missing)                 # what a user sees: the traceback
    assert r.returncode == 1 and "Traceback" in r.stderr and "ResultsError" in r.stderr
    monkeypatch.setenv("PERFLADDER_DEBUG", "1")
    with pytest.raises(ResultsError, match="no such results file"):
        main(["table", missing])
    monkeypatch.setenv("PERFLADDER_DEBUG", "maybe")
    assert main(["table", missing]) == 2
    assert "$PERFLADDER_DEBUG='maybe' is not valid" in one_line(capsys.readouterr().err)


def test_an_unexpected_error_is_one_line_that_says_how_to_see_more(fake, monkeypatch, capsys):
    def broken(cfg, **kw):
        raise TypeError("a bug\nwith a second line")
    monkeypatch.setattr(fake, "run_ladder", broken)
    assert main(["run", "torch", "--config", "smoke", "--quiet"]) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("perfladder: internal error: TypeError: a bug; nothing written") and "--debug" in line


# -- results files: writes and reads ------------------------------------------------------------
def test_a_full_disk_during_the_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = make_result().write(tmp_path / "torch.json")
    before = path.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ResultsError, match=rf"{path}: cannot write the results file \(No space left on device\)"):
        make_result(rates=(1.0, 2.0)).write(path)
    assert path.read_bytes() == before
    no_temporaries(tmp_path)


def test_a_file_size_limit_is_a_real_short_disk(tmp_path):
    """RLIMIT_FSIZE makes the kernel refuse the write itself (EFBIG), as a small disk would."""
    path = tmp_path / "torch.json"
    code = (f"import resource, signal, sys; sys.path.insert(0, {str(HERE)!r}); "
            "from conftest import make_result; "
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000)); "
            f"make_result().write({str(path)!r})")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 1 and "cannot write the results file (File too large)" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_during_the_write_leaves_no_temporary(tmp_path, monkeypatch):
    def interrupted(fd):
        raise faults.Interrupted("SIGTERM")
    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        make_result().write(tmp_path / "torch.json")
    assert list(tmp_path.iterdir()) == []


WRITER = """
import sys
sys.path.insert(0, {here!r})
from conftest import make_result
r = make_result(rates=({rate}, 2 * {rate}))
for _ in range(60):
    r.write({path!r})
"""


def test_two_processes_writing_one_results_file(tmp_path):
    path = tmp_path / "torch.json"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER.format(here=str(HERE), rate=rate, path=str(path))],
                              stderr=subprocess.PIPE, text=True, env=ENV) for rate in (1000.0, 3000.0)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert LadderResult.read(path).rungs[0].tokens_per_s in (1000.0, 3000.0)   # one whole file
    assert [p.name for p in tmp_path.iterdir()] == ["torch.json"]


@pytest.mark.parametrize("edit, says", [
    (lambda d: d.update(schema_version=True), "schema_version true is not a number"),
    (lambda d: d.update(schema_version="2"), 'schema_version "2" is not a number'),
    (lambda d: d["rungs"][1].update(tokens_per_s=1e9),
     "rungs[1] (R1): tokens_per_s 1e+09 lies outside its own settled windows"),
])
def test_results_files_that_lie_are_refused_naming_file_and_field(tmp_path, capsys, edit, says):
    data = make_result().to_dict()
    edit(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert main(["table", str(bad)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"perfladder: error: {bad}: ") and says in line


def test_an_integer_too_long_to_read(tmp_path, capsys):
    bad = tmp_path / "big.json"
    bad.write_text('{"schema_version": ' + "9" * 5000 + "}")
    assert main(["plot", str(bad), "-o", str(tmp_path / "x.png")]) == 2
    assert "holds an integer longer than" in one_line(capsys.readouterr().err)
