"""What ``perfladder run`` checks before any work, each refused in one line (``CLIError``):
the rungs asked for, the packages that write the results, the machine's corpus and compile
cache folders, the ``--resume`` file, the memory cap."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from perfladder.faults import UserError
from perfladder.outputs import user_path
from perfladder.results.record import LadderResult

# Variables naming a compile cache folder that a framework creates at import (torch's
# inductor does so when dynamo is first imported, with a traceback if it cannot).
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")


# perfladder's own dependencies (pyproject.toml's, a test keeps them equal), each as its import
# name and its requirement. A python that has the frameworks but not perfladder's install (a GPU
# image run with PYTHONPATH=src) lacks them only when the results are validated and written,
# after the compiles and the first rung: named before any work instead.
RUNTIME_PACKAGES = {"numpy": "numpy>=1.24", "matplotlib": "matplotlib>=3.7", "jsonschema": "jsonschema>=4"}


class CLIError(UserError):
    pass


def check_packages() -> None:
    """Refuse in one line when a package perfladder needs to write its results is missing."""
    missing = [name for name in RUNTIME_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        reqs = " ".join(repr(RUNTIME_PACKAGES[n]) for n in missing)
        raise CLIError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed in "
                       f"this python ({sys.executable}), and perfladder needs "
                       f"{'it' if len(missing) == 1 else 'them'} to write its results: "
                       f"pip install {reqs} (or install perfladder itself: pip install -e .)")


def parse_rungs(text: str | None, valid: list[str]) -> list[str] | None:
    """``'R0,R1'`` -> ``['R0', 'R1']``; unknown names are an error listing the valid ones."""
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise CLIError(f"--rungs {text!r} names no rung; valid choices: {', '.join(valid)}")
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise CLIError(f"unknown rung(s) {', '.join(map(repr, unknown))}; valid choices: {', '.join(valid)}")
    return names


def check_environment() -> None:
    """What a run needs from the machine, named before any work: the packaged corpus, and a
    compile cache folder that a variable points at (one that exists but cannot be written is
    the lab's to turn off for the run: ``perfladder.compile_cache``)."""
    check_packages()
    from perfladder.data import CorpusError, read_corpus
    try:
        read_corpus()
    except CorpusError as e:
        raise CLIError(f"{e} (the perfladder installation is damaged: reinstall it)") from None
    for var in CACHE_VARIABLES:
        value = os.environ.get(var)
        if not value:
            continue
        folder = user_path(value, f"${var}")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CLIError(f"${var}={value!r} cannot be used as a cache folder ({e.strerror or e}); "
                           "point it at a writable folder or unset it") from None


def read_resume(value, framework: str, config_name: str) -> tuple[Path, LadderResult]:
    """The ``--resume`` file, refused in one line unless it is a ladder of this framework and config."""
    path = user_path(value, "--resume")
    earlier = LadderResult.read(path)
    there = (earlier.framework, earlier.config.get("name"))
    if there != (framework, config_name):
        raise CLIError(f"--resume {str(value)!r} is a {there[0]} {there[1]!r} ladder; this run is "
                       f"{framework} {config_name!r}: give a results file of the same framework and "
                       "config, or drop --resume")
    return path, earlier


def memory_cap(value) -> float | None:
    """``--memory-cap-gib`` (else ``$PERFLADDER_MEMORY_CAP_GIB``), checked, and put in the
    environment before the framework is imported: its lab, JAX's allocator settings and the
    processes a run starts all read it there (``perfladder.ladder.fit.memory_cap_gib``)."""
    from perfladder.ladder.fit import MEMORY_CAP_VARIABLE, check_cap_gib, memory_cap_gib
    try:
        if value is None:
            return memory_cap_gib()
        cap = check_cap_gib(value, "--memory-cap-gib")
    except ValueError as e:
        raise CLIError(str(e)) from None
    os.environ[MEMORY_CAP_VARIABLE] = f"{cap:g}"
    return cap
