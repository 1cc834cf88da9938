"""XLA's settings for the ladder's compiles. Each must be made before JAX starts its backend
(the first ``jax.devices()``, array or jit call), because XLA reads ``XLA_FLAGS`` once.

* ``cublas_gemms()``, the full configuration's on a GPU. XLA's GPU compiler autotunes every
  matmul among cuBLAS's algorithms *and* Triton GEMM tilings, each Triton candidate compiled
  before it is timed. ``--xla_gpu_enable_triton_gemm=false`` keeps the autotuning among
  cuBLAS's algorithms and drops the Triton candidates. On the reference H200 that halved every
  compile (the un-jitted R0's first call too) and no rung ran slower
  (``benchmarks/results/h200-xla-gemm-2026-12-03``).
* ``fast_cpu_compiles()``, the smoke configuration's on a CPU: LLVM's optimisations off and an
  on-disk cache of compiled programs. Never for real measurements.
* ``xla_flags()``: the flags in effect, which every results file records (``versions``).
* ``guard_compile_cache()``, every lab's: the persistent cache as a fault source
  (``perfladder.compile_cache``). JAX compiles again a cache entry it cannot read, with a
  warning for each: the first sets the folder aside (the rest would fail alike), and the
  warnings become one line per cause. A folder that cannot be written (JAX warns at every
  compile) turns the cache off for the run.
"""
from __future__ import annotations

import os
import re
import tempfile
import threading
from pathlib import Path

import jax

from perfladder import compile_cache

CUBLAS_GEMMS_FLAG = "--xla_gpu_enable_triton_gemm=false"
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"
SMOKE_CACHE_DIR = Path(tempfile.gettempdir()) / "perfladder-jax-smoke-cache"
CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
OWNER = "JAX's persistent compilation cache"
_CACHE_WARNING = re.compile(r"Error (?P<kind>reading|writing) persistent compilation cache entry "
                            r"for '[^']*': (?P<type>\w+): (?P<why>.*)", re.DOTALL)


def backend_started() -> bool:
    """Has JAX started its backend (so that ``XLA_FLAGS`` can no longer change)? True when
    it cannot tell: a flag is then never claimed to have taken effect."""
    try:   # no public way to ask
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return True


def xla_flags() -> str:
    """``XLA_FLAGS`` as this process has it."""
    return os.environ.get("XLA_FLAGS", "").strip()


def add_xla_flag(flag: str) -> bool:
    """Append ``flag`` (``--name=value``) to ``XLA_FLAGS`` unless the variable names it already
    (a user's own setting wins) or JAX's backend has started: then this process's XLA would not
    read it, and the processes it starts (R5's) must compile as it does. Whether it was added."""
    if backend_started():
        return False
    if flag.split("=")[0] not in xla_flags():
        os.environ["XLA_FLAGS"] = f"{xla_flags()} {flag}".strip()
    return True


def cublas_gemms() -> bool:
    """XLA's matmuls from cuBLAS's autotuned algorithms, without Triton GEMM candidates (see the
    module docstring). Returns whether it took effect (not once JAX's backend is up)."""
    return add_xla_flag(CUBLAS_GEMMS_FLAG)


def fast_cpu_compiles(cache_dir=SMOKE_CACHE_DIR) -> bool:
    """Make a *smoke* run cheap to compile; call it before JAX touches a device.

    On two CPU cores a smoke ladder spends most of its time in XLA's LLVM back end. This
    turns LLVM optimisation off (``FAST_COMPILE_FLAG``: about 3x faster compiles, slower
    generated code -- irrelevant for smoke numbers, which are not performance results). It
    must not be used for real measurements. ``cache_dir`` (None: off) also keeps compiled
    programs on disk -- JAX's persistent compilation cache -- so the tests, the notebook, a
    book build and the processes they start share one set of compilations (in
    ``$JAX_COMPILATION_CACHE_DIR`` when the user set it: their folder wins); a program loaded
    from it still counts as a compilation for the recompile guard, and first-call times then
    measure a cache load, not a compile.

    Returns whether the flag took effect (it cannot once JAX's backend is initialised).
    """
    took = add_xla_flag(FAST_COMPILE_FLAG)
    if cache_dir is SMOKE_CACHE_DIR and os.environ.get(CACHE_ENV):
        cache_dir = os.environ[CACHE_ENV]
    if cache_dir is not None:
        cache = {"jax_compilation_cache_dir": str(cache_dir),
                 "jax_persistent_cache_min_compile_time_secs": 0.0,
                 "jax_persistent_cache_min_entry_size_bytes": 0}
        for name, value in cache.items():
            jax.config.update(name, value)
            os.environ[name.upper()] = str(value)   # processes started from here share it, as XLA_FLAGS
    return took


def cache_folder() -> Path | None:
    """Where JAX's persistent cache is now, or None when it is off."""
    folder = getattr(jax.config, "jax_compilation_cache_dir", None)
    if not folder or not getattr(jax.config, "jax_enable_compilation_cache", True):
        return None
    return Path(folder).expanduser().absolute()


def guard_compile_cache() -> None:
    """Watch JAX's persistent cache for this process (see the module docstring), before a
    run's first compile; the lines said go to its notes once ``compile_cache.listen`` is
    handed them."""
    compile_cache.begin()
    _state.update(set_aside=False)
    folder = cache_folder()
    if folder is not None:
        compile_cache.watch("jax", folder)
        why = compile_cache.unwritable(folder)
        if why is not None:
            turn_off(folder, why)
    from jax._src import compiler as jax_compiler
    if not isinstance(jax_compiler.warnings, _CacheWarnings):
        jax_compiler.warnings = _CacheWarnings(jax_compiler.warnings)


def turn_off(folder: Path, why: str) -> None:
    """No persistent cache for the rest of this process, said in one line."""
    from jax._src import compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    compile_cache.tell(compile_cache.turned_off_line(OWNER, folder, why, ""), key=("off", folder))


_state = {"set_aside": False}
_lock = threading.Lock()


def cache_warning(kind: str, why: str) -> None:
    """What JAX warned of (``kind``: 'reading' or 'writing' an entry), as one line per cause:
    the first unreadable entry sets the folder aside, an unwritable one turns the cache off."""
    folder = cache_folder() or compile_cache.watched("jax")
    with _lock:
        if folder is None:
            return
        if kind == "writing":
            if cache_folder() is not None:
                turn_off(folder, compile_cache.unwritable(folder) or why)
            return
        if not _state["set_aside"]:
            _state["set_aside"] = True
            try:
                moved = compile_cache.set_aside(folder)
            except OSError:
                pass
            else:
                compile_cache.tell(compile_cache.set_aside_line(OWNER, folder, moved, why))
                return
        compile_cache.tell(f"{OWNER} {folder}: an entry could not be read ({why}); JAX compiles "
                           "it again", key=("unreadable", why.split(":")[0]))


class _CacheWarnings:
    """``warnings`` as JAX's compiler module sees it: its persistent-cache warnings go to
    ``cache_warning``, every other warning is warned as before."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def warn(self, message, category=None, stacklevel=1, **kw):
        m = _CACHE_WARNING.match(str(message))
        if m is None:
            return self._real.warn(message, category, stacklevel + 1, **kw)
        first = (m["why"].strip().splitlines() or [""])[0][:300]
        cache_warning(m["kind"], f"{m['type']}: {first}")
