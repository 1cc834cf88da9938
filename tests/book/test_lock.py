"""perfladder.book.lock: one build per output folder; a live holder is named, the lock of a
build that died is taken over (the kernel released it with the build's last process)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from perfladder.book.lock import LockHeld, acquire, main, running

HOLD = ("import fcntl, os, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        "f.truncate(0); f.write(f'{os.getpid()} 2026-01-01T00:00:00Z'); f.flush(); "
        "print('held', flush=True); time.sleep(60)")


@pytest.fixture
def lockfile(tmp_path):
    return tmp_path / ".build.lock"


def holder(path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_lock_held_by_another_process_names_it(lockfile):
    p = holder(lockfile)
    fd = os.open(lockfile, os.O_RDWR)
    try:
        with pytest.raises(LockHeld, match=rf"another book build \(PID {p.pid}, started "
                                           rf"2026-01-01T00:00:00Z\) is running in here; .*kill {p.pid}"):
            acquire(fd, os.getpid(), "here")
        p.kill()                      # the holder dies: the kernel drops its lock ...
        p.wait()
        note = acquire(fd, os.getpid(), "here")          # ... and the next build takes it over
        assert note == (f"took over the lock of book build PID {p.pid}, started "
                        "2026-01-01T00:00:00Z, which no longer holds it")
        assert lockfile.read_text().split()[0] == str(os.getpid())
    finally:
        os.close(fd)
        if p.poll() is None:
            p.kill()


def test_a_lock_file_of_a_dead_build_is_free(lockfile, capsys):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    lockfile.write_text(f"{gone.stdout.strip()} 2026-01-01T00:00:00Z\n")
    fd = os.open(lockfile, os.O_RDWR)
    try:
        assert main([str(fd), str(os.getpid())]) == 0
        assert f"took over the lock of book build PID {gone.stdout.strip()}" in capsys.readouterr().out
    finally:
        os.close(fd)


def test_the_command_line_refuses_in_one_line(lockfile, capsys):
    p = holder(lockfile)
    fd = os.open(lockfile, os.O_RDWR)
    try:
        assert main([str(fd), str(os.getpid()), "--folder", "/some/_build"]) == 3
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"[book] refused: another book build (PID {p.pid}")
    finally:
        os.close(fd)
        p.kill()
        p.wait()


def test_running_counts_live_processes_only():
    """The one process check of the build and its lock: no PID is not a process, an exited
    child not yet reaped (a zombie) no longer runs, nor does one reaped."""
    assert running(os.getpid()) and not running(0) and not running(-1)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    while True:     # exited, not reaped: a zombie
        try:
            if open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except FileNotFoundError:
            pytest.skip("no /proc here")
        time.sleep(0.01)
    assert not running(child.pid)
    child.wait()
    assert not running(child.pid)
