"""The machine's faults are not results: a rung that a full disk, an unreadable compile cache,
a killed compile worker or a missing compiler failed is recorded ``outcome="failed"`` with its
cause, the run is incomplete (its own exit status, one line), and the learning check never
ends in an internal error because of it. The ladders here are ``tests/_fake_ladder.py`` (the
real engine and CLI on rungs that take no time) writing a kernel into a compile cache folder
whose disk is full (``tests/_full_disk.py``); the real frameworks' caches are tested in
``tests/torch/test_compile_cache.py`` and ``tests/jax/test_compile_cache.py``."""
from __future__ import annotations

import dataclasses
import errno
import json
import pickle
import subprocess
import sys
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
from _full_disk import install
from conftest import make_result

from perfladder import compile_cache
from perfladder.cli import main
from perfladder.faults import EXIT_INCOMPLETE, environment_cause, environment_failure
from perfladder.results.record import LadderResult, LearningCheck, ResultsError

HERE = Path(__file__).resolve().parent


def one_line(err: str) -> str:
    said = ("perfladder: torch R", "perfladder: --no-learn")     # a rung's own line, the flag's
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(said)]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


class Wrapped(RuntimeError):
    """What a compiler raises around the error it met (inductor's ``InductorError``)."""

    def __init__(self, inner):
        super().__init__(f"{type(inner).__name__}: {inner}")
        self.inner_exception = inner


def raised(fn):
    try:
        fn()
    except Exception as e:
        return e
    raise AssertionError("did not raise")


def chained(outer, inner):
    """``outer`` raised while handling ``inner``, as library code does."""
    def fn():
        try:
            raise inner
        except Exception:
            raise outer from None
    return raised(fn)


@pytest.mark.parametrize("make, cause", [
    (lambda tmp: raised(lambda: (tmp / "full" / "x").write_bytes(b"kernel")), "out_of_space"),
    (lambda tmp: Wrapped(RuntimeError("c++ failed:\n/usr/bin/ld: final link failed: "
                                      "No space left on device")), "out_of_space"),
    (lambda tmp: OSError(errno.EROFS, "Read-only file system", str(tmp / "cache" / "k.so")), "read_only"),
    (lambda tmp: chained(RuntimeError("compile failed"), BrokenProcessPool("A process in the process "
                                                                          "pool was terminated abruptly")),
     "worker_killed"),
    (lambda tmp: raised(lambda: subprocess.run([sys.executable, "-c", "import os, signal; "
                                                "os.kill(os.getpid(), signal.SIGKILL)"], check=True)),
     "worker_killed"),
    (lambda tmp: raised(lambda: subprocess.run(["g++-that-is-not-here"], check=True)), None),
    (lambda tmp: Wrapped(FileNotFoundError(errno.ENOENT, "No such file or directory", "g++")),
     "missing_compiler"),
    (lambda tmp: raised(lambda: pickle.loads(pickle.dumps(list(range(100)))[:20])), "corrupt_cache"),
    (lambda tmp: Wrapped(AttributeError("module 'torch._inductor.runtime.compile_tasks.cw6o' has no "
                                        "attribute 'call'")), "corrupt_cache"),
    (lambda tmp: raised(lambda: compile("def f(:", str(tmp / "cache" / "k.py"), "exec")), "corrupt_cache"),
    (lambda tmp: raised(lambda: compile("def f(:", str(tmp / "mine.py"), "exec")), None),
    (lambda tmp: ValueError("the loss gate refused the model"), None),
    (lambda tmp: RuntimeError("CUDA out of memory"), None),            # the card's, not the machine's
])
def test_the_machines_faults_are_told_from_the_codes(tmp_path, monkeypatch, make, cause):
    (tmp_path / "cache").mkdir()
    monkeypatch.setattr(compile_cache, "_watched", {"inductor": tmp_path / "cache"})
    install([tmp_path / "full"], patch=monkeypatch.setattr)
    e = make(tmp_path)
    assert environment_cause(e) == cause
    failure = environment_failure(e)
    assert (failure.get("outcome"), failure.get("details", {}).get("cause")) == (
        (None, None) if cause is None else ("failed", cause))


# -- the CLI on a fake ladder whose R1 writes its kernel into a compile cache -------------------
@pytest.fixture
def ladder(tmp_path, monkeypatch):
    """``perfladder.torch`` replaced by the fake ladder, its R1 writing a kernel into
    ``$TORCHINDUCTOR_CACHE_DIR`` (a folder of ``tmp_path``), as a compiled rung does."""
    sys.path.insert(0, str(HERE))
    import _fake_ladder
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    measure_r1 = _fake_ladder.rung_fn("R1")

    def r1(lab, given):
        (cache / "kernel.so").write_bytes(b"\0" * 64)
        return measure_r1(lab, given)
    rungs = dict(_fake_ladder.RUNGS)
    rungs["R1"] = dataclasses.replace(rungs["R1"], fn=r1)
    monkeypatch.setattr(_fake_ladder, "RUNGS", rungs)
    module = _fake_ladder.module()
    monkeypatch.setitem(sys.modules, "perfladder.torch", module)
    return cache


def run(out: Path, *more: str) -> int:
    return main(["run", "torch", "--config", "smoke", "--quiet", "--rungs", "R0,R1,R2",
                 "--out", str(out), *more])


@pytest.mark.parametrize("learn", [True, False])
def test_a_rung_the_disk_failed_is_recorded_failed_and_the_run_is_incomplete(
        tmp_path, ladder, monkeypatch, capsys, learn):
    install([ladder], patch=monkeypatch.setattr)
    out = tmp_path / "torch.json"
    assert run(out, *([] if learn else ["--no-learn"])) == EXIT_INCOMPLETE
    line = one_line(capsys.readouterr().err)
    assert line.startswith("perfladder: incomplete: R1 failed for the machine") and f"--resume {out}" in line
    result = LadderResult.read(out)
    r1 = result.rung("R1")
    assert (r1.outcome, r1.details["cause"], r1.measured) == ("failed", "out_of_space", False)
    assert not r1.final                                      # what --resume runs again
    assert r1.details["where"] == str(ladder) and str(ladder) in line
    assert [r.outcome for r in result.rungs] == ["measured", "failed", "measured"]
    assert (result.learning is not None) is learn


def test_an_incomplete_run_never_replaces_a_complete_results_file(tmp_path, ladder, monkeypatch, capsys):
    out = tmp_path / "torch.json"
    assert run(out) == 0
    complete = out.read_bytes()
    install([ladder], patch=monkeypatch.setattr)
    assert run(out) == EXIT_INCOMPLETE
    assert out.read_bytes() == complete
    partial = LadderResult.read(tmp_path / "torch.partial.json")
    assert partial.rung("R1").outcome == "failed"


def test_a_learning_check_the_disk_failed_is_recorded_not_an_internal_error(
        tmp_path, ladder, monkeypatch, capsys):
    import _fake_ladder

    def learning_check(self, name, recipe, watch=None):
        (ladder / "train.so").write_bytes(b"\0")          # its step's kernels, compiled again
        return LearningCheck(steps=40, first=3.0, last=2.0, window=20)
    monkeypatch.setattr(_fake_ladder.FakeLab, "learning_check", learning_check)
    install([ladder / "train.so"], patch=monkeypatch.setattr)
    out = tmp_path / "torch.json"
    assert run(out) == EXIT_INCOMPLETE
    line = one_line(capsys.readouterr().err)
    assert "internal error" not in line and "the learning check could not run" in line
    result = LadderResult.read(out)
    assert result.learning is None and [r.outcome for r in result.rungs] == ["measured"] * 3
    assert any(n.startswith("learning check not run") and "[cause: out_of_space]" in n for n in result.notes)


def test_a_learning_check_that_fails_after_a_rung_failed_is_one_line_and_recorded(
        tmp_path, ladder, monkeypatch, capsys):
    """R1's own code raised; the learning check trains its configuration and raises the same:
    the run says so (exit 1) and keeps what it measured, never an internal error."""
    import _fake_ladder

    def broken(lab, given):
        raise ValueError("a kernel refused the shape")
    rungs = dict(_fake_ladder.RUNGS)
    rungs["R1"] = dataclasses.replace(rungs["R1"], fn=broken)
    monkeypatch.setattr(_fake_ladder, "RUNGS", rungs)

    def learning_check(self, name, recipe, watch=None):
        raise ValueError("a kernel refused the shape")
    monkeypatch.setattr(_fake_ladder.FakeLab, "learning_check", learning_check)
    out = tmp_path / "torch.json"
    assert main(["run", "torch", "--config", "smoke", "--quiet", "--rungs", "R0,R1", "--out", str(out)]) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("perfladder: error: the learning check failed: ValueError: a kernel refused")
    result = LadderResult.read(out)
    assert [r.outcome for r in result.rungs] == ["measured", "error"] and result.learning is None
    assert any(n.startswith("learning check not run: ValueError") for n in result.notes)


def test_resume_after_the_disk_is_freed_measures_the_failed_rung(tmp_path, ladder, monkeypatch, capsys):
    out = tmp_path / "torch.json"
    with monkeypatch.context() as m:
        install([ladder], patch=m.setattr)
        assert run(out) == EXIT_INCOMPLETE
    assert run(out, "--resume", str(out)) == 0
    assert [r.outcome for r in LadderResult.read(out).rungs] == ["measured"] * 3


# -- results files of another schema -------------------------------------------------------------
@pytest.mark.parametrize("schema, writer, says", [
    (3, "0.9.0", "written by perfladder 0.9.0, newer than this one"),
    (3, None, "written by a perfladder newer than this one"),
    (0, "0.0.1", "written by perfladder 0.0.1, older than this one"),
])
def test_a_results_file_of_another_schema_names_its_writer_and_what_to_do(tmp_path, capsys, schema,
                                                                         writer, says):
    data = make_result().to_dict()
    data["schema_version"] = schema
    if writer:
        data["versions"]["perfladder"] = writer
    path = tmp_path / "other.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError):
        LadderResult.read(path)
    assert main(["table", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert str(path) in line and says in line
    assert ("upgrade perfladder" in line) is (schema > 2)
    assert (f"read it with perfladder {writer}" in line) is (schema < 2 and writer is not None)


def test_every_lab_records_the_perfladder_that_wrote_the_file(tmp_path):
    import perfladder
    from perfladder.results.record import python_versions
    r = make_result()
    r.versions = python_versions()
    data = json.loads(r.write(tmp_path / "r.json").read_text())
    assert data["versions"]["perfladder"] == perfladder.__version__
