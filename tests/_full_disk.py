"""A full disk under some folders, made at the write point (a test cannot mount a small
filesystem here): every open for writing of a file under them fails with ENOSPC, as the
kernel's would, after the first ``after`` such opens.

    install(["/tmp/x/cache"], after=1, patch=monkeypatch.setattr)     # in a test's process
    FULL_DISK=/tmp/x/cache FULL_DISK_AFTER=1 python tests/_full_disk.py run torch ...   # the CLI
"""
from __future__ import annotations

import builtins
import errno
import io
import os
import sys

WRITE_MODES = set("wax+")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND


def install(prefixes, after: int = 0, patch=setattr) -> dict:
    """Fail writes under ``prefixes`` (strings a path starts with) after ``after`` of them;
    returns the counts ``{"writes": n, "refused": n}``."""
    prefixes = [str(p) for p in prefixes if str(p)]
    seen = {"writes": 0, "refused": 0}
    real_open, real_os_open = io.open, os.open

    def full(path) -> bool:
        try:
            where = os.path.abspath(os.fsdecode(path))
        except TypeError:             # an open file descriptor
            return False
        if not any(where.startswith(p) for p in prefixes):
            return False
        seen["writes"] += 1
        if seen["writes"] <= after:
            return False
        seen["refused"] += 1
        return True

    def refuse(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fsdecode(path))

    def open_(file, mode="r", *args, **kw):
        if WRITE_MODES & set(mode) and full(file):
            refuse(file)
        return real_open(file, mode, *args, **kw)

    def os_open(path, flags, *args, **kw):
        if flags & WRITE_FLAGS and full(path):
            refuse(path)
        return real_os_open(path, flags, *args, **kw)

    patch(io, "open", open_)
    patch(builtins, "open", open_)
    patch(os, "open", os_open)
    return seen


if __name__ == "__main__":
    install(os.environ["FULL_DISK"].split(os.pathsep), int(os.environ.get("FULL_DISK_AFTER", "0")))
    from perfladder.cli import main
    sys.exit(main(sys.argv[1:]))
