"""What ``scripts/build_book.sh`` asks of Python when a build stops early (no framework imports).

    python -m perfladder.book.build stop PID              # PID and every process below it
    python -m perfladder.book.build mark-failed HTML WHY  # label the pages of a failed build
    python -m perfladder.book.build set-aside BUILD       # before a build: html -> html.previous

* ``stop``: the process tree is read first (``ps``), then every process in it gets SIGTERM,
  and what is still alive after a grace period SIGKILL. The tree is taken before anything
  is signalled, because a notebook kernel whose parent dies is re-parented and would drop out
  of it; reading it once catches them all.
* ``mark-failed``: every page of ``_build/html`` gets a banner saying that the build that
  wrote it failed, and why, and the folder a ``BUILD-FAILED.txt``, so nobody reads a failed
  or a half-written book as a good one.
* ``set-aside``: the previous build's pages move to ``html.previous`` before a build starts
  (the pages of a failed build are dropped instead), so whatever ``_build/html`` holds after
  a build was written by it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import html as _html
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

FAILED_FILE = "BUILD-FAILED.txt"
PREVIOUS = "html.previous"
BANNER_ID = "perfladder-build-failed"
_BODY = re.compile(rb"<body[^>]*>", re.IGNORECASE)


def children_of() -> dict[int, list[int]]:
    """``{ppid: [pid, ...]}`` of every process ``ps`` lists."""
    out = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    kids: dict[int, list[int]] = {}
    for line in out.splitlines():
        words = line.split()
        if len(words) == 2 and words[0].isdigit() and words[1].isdigit():
            kids.setdefault(int(words[1]), []).append(int(words[0]))
    return kids


def tree(root: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    """``root`` and all its descendants, parents before children."""
    kids = children_of() if kids is None else kids
    order, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        if pid in order:
            continue
        order.append(pid)
        todo.extend(kids.get(pid, []))
    return order


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(root: int, grace_s: float = 10.0) -> list[int]:
    """SIGTERM ``root`` and its whole tree, SIGKILL what outlives ``grace_s``; the PIDs signalled."""
    pids = [p for p in tree(root) if p != os.getpid()]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for p in pids:
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return pids


def mark_failed(html_dir: Path, why: str) -> int:
    """Put the failure banner on every page under ``html_dir``; the number of pages marked."""
    html_dir = Path(html_dir)
    if not html_dir.is_dir():
        return 0
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"This copy of the book was written by a build that FAILED ({why}, {when}). Its "
            "pages may be missing, incomplete or wrong; rebuild before reading its numbers.")
    (html_dir / FAILED_FILE).write_text(text + "\n")
    banner = (f'<div id="{BANNER_ID}" style="background:#b00020;color:#fff;padding:0.6em 1em;'
              f'font-weight:bold">{_html.escape(text)}</div>').encode()
    marked = 0
    for page in sorted(html_dir.rglob("*.html")):
        data = page.read_bytes()
        if BANNER_ID.encode() in data:
            continue
        m = _BODY.search(data)
        if m is None:
            continue
        page.write_bytes(data[:m.end()] + banner + data[m.end():])
        marked += 1
    return marked


def set_aside(build: Path) -> str:
    """Before a build: ``build/html`` becomes ``build/html.previous`` (a failed build's pages
    are removed instead, so ``html.previous`` stays the last good one); what happened."""
    html_dir, previous = Path(build) / "html", Path(build) / PREVIOUS
    if not html_dir.exists():
        return ""
    if (html_dir / FAILED_FILE).exists():
        shutil.rmtree(html_dir)
        return "removed the pages of the last (failed) build"
    if previous.exists():
        shutil.rmtree(previous)
    html_dir.rename(previous)
    return f"the previous build's pages are in {previous} until this build succeeds"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perfladder.book.build", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stop", help="SIGTERM a process and everything below it")
    s.add_argument("pid", type=int)
    s.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
    m = sub.add_parser("mark-failed", help="label the pages of a failed build")
    m.add_argument("html", type=Path)
    m.add_argument("why")
    a = sub.add_parser("set-aside", help="move the previous build's pages to html.previous")
    a.add_argument("build", type=Path)
    args = ap.parse_args(argv)
    # the build script's own trap handles an interrupt; these run to the end (they are quick)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if args.cmd == "stop":
            stop(args.pid, args.grace)
        elif args.cmd == "mark-failed":
            n = mark_failed(args.html, args.why)
            if n:
                print(f"[book] {n} page(s) in {args.html} marked as written by a failed build")
        else:
            said = set_aside(args.build)
            if said:
                print(f"[book] {said}")
    except (OSError, subprocess.SubprocessError) as e:
        print(f"[book] {args.cmd}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
