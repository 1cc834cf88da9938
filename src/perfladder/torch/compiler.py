"""Inductor's settings for the ladder's compiles (the counterpart of ``perfladder.jax.compiler``).

* ``fast_cpu_compiles()``, the smoke configuration's on a CPU: inductor writes scalar C++
  kernels instead of vectorised ones. On a CPU inductor compiles each of a step's C++
  kernels with the system compiler, and the vectorised ones instantiate ATen's SIMD
  templates: at the smoke config one compiled training step took 37-39 s to compile
  vectorised and 21-22 s scalar on this project's 2-core CI machine (torch 2.13, an empty
  inductor cache each time), with 20 kernels instead of 26. The kernels compute the same
  model (the gates check every rung either way); they run slower, which does not matter for
  smoke numbers, which are not performance results. Never for real measurements.
* ``guard_compile_cache()``, every lab's: inductor's compile cache as a fault source
  (``perfladder.compile_cache``). Inductor never rewrites a kernel file it finds in its cache,
  so one cut short (a full disk, a killed compile) fails every later compile that needs it:
  such a compile is tried once more with the cache folder set aside. A folder that cannot be
  written is turned off for the run (kernels then go to a temporary folder of this process,
  and no cache is read or written). Inductor's own warnings of an unreadable entry become one
  line per cause.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from perfladder import compile_cache
from perfladder.faults import caused_by_interrupt, environment_cause

VEC_ISA_ENV = "TORCHINDUCTOR_VEC_ISA_OK"
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
OWNER = "inductor's compile cache"
_LOGGERS = ("torch._inductor.codecache", "torch._functorch._aot_autograd.autograd_cache")


def fast_cpu_compiles() -> bool:
    """Scalar C++ kernels for inductor on a CPU, in this process and the processes it starts
    (the compile-ahead helpers, a data-parallel launch's ranks), unless
    ``$TORCHINDUCTOR_VEC_ISA_OK`` says otherwise: a user's own setting wins. Returns whether
    the kernels are scalar now."""
    value = os.environ.get(VEC_ISA_ENV, "")
    if value == "":
        os.environ[VEC_ISA_ENV] = "0"
    elif value != "0":
        return False
    import torch._inductor.config as inductor_config
    inductor_config.cpp.vec_isa_ok = False
    return True


def cache_folder() -> Path:
    """Where inductor keeps its compile cache now (``$TORCHINDUCTOR_CACHE_DIR`` or its default
    under the temporary folder)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser().absolute()
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    return Path(default_cache_dir())


def guard_compile_cache() -> None:
    """Watch inductor's compile cache for this process (see the module docstring), before a
    run's first compile; the lines said go to its notes once ``compile_cache.listen`` is
    handed them."""
    compile_cache.begin()
    folder = compile_cache.watch("inductor", cache_folder())
    why = compile_cache.unwritable(folder)
    if why is not None:
        turn_off(folder, why)
    _retry_compiles()
    if not getattr(sys.unraisablehook, "_perfladder", False):
        sys.unraisablehook = _quiet_half_loaded(sys.unraisablehook)
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _UnreadableEntries) for f in logger.filters):
            logger.addFilter(_UnreadableEntries())


def turn_off(folder: Path, why: str) -> bool:
    """Inductor's caches off for this process, its kernels in a temporary folder (removed at
    exit), said in one line; False when no temporary folder can take them either."""
    import torch.compiler.config as compiler_config
    try:
        instead = Path(tempfile.mkdtemp(prefix="perfladder-inductor-"))
    except OSError as e:
        instead, worse = None, e.strerror or str(e)
    else:
        worse = compile_cache.unwritable(instead)
    if worse is not None:
        if instead is not None:
            shutil.rmtree(instead, ignore_errors=True)
        compile_cache.tell(f"{OWNER} {folder} cannot be written ({why}; "
                           f"{compile_cache.free_words(folder)}), nor a temporary folder "
                           f"({worse}): compiles fail until there is room", key=("off", folder))
        return False
    atexit.register(shutil.rmtree, instead, ignore_errors=True)
    os.environ[CACHE_ENV] = str(instead)
    compiler_config.force_disable_caches = True     # inductor's flag of the same name is an alias
    _clear_caches()
    compile_cache.tell(compile_cache.turned_off_line(
        OWNER, folder, why, f" (its kernels go to {instead}, removed at exit)"), key=("off", folder))
    return True


def _clear_caches() -> None:
    """Inductor's in-memory caches of what it loaded from the folder."""
    from torch._inductor.utils import clear_caches
    clear_caches()


def recover(e: BaseException) -> bool:
    """Make the cache fit to compile again after ``e``, when the cache is what failed it:
    set an unreadable one aside, turn an unwritable one off. Whether to try again."""
    if caused_by_interrupt(e):
        return False
    cause, folder = environment_cause(e), cache_folder()
    if cause == "corrupt_cache":
        try:
            moved = compile_cache.set_aside(folder)
        except OSError:
            return False
        _clear_caches()
        compile_cache.tell(compile_cache.set_aside_line(OWNER, folder, moved, _first_line(e)))
        return True
    if cause in ("out_of_space", "read_only") and not _turned_off():
        return turn_off(folder, compile_cache.unwritable(folder) or _first_line(e))
    return False


def _turned_off() -> bool:
    import torch.compiler.config as compiler_config
    return bool(compiler_config.force_disable_caches)


def _first_line(e: BaseException) -> str:
    inner = getattr(e, "inner_exception", None) or e
    text = (str(inner).strip().splitlines() or [""])[0]
    return f"{type(inner).__name__}: {text}"[:300]


def _retry_compiles() -> None:
    """Every ``torch.compile(...)`` with inductor (the ladder's, a reader's own) tries a compile
    that the cache failed once more, after ``recover``."""
    import torch
    cls = torch._TorchCompileInductorWrapper
    if getattr(cls.__call__, "_perfladder_retry", False):
        return
    original = cls.__call__

    def __call__(self, model_, inputs_, **kw):
        try:
            return original(self, model_, inputs_, **kw)
        except Exception as e:
            if not recover(e):
                raise
        return original(self, model_, inputs_, **kw)

    __call__._perfladder_retry = True
    cls.__call__ = __call__


def _quiet_half_loaded(hook):
    """``hook`` less the traceback Python prints when a compiled graph that an unreadable
    cache entry left half loaded is collected (its ``__del__`` looks for what loading never
    set): the line that set the cache aside said it."""
    def unraisable(u):
        if isinstance(u.exc_value, AttributeError) and "compiled_fn_runner" in str(u.exc_value):
            return
        hook(u)
    unraisable._perfladder = True
    return unraisable


class _UnreadableEntries(logging.Filter):
    """Inductor's warning of a cache entry it cannot load (a traceback each, for every entry),
    as one line per cause; it compiles such an entry again itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "unable to load compiled graph" not in str(record.msg):
            return True
        err = record.exc_info[1] if record.exc_info else None
        why = f"{type(err).__name__}: {err}" if err is not None else record.getMessage()
        compile_cache.tell(f"{OWNER} {cache_folder()}: an entry could not be read ({why}); "
                           "inductor compiles it again", key=("unreadable", type(err).__name__))
        return False
