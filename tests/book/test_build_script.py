"""scripts/build_book.sh when things go wrong, on a stand-in jupyter-book (a package of that
name on PYTHONPATH whose build sleeps, writes pages or fails as told) so that no notebook runs:
a second build into the same folder is refused naming the first one's PID, a signal stops
the whole tree of processes in one line, a failed build's pages say so and the previous good
pages are set aside, its variables are checked in one line each, and
benchmarks/gpu_book_session.sh refuses to start over a running job."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_book.sh"
SRC = ROOT / "src"

FAKE_MAIN = r'''
import os, subprocess, sys, time
from pathlib import Path

def main():
    args = sys.argv[1:]
    out = Path(args[args.index("--path-output") + 1]) / "_build" if "--path-output" in args else None
    mode = os.environ["FAKE_BOOK"]
    if mode == "sleep":     # a kernel in its own session, as jupyter_client starts them
        import signal
        def noisy(signum, frame):   # what jupyter-book does on SIGTERM: tracebacks, then exit
            print("Traceback (most recent call last):\n  DeadKernelError: Kernel died",
                  file=sys.stderr, flush=True)
            sys.exit(1)
        signal.signal(signal.SIGTERM, noisy)
        kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                               start_new_session=True)
        pids = Path(os.environ["FAKE_PIDS"])   # whole or not at all: the test polls for it
        pids.with_suffix(".part").write_text(f"{os.getpid()} {kid.pid}")
        pids.with_suffix(".part").replace(pids)
        print("reading sources...", flush=True)
        time.sleep(120)
    html = out / "html"
    html.mkdir(parents=True, exist_ok=True)
    (html / "index.html").write_text("<html><body class='x'><p>" + mode + "</p></body></html>")
    return 0 if mode == "ok" else 1
'''


@pytest.fixture
def fake_book(tmp_path):
    pkg = tmp_path / "fakes" / "jupyter_book"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text("")
    (pkg / "cli" / "main.py").write_text(FAKE_MAIN)
    return tmp_path / "fakes"


def env_for(tmp_path, fakes=None, **extra) -> dict:
    path = [str(fakes)] if fakes else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path + [str(SRC)]),
           "PERFLADDER_CONFIG": "smoke", "PERFLADDER_BOOK_OUT": str(tmp_path / "out"), **extra}
    env.pop("PERFLADDER_RESULTS_DIR", None)
    return env


def build(env, cwd=ROOT, timeout=120) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(["bash", str(SCRIPT), sys.executable], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)          # the script's trap stops what it started
        proc.communicate(timeout=60)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def alive(pid: int) -> bool:
    """Still running (a zombie that nobody has reaped yet is not)."""
    from perfladder.book.build import running
    return running(pid)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_whole_build_in_one_line(tmp_path, fake_book, sig, code):
    pids = tmp_path / "pids"
    proc = subprocess.Popen(["bash", str(SCRIPT), sys.executable], cwd=ROOT,
                            env=env_for(tmp_path, fake_book, FAKE_BOOK="sleep", FAKE_PIDS=str(pids)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not pids.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids.exists(), proc.communicate(timeout=60)
    book, kernel = map(int, pids.read_text().split())
    try:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == code
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"[book] interrupted ({sig.name}) after "), err
        assert not alive(book) and not alive(kernel)       # the kernel had its own session
    finally:
        for pid in (book, kernel):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_second_build_is_refused_naming_the_first(tmp_path):
    lock = tmp_path / "out" / "_build" / ".build.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; f = open(sys.argv[1], 'a+'); "
         "fcntl.flock(f, fcntl.LOCK_EX); f.truncate(0); f.write(f'{os.getpid()} 2026-01-01T00:00:00Z'); "
         "f.flush(); print('held', flush=True); time.sleep(60)", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = build(env_for(tmp_path))
        assert r.returncode == 3
        assert r.stderr.strip() == (f"[book] refused: another book build (PID {holder.pid}, started "
                                    f"2026-01-01T00:00:00Z) is running in {lock.parent}; wait for it "
                                    f"to finish or stop it (kill {holder.pid})")
        assert sorted(p.name for p in lock.parent.iterdir()) == [".build.lock"]   # nothing touched
    finally:
        holder.kill()
        holder.wait()


def test_a_failed_build_marks_its_pages_and_keeps_the_last_good_ones(tmp_path, fake_book):
    ok = build(env_for(tmp_path, fake_book, FAKE_BOOK="ok"))
    assert ok.returncode == 0, ok.stderr
    html = tmp_path / "out" / "_build" / "html"
    good = (html / "index.html").read_text()
    assert "ok" in good and not (html.parent / "html.previous").exists()
    bad = build(env_for(tmp_path, fake_book, FAKE_BOOK="broken"))
    assert bad.returncode == 1
    [line] = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert line.startswith("[book] FAILED (exit 1)") and "carry a banner" in line
    page = (html / "index.html").read_text()
    assert "broken" in page and "written by a build that FAILED (exit 1" in page
    assert (html / "BUILD-FAILED.txt").exists()
    assert (html.parent / "html.previous" / "index.html").read_text() == good
    # the next build drops the failed pages, not the good ones; a success clears both away
    again = build(env_for(tmp_path, fake_book, FAKE_BOOK="ok"))
    assert again.returncode == 0 and "FAILED" not in (html / "index.html").read_text()
    assert not (html.parent / "html.previous").exists()


def test_variables_are_checked_in_one_line_each(tmp_path, fake_book):
    for env, says in [({"PERFLADDER_CONFIG": "tiny"}, "unknown config 'tiny'"),
                      ({"PERFLADDER_BOOK_FRESH": "sometimes"},
                       "PERFLADDER_BOOK_FRESH='sometimes' is not valid; valid: 1, true, yes, 0, false, no")]:
        r = build(env_for(tmp_path, **env))
        assert r.returncode == 2 and "Traceback" not in r.stderr
        [line] = r.stderr.splitlines()
        assert line.startswith("scripts/build_book.sh: ") and says in line
    for word in ("TRUE", "yes", "1", "no"):
        r = build(env_for(tmp_path, fake_book, FAKE_BOOK="ok", PERFLADDER_BOOK_FRESH=word))
        assert r.returncode == 0, r.stderr
    # a relative output folder is taken from where the script is called, not the repository
    here = tmp_path / "caller"
    here.mkdir()
    r = build({**env_for(tmp_path, fake_book, FAKE_BOOK="ok"), "PERFLADDER_BOOK_OUT": "rel"}, cwd=here)
    assert r.returncode == 0, r.stderr
    assert (here / "rel" / "_build" / "html" / "index.html").exists()
    assert not (ROOT / "rel").exists()


def test_the_gpu_session_refuses_to_start_over_a_running_job(tmp_path):
    job, tree = tmp_path / "job", tmp_path / "tree"
    job.mkdir()
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (job / "pid").write_text(f"{runner.pid}\n")
        (job / "id").write_text("2026-01-01T00:00:00Z\n")
        env = {**os.environ, "PERFLADDER_JOB_DIR": str(job), "PERFLADDER_JOB_TREE": str(tree)}
        r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_book_session.sh"), "start"],
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 3
        assert f"job 2026-01-01T00:00:00Z (PID {runner.pid}) is still running" in r.stderr
        assert sorted(p.name for p in job.iterdir()) == ["id", "pid"] and not tree.exists()
        w = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_book_session.sh"), "wait", "0"],
                           env=env, capture_output=True, text=True, timeout=60)
        assert "job 2026-01-01T00:00:00Z" in w.stdout and w.stdout.strip().endswith("RUNNING")
        assert w.returncode == 0
        # a wait given a folder also packs what the job has so far: a ladder's JSON written
        # mid-build comes back even if no later call reaches the machine
        (tree / "_build" / "results").mkdir(parents=True)
        (tree / "_build" / "results" / "torch.json").write_text("{}")
        (job / "book.log").write_text("the torch notebook ran\n")
        packed = tmp_path / "packed"
        w = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_book_session.sh"), "wait", "0",
                            str(packed)], env=env, capture_output=True, text=True, timeout=60)
        assert w.returncode == 0 and w.stdout.strip().endswith("RUNNING"), w.stderr
        assert "still running: collecting what it has so far" in w.stderr
        with tarfile.open(packed / "results.tgz") as t:
            assert "results/torch.json" in t.getnames()
        with tarfile.open(packed / "evidence.tgz") as t:
            assert "./book.log" in t.getnames()
    finally:
        runner.kill()
        runner.wait()


def test_the_compile_ahead_stage_runs_before_the_notebooks_when_asked(tmp_path, fake_book):
    """PERFLADDER_BOOK_AHEAD=1 runs perfladder.ahead.book before jupyter-book. Here it is asked
    for a rung that does not exist, so both frameworks' stages fail at once: the build says so
    and goes on (the ladders then compile as they go). A bad value of the variable is one line."""
    r = build(env_for(tmp_path, fake_book, FAKE_BOOK="ok", PERFLADDER_BOOK_AHEAD="1",
                      PERFLADDER_AHEAD_RUNGS="R99"))
    assert r.returncode == 0, r.stderr
    for fw in ("torch", "jax"):
        assert f"[ahead] {fw}: the stage failed (exit 1); its ladder compiles as it goes" in r.stdout
        assert f"[ahead] {fw}: ValueError" in r.stderr and "R99" in r.stderr
    assert "[book] compiled ahead in " in r.stdout and "Traceback" not in r.stderr
    assert (tmp_path / "out" / "_build" / "ahead").is_dir()
    r = build(env_for(tmp_path, fake_book, FAKE_BOOK="ok", PERFLADDER_BOOK_AHEAD="later"))
    assert r.returncode == 2
    [line] = r.stderr.splitlines()
    assert "PERFLADDER_BOOK_AHEAD='later' is not valid" in line
