"""One book build at a time in one build folder (no framework imports).

``scripts/build_book.sh`` opens the lock file on a descriptor and has this module lock it:

    exec 9<>"$BUILD/.build.lock"
    python -m perfladder.book.lock 9 "$$"      # exit 0: ours; exit 3: another build holds it

The lock is ``flock(2)`` on that open file, which the script and every process it starts
share: it is held for as long as any part of the build still runs, and the kernel drops it
when the last of them exits, however they end. So a build that died leaves no stale lock:
the file still names its PID, the lock is simply free, and the next build takes it over
(and says whose it was). The file holds ``PID started-at`` of the build that holds it, for
the one line a second build prints.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import fcntl
import os
import sys
from pathlib import Path

EXIT_HELD = 3


class LockHeld(RuntimeError):
    """Another build holds the lock."""


def running(pid: int) -> bool:
    """Whether a process ``pid`` still runs (one of another user counts; a zombie waiting for
    its parent to reap it does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):      # no /proc (macOS): the signal answered, so it exists
        return True


def _holder(fd: int) -> tuple[int | None, str]:
    """``(pid, started)`` written in the lock file (None, '' when it names nobody)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        words = os.read(fd, 200).decode(errors="replace").split()
    except OSError:
        return None, ""
    if not words or not words[0].isdigit():
        return None, ""
    return int(words[0]), " ".join(words[1:2])


def acquire(fd: int, pid: int, folder: str = "this build folder") -> str:
    """Lock the open file ``fd`` for the build ``pid``; returns a note when it takes over
    the lock of a build that is gone ('' otherwise). ``LockHeld`` names the holder."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other, started = _holder(fd)
        when = f", started {started}" if started else ""
        if other is None:
            msg = f"another book build is running in {folder}; wait for it to finish"
        elif running(other):
            msg = (f"another book build (PID {other}{when}) is running in {folder}; wait for it "
                   f"to finish or stop it (kill {other})")
        else:
            msg = (f"processes left by book build PID {other}{when} (the script itself is gone) "
                   f"still hold {folder}; wait for them to end or stop them")
        raise LockHeld(msg) from None
    other, started = _holder(fd)
    note = ""
    if other is not None and other != pid:
        note = (f"took over the lock of book build PID {other}"
                f"{', started ' + started if started else ''}, which no longer holds it")
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{pid} {now}\n".encode())
    return note


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perfladder.book.lock",
                                 description="Take the book build lock on an open descriptor.")
    ap.add_argument("fd", type=int, help="the descriptor the build script opened the lock file on")
    ap.add_argument("pid", type=int, help="the build script's PID (written into the lock file)")
    ap.add_argument("--folder", default="this build folder", help="the build folder, for messages")
    a = ap.parse_args(argv)
    try:
        note = acquire(a.fd, a.pid, a.folder)
    except LockHeld as e:
        print(f"[book] refused: {e}", file=sys.stderr)
        return EXIT_HELD
    except OSError as e:
        print(f"[book] refused: cannot lock descriptor {a.fd} ({e.strerror or e})", file=sys.stderr)
        return EXIT_HELD
    if note:
        print(f"[book] {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
