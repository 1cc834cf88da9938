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
