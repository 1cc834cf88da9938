"""Running a rung again: the one rule a notebook cell run twice and ``--resume`` both follow
(framework-free; the engine, ``perfladder.ladder.engine``, applies it).

* ``--resume`` keeps an entry that is final (``RungResult.final``: measured, or a property of
  the run or the card) and not built on an earlier version of another rung; it runs every
  other entry again and says why in one line (``again``).
* A rung run again replaces its entry, in its place in the ladder (``put``); the new entry
  keeps the rate and outcome of the one it replaced (``RungResult.replaces``).
* The entries that built on the earlier version -- its rung's recorded ``builds_on``,
  directly or down the chain, and, where the rung is a beyond rung that was or now is kept,
  every later rung built on the chain's top (built on its absence or its earlier version) --
  are marked as built on an earlier version of it (``RungResult.built_on_earlier``) until
  they are run again; a rung run on a marked base inherits its base's marks. No ratio or
  verdict is read across versions (``LadderResult.finalize``).
* The chain's top is read from the entries: the last kept beyond rung (before a rung's own
  entry, for a rung run again), else the lab's ``seed_top`` (``top``).
"""
from __future__ import annotations

import contextlib
import signal
import threading

from perfladder.results.record import LadderResult, RungResult


def entry(result: LadderResult, name: str) -> RungResult | None:
    return next((r for r in result.rungs if r.name == name), None)


def first_line(text: str | None, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else "no error recorded"
    return line if len(line) <= limit else line[:limit - 3] + "..."


def again(earlier: RungResult | None) -> str | None:
    """What ``--resume`` does with ``earlier`` (the entry of a rung it was asked to run): None
    keeps it; '' runs a rung with no entry yet; otherwise the one line that says why it runs it
    again."""
    if earlier is None:
        return ""
    if not earlier.final:
        return f"retrying {earlier.name}, which failed with {first_line(earlier.error)}"
    if earlier.built_on_earlier:
        return (f"re-running {earlier.name}, which was built on an earlier version of "
                f"{', '.join(earlier.built_on_earlier)}")
    return None


def on_top(rungs: dict, r: RungResult) -> bool:
    """Whether entry ``r`` was built on the chain's top (a beyond rung, or a multi-GPU rung
    that names no seed rung), as its declaration says."""
    decl = rungs.get(r.name)
    if decl is None:
        return r.stage == "beyond"
    return decl.stage != "seed" and decl.builds_on is None


def top(result: LadderResult, usable, seed_top: str, before: str | None = None) -> str:
    """The configuration a rung on the chain's top builds on: the last kept beyond entry whose
    recipe is ``usable`` (before ``before``'s entry, when it has one), else ``seed_top``."""
    rungs = result.rungs
    if before is not None and entry(result, before) is not None:
        rungs = rungs[:[r.name for r in rungs].index(before)]
    kept = [r.name for r in rungs if r.stage == "beyond" and r.kept and usable(r.name)]
    return kept[-1] if kept else seed_top


def _reaches(result: LadderResult, rungs: dict, start: str | None, targets: set) -> bool:
    """Whether the chain below ``start`` passes through one of ``targets``: each rung's recorded
    base, or for a rung with no entry its declared one (its declared recipe was built on it)."""
    seen: set = set()
    while start is not None and start not in seen:
        if start in targets:
            return True
        seen.add(start)
        e = entry(result, start)
        start = e.builds_on if e is not None else getattr(rungs.get(start), "builds_on", None)
    return False


def dependents(result: LadderResult, rungs: dict, name: str, top_moved: bool) -> list[str]:
    """The entries that built on rung ``name``'s entry: by their recorded ``builds_on``,
    directly or down the chain; and, when ``top_moved`` (``name`` is a beyond rung that was
    or now is kept), every later entry built on the chain's top, and what built on those."""
    names = [r.name for r in result.rungs]
    pos = names.index(name)
    top = {r.name for r in result.rungs[pos + 1:] if top_moved and on_top(rungs, r)}
    out = top | {r.name for r in result.rungs
                 if r.name != name and _reaches(result, rungs, r.builds_on, top | {name})}
    return [n for n in names if n in out]


def put(result: LadderResult, res: RungResult, rungs: dict, base: str | None) -> RungResult | None:
    """Record ``res``: a new entry at the end, or in place of its rung's earlier entry (the
    one returned), whose rate and outcome it keeps in ``replaces``. It inherits the marks of
    the entry it built on (``base``)."""
    built_on = entry(result, base) if base is not None else None
    res.built_on_earlier = list(built_on.built_on_earlier) if built_on is not None else []
    earlier = entry(result, res.name)
    if earlier is None:
        result.add(res)
        return None
    res.replaces = {"tokens_per_s": earlier.tokens_per_s, "outcome": earlier.result_kind,
                    "error": earlier.error}
    result.rungs[result.rungs.index(earlier)] = res
    result.finalize()
    return earlier


def mark(result: LadderResult, rungs: dict, res: RungResult, earlier: RungResult) -> list[str]:
    """Mark every entry that built on ``earlier`` (now replaced by ``res``) as built on an
    earlier version of it; the names marked. An entry not applicable to this machine at all
    is not: what it built on changes nothing about it."""
    moved = res.stage == "beyond" and bool(earlier.kept or res.kept)
    marked = [n for n in dependents(result, rungs, res.name, moved)
              if result.rung(n).result_kind != "not_applicable"]
    for r in result.rungs:
        if r.name in marked and res.name not in r.built_on_earlier:
            r.built_on_earlier.append(res.name)
    result.finalize()
    return marked


_NO_CODE = object()


def code_of(lab):
    """A copy of the lab's technique code (``use`` changes it), to put back after an interrupt."""
    code = getattr(lab, "code", _NO_CODE)
    return dict(code) if isinstance(code, dict) else code


def restore_code(lab, code) -> None:
    if code is _NO_CODE:
        lab.__dict__.pop("code", None)
    else:
        lab.code = code


@contextlib.contextmanager
def uninterrupted():
    """Hold a Ctrl-C (SIGINT) back until the block ends, so that a measured rung is recorded
    whole or not at all; main thread only (elsewhere no handler can be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):          # ignored, default or set outside Python: leave it
        yield
        return
    held: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            previous(*held[0])
