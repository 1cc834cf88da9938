"""What a user meets when something goes wrong, in one line (no framework imports).

* ``signals()``: inside it SIGINT, SIGTERM and SIGHUP all raise ``Interrupted`` (a
  ``KeyboardInterrupt``) in the main thread, so every ``finally`` and cleanup runs for all
  three alike. Python's own default for SIGTERM is to die on the spot, leaving temporary
  files behind. A signal the parent process ignores stays ignored.
* ``interrupted()``: the signal received inside ``signals()``, if any. Code that catches
  ``Exception`` to carry on (the ladder engine turns a failing rung into a skipped one)
  asks it, and ``caused_by_interrupt(e)``: a compile worker killed by the same Ctrl-C
  raises an ordinary error in the parent, sometimes before the parent's own interrupt.
* ``guarded(prog, fn, debug)``: the one top-level handler of a command. An interrupt is one
  line (``prog: interrupted (SIGINT)`` and what the command attached with ``annotate``),
  every error one line naming the file, value or variable; ``debug`` (``--debug`` or
  ``PERFLADDER_DEBUG=1``) re-raises instead, so Python prints the traceback.
* ``say(text)``: print to stdout and flush, so a closed pipe or a full disk behind stdout
  surfaces here, as ``OutputClosed``, instead of at interpreter exit.
* ``environment_cause(e)``: whether ``e`` is the machine's failure, not the code's (out of
  space, a read-only folder, an unreadable compile cache, a killed compile worker, a missing
  compiler), as one word of ``ENVIRONMENT_CAUSES``; ``environment_failure(e)`` is what the
  engine records for such a rung (``outcome="failed"`` and the cause), which ``--resume``
  runs again. A run with such a rung is incomplete (``EXIT_INCOMPLETE``).
"""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
from typing import Callable

SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
EXIT_SIGNAL_BASE = 128              # the shell's convention: 128 + the signal's number
EXIT_USER_ERROR = 2
EXIT_INTERNAL = 1
EXIT_INCOMPLETE = 3                 # a rung or the learning check failed for the machine
DEBUG_VARIABLE = "PERFLADDER_DEBUG"
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes"), ("", "0", "false", "no")

_received: list[str] = []           # signals received inside signals(), in order


class Interrupted(KeyboardInterrupt):
    """A SIGINT, SIGTERM or SIGHUP received inside ``signals()``."""

    def __init__(self, signame: str = "SIGINT"):
        super().__init__(signame)
        self.signame = signame

    @property
    def exit_code(self) -> int:
        return EXIT_SIGNAL_BASE + int(getattr(signal, self.signame))


class OutputClosed(OSError):
    """Standard output cannot be written (a closed pipe, a full disk)."""


class UserError(ValueError):
    """A mistake or a fault the user can act on; its message is the whole story."""


def _raise(signum, frame):
    name = signal.Signals(signum).name
    _received.append(name)
    raise Interrupted(name)


@contextlib.contextmanager
def signals():
    """SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` inside the block (main thread only:
    signal handlers cannot be installed from another thread, and there nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for name in SIGNALS:
        sig = getattr(signal, name, None)
        # a signal the parent ignores stays ignored (nohup, a build script's quick helpers)
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
            saved[sig] = signal.signal(sig, _raise)
    _received.clear()
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
        _received.clear()


def interrupted() -> str | None:
    """The first signal received inside the current ``signals()`` block, or None."""
    return _received[0] if _received else None


def caused_by_interrupt(e: BaseException) -> bool:
    """Whether ``e`` is, wraps or was raised while handling a KeyboardInterrupt."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def reraise_if_interrupt(e: BaseException) -> None:
    """Raise ``Interrupted`` when ``e`` came from an interrupt (see ``caused_by_interrupt``)
    or one arrived inside ``signals()`` meanwhile; return otherwise."""
    if caused_by_interrupt(e) or interrupted():
        raise Interrupted(interrupted() or "SIGINT") from e


def annotate(e: BaseException, text: str) -> BaseException:
    """Attach what the command knows about the state it leaves (``; R0 saved to X``) to ``e``:
    ``guarded`` appends it to the one line it prints."""
    e._perfladder_state = text
    return e


def _state(e: BaseException, sep: str = "; ") -> str:
    text = getattr(e, "_perfladder_state", "")
    return f"{sep}{text}" if text else ""


def debug_requested(flag: bool = False) -> bool:
    """``--debug`` or ``$PERFLADDER_DEBUG`` set to a true word; any other word is an error."""
    value = os.environ.get(DEBUG_VARIABLE, "").strip().lower()
    if value not in TRUE_WORDS + FALSE_WORDS:
        raise UserError(f"${DEBUG_VARIABLE}={os.environ[DEBUG_VARIABLE]!r} is not valid; "
                        f"valid: {', '.join(TRUE_WORDS + FALSE_WORDS[1:])}")
    return bool(flag) or value in TRUE_WORDS


def os_error_line(e: OSError) -> str:
    """``'FILE: reason'`` (both files of a rename or a copy), or the error's own words."""
    reason = e.strerror or str(e)
    if e.filename is not None and e.filename2 is not None:
        return f"{e.filename} -> {e.filename2}: {reason}"
    if e.filename is not None:
        return f"{e.filename}: {reason}"
    return reason


# What the machine can do to a rung, one word each, and the words a line says it in.
ENVIRONMENT_CAUSES = {
    "out_of_space": "no space left on the device",
    "read_only": "a folder it writes cannot be written",
    "corrupt_cache": "a compile cache entry could not be read",
    "worker_killed": "a compile worker was killed",
    "missing_compiler": "no working C/C++ compiler",
}
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_WRITE_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)
_SPACE_WORDS = ("no space left on device", "disk quota exceeded")
_KILLED_WORDS = ("terminated abruptly", "killed signal terminated program", "worker died",
                 "subprocess died")
# a pool that lost its worker (inductor's compile sidecar cancels what it had pending)
_KILLED_TYPES = ("BrokenProcessPool", "CancelledError")
_COMPILER_WORDS = ("no working c++ compiler", "no working c compiler", "failed to find c compiler",
                   "g++: not found", "gcc: not found", "c++: not found")
_COMPILERS = ("g++", "gcc", "c++", "cc", "clang", "clang++", "cl", "icpx", "nvcc")
# a compile cache entry cut short: inductor's kernel module without its entry point, a pickle
# or shared library that ends early
_CORRUPT_TYPES = ("UnpicklingError", "EOFError")
_CORRUPT_WORDS = ("file too short", "invalid elf header", "pickle data was truncated",
                  "error reading persistent compilation cache entry")


def _chain(e: BaseException):
    """``e``, its causes and contexts, and what a framework wraps (``inner_exception``)."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += [x.__cause__, x.__context__, getattr(x, "inner_exception", None)]


def _text(x: BaseException) -> str:
    parts = [str(x), str(getattr(x, "output", "") or ""), str(getattr(x, "stderr", "") or "")]
    return " ".join(parts).lower()


def _under(text: str, folders) -> bool:
    return any(str(f).lower() in text for f in folders if f)


def environment_cause(e: BaseException) -> str | None:
    """The machine's part in ``e``: a key of ``ENVIRONMENT_CAUSES``, or None when the error is
    the code's own (a gate, a kernel, a shape) or a property of the card."""
    from perfladder.compile_cache import cache_folders
    chain = list(_chain(e))
    for x in chain:
        if (isinstance(x, OSError) and x.errno in _SPACE_ERRNOS) or any(w in _text(x) for w in _SPACE_WORDS):
            return "out_of_space"
    folders = cache_folders()
    for x in chain:
        if isinstance(x, OSError) and (x.errno == errno.EROFS or "read-only file system" in _text(x)):
            return "read_only"
        if isinstance(x, OSError) and x.errno in _WRITE_ERRNOS and _under(
                f"{x.filename} {x.filename2} {_text(x)}".lower(), folders):
            return "read_only"
    for x in chain:
        name, text = type(x).__name__, _text(x)
        if name in _KILLED_TYPES or any(w in text for w in _KILLED_WORDS) or (
                name == "CalledProcessError" and getattr(x, "returncode", 0) < 0):
            return "worker_killed"
        if name == "InvalidCxxCompiler" or any(w in text for w in _COMPILER_WORDS) or (
                isinstance(x, FileNotFoundError) and os.path.basename(str(x.filename)) in _COMPILERS):
            return "missing_compiler"
    for x in chain:
        name, text = type(x).__name__, _text(x)
        if name in _CORRUPT_TYPES or any(w in text for w in _CORRUPT_WORDS):
            return "corrupt_cache"
        if isinstance(x, AttributeError) and "compile_tasks." in text:   # inductor's kernel module
            return "corrupt_cache"
        where = f"{getattr(x, 'filename', '')} {text}".lower()
        if isinstance(x, (SyntaxError, ImportError, OSError)) and _under(where, folders):
            return "corrupt_cache"
    return None


def environment_where(e: BaseException) -> str | None:
    """The folder the machine's failure ``e`` happened in: the compile cache folder it names,
    else the file it names, else None."""
    from perfladder.compile_cache import cache_folders
    chain = list(_chain(e))
    for folder in cache_folders():
        if any(str(folder).lower() in f"{getattr(x, 'filename', '')} {_text(x)}".lower() for x in chain):
            return str(folder)
    named = [x.filename for x in chain if isinstance(x, OSError) and x.filename]
    return os.fsdecode(named[0]) if named else None


def environment_failure(e: BaseException) -> dict:
    """What the engine records for a rung that raised ``e``: ``outcome="failed"`` and the cause
    (and the folder, where known) in its details when the machine failed it (``--resume`` runs
    it again), else nothing (the engine's own outcome for an error of the rung's code stands)."""
    cause = environment_cause(e)
    if cause is None:
        return {}
    where = environment_where(e)
    return {"outcome": "failed", "details": {"cause": cause, **({"where": where} if where else {})}}


def say(text: str = "", end: str = "\n") -> None:
    """``print(text)`` and flush; a stdout that cannot be written raises ``OutputClosed``."""
    try:
        sys.stdout.write(text + end)
        sys.stdout.flush()
    except BrokenPipeError as e:
        raise OutputClosed(errno.EPIPE, "standard output was closed (broken pipe)") from e
    except OSError as e:
        raise OutputClosed(e.errno, f"cannot write to standard output ({e.strerror or e})") from e


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's final flush of what is still buffered
    does not fail again ('Exception ignored ... BrokenPipeError')."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _line(prog: str, text: str) -> None:
    try:
        print(f"{prog}: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):     # stderr gone too: nobody is left to tell
        pass


def guarded(prog: str, fn: Callable[[], int], *, debug: bool = False,
            user_errors: tuple[type[BaseException], ...] = ()) -> int:
    """Run ``fn()`` inside ``signals()`` and return its exit status; what it raises becomes
    one line on stderr and a status: an interrupt 128 + the signal's number, a closed stdout
    141 (the broken pipe) or 1 (a full disk), a ``user_errors`` / ``UserError`` / ``OSError``
    2, anything else 1 (named as an internal error, with the way to see its traceback)."""
    try:
        with signals():
            rc = fn()
            try:
                sys.stdout.flush()
            except BrokenPipeError as e:
                raise OutputClosed(errno.EPIPE, "standard output was closed (broken pipe)") from e
            except OSError as e:
                raise OutputClosed(e.errno, f"cannot write to standard output ({e.strerror or e})") from e
            return rc
    except KeyboardInterrupt as e:
        if debug:
            raise
        name = e.signame if isinstance(e, Interrupted) else "SIGINT"
        _line(prog, f"interrupted ({name}){_state(e, ' ') or '; nothing written'}")
        return EXIT_SIGNAL_BASE + int(getattr(signal, name))
    except (OutputClosed, BrokenPipeError) as e:     # a print() outside say() meets it raw
        _silence_stdout()
        if e.errno == errno.EPIPE:     # `prog ... | head`: the reader has all it wanted
            if _state(e):
                _line(prog, f"{e.strerror}{_state(e)}")
            return EXIT_SIGNAL_BASE + int(signal.SIGPIPE)
        if debug:
            raise
        _line(prog, f"error: {e.strerror or e}{_state(e)}")
        return EXIT_INTERNAL
    except SystemExit:
        raise
    except (UserError, *user_errors) as e:
        if debug:
            raise
        _line(prog, f"error: {e}{_state(e)}")
        return EXIT_USER_ERROR
    except OSError as e:
        if debug:
            raise
        _line(prog, f"error: {os_error_line(e)}{_state(e)}")
        return EXIT_USER_ERROR
    except Exception as e:
        if debug:
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        _line(prog, f"internal error: {type(e).__name__}: {first}{_state(e)} "
                    f"(--debug or {DEBUG_VARIABLE}=1 shows the traceback)")
        return EXIT_INTERNAL
