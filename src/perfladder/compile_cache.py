"""A framework's on-disk compile cache as a source of faults (no framework imports).

Inductor and XLA keep compiled kernels in a folder that outlives the run: a full disk or a
killed compile can leave an entry cut short there, and every later run meets it. What each
framework's ``compiler`` module does with that, through this module:

* an entry that cannot be read: the cache folder is set aside (``set_aside``: moved beside
  itself, never deleted, so it can be looked at) and the compile tried once more in a fresh
  folder at the same place, said in one line with both paths (JAX recompiles such an entry on
  its own; inductor does not, ``perfladder.torch.compiler`` does it for it);
* a folder that cannot be written (``unwritable``: a write refused, or less than
  ``MIN_FREE_BYTES`` free): the cache is turned off for the run, in one line naming the folder
  and its free space;
* each such line is said once per cause (``tell``), on stderr and in the run's notes
  (``LadderResult.notes``: ``begin`` starts a run's, ``listen`` points them at the lab's
  result once it exists).

``cache_folders()`` lists the folders watched, so ``perfladder.faults.environment_cause`` can
tell an error in a cache file from one in the code.
"""
from __future__ import annotations

import datetime as _dt
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

# A folder with less room than this cannot hold a ladder's compiled kernels (a smoke ladder's
# inductor cache is a few MiB; the full config's, with autotuning, tens).
MIN_FREE_BYTES = 64 * 2**20
VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")
SET_ASIDE = "unreadable"              # a set-aside folder is named NAME.unreadable-<UTC time>

_watched: dict[str, Path] = {}        # what each framework's cache is in now
_said: set = set()
_note: Callable[[str], None] | None = None
_pending: list[str] = []              # said before a run's notes existed


def watch(owner: str, folder: str | os.PathLike) -> Path:
    """Record that ``owner``'s compile cache ("inductor", "jax") is in ``folder``."""
    _watched[owner] = Path(folder).expanduser().absolute()
    return _watched[owner]


def watched(owner: str) -> Path | None:
    return _watched.get(owner)


def cache_folders() -> list[Path]:
    """The compile cache folders this process uses or was told of (its variables')."""
    named = [Path(v) for v in (os.environ.get(var) for var in VARIABLES) if v]
    return list(dict.fromkeys([*_watched.values(), *named]))


def begin() -> None:
    """A new run: each cause is said again, and recorded by the next ``listen``."""
    global _note
    _note = None
    _said.clear()
    _pending.clear()


def listen(note: Callable[[str], None] | None) -> None:
    """Where the lines ``tell`` says are also recorded (a lab's ``result.notes.append``),
    from now and since ``begin``."""
    global _note
    _note = note
    if note is not None:
        for line in _pending:
            note(line)
        _pending.clear()


def tell(line: str, key=None) -> bool:
    """Say ``line`` on stderr and record it in the run's notes, once per ``key`` (the line
    itself when None). Whether it was said now."""
    key = line if key is None else key
    if key in _said:
        return False
    _said.add(key)
    print(f"perfladder: {line}", file=sys.stderr, flush=True)
    if _note is not None:
        _note(line)
    else:
        _pending.append(line)
    return True


def free_bytes(folder: Path) -> int | None:
    """Free space where ``folder`` is (or would be created); None when it cannot be asked."""
    where = Path(folder)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return shutil.disk_usage(where).free
    except OSError:
        return None


def free_words(folder: Path) -> str:
    """``'1.0 MiB free'`` (or that the free space is unknown)."""
    free = free_bytes(folder)
    if free is None:
        return "free space unknown"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if free >= size:
            return f"{free / size:.1f} {unit} free"
    return f"{free} bytes free"


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot take a compile cache (a probe file refused, or too little room),
    or None when it can."""
    probe = Path(folder) / f".perfladder-probe-{os.getpid()}"
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return e.strerror or str(e)
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    free = free_bytes(folder)
    if free is not None and free < MIN_FREE_BYTES:
        return f"too little room for compiled kernels, under {MIN_FREE_BYTES // 2**20} MiB"
    return None


def set_aside(folder: Path) -> Path:
    """Move ``folder`` beside itself (``NAME.unreadable-<UTC time>``), and make an empty one in
    its place; the new name. Raises ``OSError`` when it cannot be moved."""
    folder = Path(folder)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = folder.with_name(f"{folder.name}.{SET_ASIDE}-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{folder.name}.{SET_ASIDE}-{stamp}-{n}")
    os.rename(folder, target)
    folder.mkdir(parents=True, exist_ok=True)
    return target


def set_aside_line(owner_words: str, folder: Path, moved: Path, why: str) -> str:
    return (f"{owner_words} {folder} could not be read ({why}); moved it to {moved} "
            "and compiled again")


def turned_off_line(owner_words: str, folder: Path, why: str, instead: str) -> str:
    return (f"{owner_words} {folder} cannot be written ({why}; {free_words(folder)}): "
            f"turned off for this run{instead}")
