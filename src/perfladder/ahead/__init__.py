"""Compile-ahead: a ladder's expected compiled programs built before its first rung, so that each
rung's first call loads them from the framework's persistent cache instead of compiling them.
An optional annex: a ladder runs the same without it, only its first calls take longer.

Its one door is ``before_first_rung`` (called by each framework's ``Ladder`` and ``run_ladder``);
what it did goes into the result's own part, ``LadderResult.ahead``, and one line of its notes.
Behind the door, one module per concern:

* ``expected``: which recipes the ladder is expected to reach, guessed from the committed runs
  (framework-free);
* ``torch``: PyTorch's steps built in helper processes into inductor's FX-graph and AOTAutograd
  caches; on by default for the full config on a GPU;
* ``jax``: JAX's steps, gate programs and references compiled in threads into JAX's persistent
  compilation cache; off by default in a notebook (measured slower on the H200: the threads took
  longer than the compiles they saved, ``benchmarks/results/h200-jax-ahead-2026-12-03``), used
  by the book build's stage, where the PyTorch helpers' time hides theirs;
* ``book``: the book build's stage, both frameworks side by side before the notebooks
  (``python -m perfladder.ahead.book run DIR``, from ``scripts/build_book.sh``).

What it saves: a full-config book build on one H200 took 626 s with the stage
(``benchmarks/results/h200-book-stage-2026-12-04``) against 766-810 s without it
(``h200-book-helpers-2026-12-03``, ``h200-book-bothways-2026-12-03``).
"""
from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

AHEAD_DIR_ENV = "PERFLADDER_AHEAD_DIR"   # where a book build's compile-ahead stage left its reports

__all__ = ["AHEAD_DIR_ENV", "before_first_rung", "done_ahead", "side"]


def side(framework: str):
    """The framework's compile-ahead module (``perfladder.ahead.torch`` / ``.jax``), imported
    only when asked for: this module imports no framework."""
    return importlib.import_module(f"perfladder.ahead.{framework}")


def before_first_rung(lab, rungs: dict, names, ahead: bool | None) -> None:
    """A ladder's compile-ahead, before its first rung: the book build's stage (``done_ahead``)
    when it ran for this framework and config, else the framework's own (``ladder_ahead`` of
    ``side(lab.framework)``) when ``ahead`` says so (None: the side's ``by_default(lab)``), else
    nothing (``ahead=False``: nothing at all). Its report goes into the result (``ahead``), one
    line into the notes and on stdout (a minute in which nothing else appears to run)."""
    if ahead is False:
        return
    report = done_ahead(lab)
    here = side(lab.framework)
    if report is None:
        if not (here.by_default(lab) if ahead is None else ahead):
            return
        report = here.ladder_ahead(lab, rungs, names)
    lab.result.ahead = report
    lab.result.notes.append(here.summary(report) + (f"; compiled {report['by']}" if "by" in report else ""))
    print(f"perfladder: {lab.result.notes[-1]}", flush=True)


def done_ahead(lab) -> dict | None:
    """The report of the compile-ahead a book build ran for ``lab``'s framework and config
    before its notebooks (``perfladder.ahead.book``: ``$PERFLADDER_AHEAD_DIR/<framework>.json``),
    with ``by`` saying so; None when there is none (no such build, or the stage did not finish
    this framework: the ladder then compiles as it would have without it)."""
    folder = os.environ.get(AHEAD_DIR_ENV)
    if not folder:
        return None
    try:
        report = json.loads((Path(folder) / f"{lab.framework}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or report.get("config") != lab.config.name:
        return None
    return {**report, "by": "by the book build, before the notebooks, beside the other framework's programs"}
