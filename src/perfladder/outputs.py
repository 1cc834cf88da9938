"""The files the command line writes: checked before any work starts, written all or nothing.

``check_output_path(path, kind, option)`` refuses, with one line naming the option and the
value, a path that is empty, names a directory, has a format its writer cannot produce, lies
under something that is not (and cannot become) a directory, or cannot be written. It returns
the path that will actually be written: matplotlib adds ``.png`` to a figure name that has no
suffix, so ``both`` comes back as ``both.png``.

``write_all([(path, writer), ...])`` has every writer write a temporary file beside its
target and moves them into place only when all have succeeded, so a failed figure leaves
the final results JSON unwritten too (and a failed write leaves no half-written file).

``RunFiles`` is where ``perfladder run`` saves: each finished rung as the ladder goes (so an
interrupt loses only the rung in flight), then the final results and figure together. An
existing results file is replaced only by a run that measured something and whose checks
passed, or when the user says ``--overwrite``; any other run keeps its own results in
``NAME.partial.json`` beside it.

``work_folder(out_dir, prefix)`` is where a data-parallel launch keeps its processes' files:
the folder the caller named, or a temporary one removed once the launch has read them.

No framework imports; matplotlib only to ask which formats it writes.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import sys
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
    target = user_path(path, option)
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


def user_path(value, option: str = "path") -> Path:
    """``value`` with a leading ``~`` or ``~user`` expanded; an ``OutputError`` naming
    ``option`` and the user when there is no such user (or no home to expand ``~`` to)."""
    try:
        return Path(value).expanduser()
    except RuntimeError:
        user = str(value)[1:].split(os.sep, 1)[0]
        who = f"no user {user!r} on this machine" if user else "no home folder to expand '~' to"
        raise OutputError(f"{option} {str(value)!r}: {who}") from None


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


def replace_atomically(path: Path, data: bytes) -> Path:
    """Make ``data`` the content of ``path``: written to a temporary beside it, under a name of
    this process and call (so concurrent writers of one path never share one), flushed to
    disk, then renamed over it. The temporary is removed whatever happens, and ``path`` is
    either the old file or the complete new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())          # on disk before the rename makes it the file
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def partial_path(target: Path) -> Path:
    """Where a run keeps its progress when ``target`` already holds results:
    ``torch.json`` -> ``torch.partial.json`` (still a results file ``--resume`` reads)."""
    return target.with_name(f"{target.stem}.partial{target.suffix}")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return False


class RunFiles:
    """Where ``perfladder run`` saves: every finished rung as the ladder goes (``checkpoint``,
    the engine's hook), then the final results and figure together (``finish``).

    Progress goes to the target itself when there is nothing there to lose (no file yet,
    the very file being resumed, or ``overwrite``), else to ``partial_path(target)``: an
    existing results file is replaced only by a run that measured something and whose
    checks passed (``finish(ok=True)``), or when the user says ``--overwrite``. ``target``
    None (no ``--out``): nothing is saved, and ``saved_line()`` says so.
    """

    def __init__(self, target: Path | None, figure: Path | None = None, *,
                 overwrite: bool = False, resume: Path | None = None):
        self.target, self.figure, self.overwrite = target, figure, bool(overwrite)
        resuming_target = resume is not None and target is not None and _same_file(resume, target)
        self.keep = target is not None and target.exists() and not overwrite and not resuming_target
        self.progress = None if target is None else (partial_path(target) if self.keep else target)
        stale = self.progress is not None and self.progress != target and self.progress.exists()
        if stale and not (resume is not None and _same_file(resume, self.progress)):
            raise OutputError(f"{self.progress} holds the progress of an interrupted run; continue "
                              f"it with --resume {self.progress}, or start afresh with --overwrite")
        self.saved: list[str] = []        # the rungs the progress file holds
        self.save_failed: str | None = None
        self.written: list[Path] = []

    def checkpoint(self, result) -> None:
        """Save ``result`` (a ``LadderResult``) to the progress file. A failure is said once on
        stderr and the ladder goes on: its table still prints at the end."""
        if self.progress is None:
            return
        try:
            result.write(self.progress)
        except (OSError, ValueError) as e:
            if self.save_failed is None:
                print(f"perfladder: warning: cannot save progress to {self.progress} ({e}); "
                      "the ladder goes on", file=sys.stderr, flush=True)
            self.save_failed = str(e)
            return
        self.saved = [r.name for r in result.rungs]

    def saved_line(self) -> str:
        """What an interrupted or failed run leaves: which rungs are where, and how to go on."""
        if self.target is None:
            return "nothing written (no --out given)"
        if not self.saved:
            return "nothing written"
        where = f"{self.progress}" + (f" ({self.target} untouched)" if self.progress != self.target else "")
        return f"{', '.join(self.saved)} saved to {where}, continue with --resume {self.progress}"

    def finish(self, result, ok: bool, figure: Callable[[Path], object] | None = None) -> list[Path]:
        """The final write. ``ok``: the run measured something and its checks passed; only then
        (or with ``overwrite``, or when nothing was there) are the target and the figure
        replaced, both or neither; otherwise the results stay in the progress file."""
        if self.target is None:
            return []
        if not ok and self.keep:
            result.write(self.progress)
            self.saved = [r.name for r in result.rungs]
            self.written = [self.progress]
            return self.written
        writers = []
        if figure is not None and self.figure is not None and (
                ok or self.overwrite or not self.figure.exists()):
            writers.append((self.figure, figure))
        writers.append((self.target, result.write))
        self.written = write_all(writers)
        if self.progress != self.target:
            self.progress.unlink(missing_ok=True)
        self.progress, self.saved = self.target, [r.name for r in result.rungs]
        return self.written


@contextlib.contextmanager
def work_folder(out_dir, prefix: str):
    """``out_dir`` as a ``Path`` (created), kept; without one, a fresh temporary folder named
    ``prefix...`` that is removed on exit, so a launch leaves nothing behind in it."""
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        yield out
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as where:
        yield Path(where)
