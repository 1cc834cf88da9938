"""The files the command line writes: checked before any work starts, written all or nothing.

``check_output_path(path, kind, option)`` refuses, with one line naming the option and the
value, a path that is empty, names a directory, has a format its writer cannot produce, lies
under something that is not (and cannot become) a directory, or cannot be written. It returns
the path that will actually be written: matplotlib adds ``.png`` to a figure name that has no
suffix, so ``both`` comes back as ``both.png``.

``write_all([(path, writer), ...])`` has every writer write a temporary file beside its
target and moves them into place only when all have succeeded, so a run whose figure fails
leaves no results JSON behind (and a failed write leaves no half-written file).

No framework imports; matplotlib only to ask which formats it writes.
"""
from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path
from typing import Callable

KINDS = ("json", "figure")
# Figure formats matplotlib writes with its own backends and Pillow (both dependencies of
# perfladder); 'pgf' is left out because it needs a LaTeX installation.
FIGURE_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")
DEFAULT_FIGURE_FORMAT = "png"     # matplotlib's savefig.format default, added to a bare name


class OutputError(ValueError):
    """An output path the command line cannot write."""


def figure_formats() -> tuple[str, ...]:
    """The figure suffixes (without the dot) that this matplotlib can write."""
    from matplotlib.backend_bases import FigureCanvasBase
    supported = FigureCanvasBase.get_supported_filetypes()
    return tuple(f for f in FIGURE_FORMATS if f in supported)


def check_output_path(path, kind: str, option: str = "output") -> Path:
    """The file that writing ``path`` as ``kind`` (``'json'`` or ``'figure'``) will produce.

    Raises ``OutputError`` naming ``option`` and the value if it cannot be written.
    Nothing is created.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not valid; valid choices: {KINDS}")
    if path is None or not str(path).strip():
        raise OutputError(f"{option} is empty; give the file to write")
    shown = f"{option} {str(path)!r}"
    target = Path(path).expanduser()
    if target.is_dir() or str(path).endswith(("/", os.sep)):
        raise OutputError(f"{shown} is a directory; give a file name inside it")
    suffix = target.suffix.lower().lstrip(".")
    if kind == "json":
        if suffix != "json":
            raise OutputError(f"{shown}: results are written as JSON, so the name must end in "
                              f".json (got {'.' + suffix if suffix else 'no suffix'})")
    else:
        formats = figure_formats()
        if not suffix:
            target = target.with_name(f"{target.name}.{DEFAULT_FIGURE_FORMAT}")
        elif suffix not in formats:
            raise OutputError(f"{shown}: matplotlib cannot write .{suffix} figures here; "
                              f"valid choices: {', '.join(formats)}")
    if target.is_dir():                        # 'out' was free, but 'out.png' is a folder
        raise OutputError(f"{shown}: {target} is a directory")
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputError(f"{shown}: the existing file is not writable")
    _check_parent(target.parent, shown)
    return target


def _check_parent(parent: Path, shown: str) -> None:
    """``parent`` is a directory or can be made one, and files can be created there."""
    existing = parent
    while not existing.exists():
        if existing == existing.parent:        # a root that does not exist (cannot happen on POSIX)
            raise OutputError(f"{shown}: no existing folder above {parent}")
        if existing.is_symlink():              # a dangling link: mkdir would fail on it
            raise OutputError(f"{shown}: {existing} is a broken symbolic link")
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"{shown}: {existing} is a file, so {parent} cannot be a directory")
    try:    # the only reliable test (root, ACLs, read-only mounts): create a file and drop it
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise OutputError(f"{shown}: cannot create files in {existing} "
                          f"({e.strerror or e})") from None


def _make_parents(folder: Path) -> list[Path]:
    """``mkdir -p folder``; the folders it created, outermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for d in reversed(missing):
        d.mkdir()
    return list(reversed(missing))


def write_all(writers: list[tuple[Path, Callable[[Path], object]]]) -> list[Path]:
    """Call ``writer(tmp)`` for every ``(target, writer)``, then move each ``tmp`` onto its target.

    The temporary files sit beside their targets and keep the target's suffix (matplotlib
    picks the format from it). If any writer raises, every temporary file and every folder
    made here is removed and the error propagates: no target is touched.
    """
    made: list[Path] = []
    staged: list[tuple[Path, Path]] = []
    try:
        for target, write in writers:
            target = Path(target)
            made += _make_parents(target.parent)
            tmp = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp{target.suffix}")
            staged.append((tmp, target))
            write(tmp)
            if not tmp.is_file():
                raise OSError(f"the writer of {target} wrote nothing")
        for tmp, target in staged:
            os.replace(tmp, target)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        for d in reversed(made):               # innermost first; only if still empty
            try:
                d.rmdir()
            except OSError:
                pass
        raise
    return [target for _, target in staged]
