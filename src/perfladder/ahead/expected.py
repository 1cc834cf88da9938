"""The compiled steps a ladder is expected to build, guessed before it runs, for each
framework's side of the compile-ahead (``perfladder.ahead.torch``, ``perfladder.ahead.jax``) to
compile ahead: ``expected_recipes``, with each step's expected compile time (``expected_costs``) and
device memory (``expected_needs``); ``committed_runs`` reads what the guess is made from.

Which beyond rungs are kept is known only as the ladder runs. The guess is the recipes of the
committed reference run of the same config, else the declared chain with every beyond rung
kept; where other committed runs went the other way on a beyond rung in at least
``FLIP_SHARE`` of them, the later rungs' steps are added as they would be had it gone that
way (``undecided``). No framework is imported here: recipes come from the lab, and which of
them compile is the framework's call (``compiles``).
"""
from __future__ import annotations

import json

COLD = ("R1",)              # rungs whose first call the pages read as the price of compiling
HELPER_BYTES = 40 * 2**30   # device memory a recipe may need when no run measured it
FLIP_SHARE = 1 / 3          # how often a rung must have gone the other way to compile both ways
CONTEXT_BYTES = 2 * 2**30   # a helper's CUDA context and library workspaces, beside the step


def _key(recipe, optimizer: bool = True) -> str:
    """What decides the compiled graphs of a recipe's step: everything but a non-compiled
    optimizer's kind (fused or foreach AdamW runs outside the compiled model); with
    ``optimizer=False``, the model's graphs only (a compiled AdamW's graph is the same for
    every recipe: one compile of it serves them all)."""
    d = recipe.to_dict()
    if "optimizer" in d and (d["optimizer"] != "compiled" or not optimizer):   # torch's recipes
        d["optimizer"] = "default"
    return json.dumps(d, sort_keys=True)


def _same_ladder(lab, result) -> bool:
    return (result is not None and result.framework == lab.framework
            and result.config.get("name") == lab.config.name)


def _walk(lab, rungs: dict, names, kept: dict | None = None) -> dict:
    """``{name: Recipe}`` down the declared chain: each beyond rung builds on the last one
    kept (``kept``: ``{name: bool}``; a rung not in it is taken as kept)."""
    from perfladder.ladder.engine import Chain
    chain, out = Chain(rungs, lab), {}
    for n in names:
        rung = rungs[n]
        try:
            base = chain.base(rung)[1]
            recipe = base if rung.change is None else rung.change(base, lab.config)
        except Exception:                           # a change that needs what only a run knows
            continue
        chain.recipes[n] = out[n] = recipe
        if rung.stage == "beyond" and not rung.alternative and (kept or {}).get(n, True):
            chain.fastest = (n, recipe)
    return out


def newer_rungs(lab, reference, history) -> dict:
    """``{name: kept}`` for the beyond rungs that ``reference`` does not list (added to the
    ladder after it ran) but other ``history`` runs of the same ladder measured: kept where at
    least half of those runs kept it. A rung no run measured is walked as kept."""
    listed = {r.name for r in reference.rungs}
    votes: dict[str, list] = {}
    for run in history:
        if _same_ladder(lab, run):
            for r in run.rungs:
                if r.name not in listed and r.stage == "beyond" and r.measured:
                    votes.setdefault(r.name, []).append(bool(r.kept))
    return {n: 2 * sum(v) >= len(v) for n, v in votes.items()}


def undecided(lab, reference, history) -> list[str]:
    """Beyond rungs that went the other way from ``reference`` in at least ``FLIP_SHARE`` of
    the ``history`` runs (committed ``LadderResult``s of this framework and config that
    measured every beyond rung it did): a measurement within reach of the noise, whose outcome
    decides what every later rung builds on. Below that share, compiling the other way ahead
    costs the helpers more than the misses it would save."""
    ours = {r.name: bool(r.kept) for r in reference.rungs if r.stage == "beyond" and r.measured}
    votes: dict[str, list] = {}
    for run in history:
        theirs = {r.name: bool(r.kept) for r in run.rungs if r.stage == "beyond" and r.measured}
        # only runs of a ladder like the reference's (every beyond rung it measured): an older
        # ladder's rungs were other techniques under the same names
        if (_same_ladder(lab, run) and run.created != reference.created
                and set(ours) <= set(theirs)):
            for n in ours:
                votes.setdefault(n, []).append(theirs[n] != ours[n])
    return [n for n, v in votes.items() if sum(v) >= FLIP_SHARE * len(v)]


def committed_runs(lab) -> tuple:
    """``(reference, history)``: the committed reference run of ``lab``'s framework (None when
    there is no repository, or no readable one) and every committed run of it that this
    version can read (an older schema's has no say)."""
    from perfladder.results.committed import read_run, reference_run
    file = f"{lab.framework}.json"
    try:
        folder = reference_run(framework=lab.framework)
        reference = read_run(folder / file)
    except Exception:                     # no repository, or no readable reference
        return None, []
    history = []
    for path in sorted(folder.parent.glob(f"*/{file}")):
        try:
            history.append(read_run(path))
        except Exception:                 # a file of an older schema: it has no say
            continue
    return reference, history


def guess(lab, rungs: dict, names, compiles) -> tuple[dict, object]:
    """``(recipes, reference)``: the steps ``expected_recipes`` guesses from the committed runs
    (``committed_runs``), the longest expected compile first (``expected_costs``), and the
    reference run they came from (None without one)."""
    reference, history = committed_runs(lab)
    recipes = expected_recipes(lab, rungs, names, reference, history, compiles=compiles)
    costs = expected_costs(reference)
    return dict(sorted(recipes.items(), key=lambda kv: -costs.get(rung_of(kv[0]), 0.0))), reference


def expected_recipes(lab, rungs: dict, names, reference=None, history=(),
                     compiles=lambda recipe: True) -> dict:
    """``{name: Recipe}``: the compiled steps the ladder is expected to build, one per
    distinct set of graphs, without ``COLD`` or multi-GPU rungs, nor any recipe
    ``compiles(recipe)`` says is not compiled ahead (the framework's call). ``reference``:
    a committed ``LadderResult`` of the same framework and config: the chain of ``names``
    walked over what it kept (its measured recipes where ``names`` are its rungs; the rungs it
    does not list, added to the ladder since, as ``newer_rungs`` says); without one, the
    declared chain with every beyond rung kept. ``history``: other committed runs of it; for
    each rung ``undecided`` names, the later rungs' steps as they would be had it gone the other
    way are added, under names like ``'B10 if B9 is not kept'`` (only those whose model graphs
    are new)."""
    names = [n for n in names if n in rungs and rungs[n].stage != "multi-gpu" and n not in COLD]
    guess = {}
    if _same_ladder(lab, reference):
        kept = {}
        for r in reference.rungs:
            if r.name in names and r.measured and r.recipe:
                kept[r.name] = bool(r.kept)
                try:
                    guess[r.name] = lab.recipe_from_dict(r.recipe)
                except (TypeError, ValueError):     # a recipe field this version lacks
                    continue
        kept.update(newer_rungs(lab, reference, history))
        # the chain walked over what the reference kept gives its own recipes where this run's
        # rungs are its rungs, and what this run builds where it leaves one out or adds one; a
        # change the walk cannot make (it needs what only a run knows) keeps the measured recipe
        guess.update(_walk(lab, rungs, names, kept))
        for v in undecided(lab, reference, history):
            if v not in kept:
                continue
            other = {**kept, v: not kept[v]}
            label = f"is {'kept' if other[v] else 'not kept'}"
            for n, recipe in _walk(lab, rungs, names, other).items():
                if names.index(n) > names.index(v):
                    guess[f"{n} if {v} {label}"] = recipe
    else:
        guess = _walk(lab, rungs, names)
    out, seen, graphs = {}, set(), set()
    for n, recipe in guess.items():
        if not compiles(recipe) or _key(recipe) in seen:
            continue
        if " if " in n and _key(recipe, optimizer=False) in graphs:
            continue                                # an alternative the guess compiles already
        seen.add(_key(recipe))
        graphs.add(_key(recipe, optimizer=False))
        out[n] = recipe
    return out


def rung_of(name: str) -> str:
    """``'B10 if B9 is not kept'`` -> ``'B10'``."""
    return name.split(" if ", 1)[0]


def expected_costs(reference) -> dict:
    """``{rung name: seconds}`` each compiled rung of ``reference`` spent on its gates (where a
    compiled step compiles) and first call: which steps to start first."""
    if reference is None:
        return {}
    return {r.name: (r.details.get("seconds") or {}).get("gates", 0.0)
            + (r.compile.first_call_s if r.compile else 0.0) for r in reference.rungs}


def expected_needs(reference, recipes: dict) -> dict:
    """``{name: bytes}`` per expected step of ``recipes`` (``expected_recipes``): its rung's
    measured peak in ``reference`` plus ``CONTEXT_BYTES``, at least 0.8 ``HELPER_BYTES`` per
    2048 rows (a CUDA-graph step's peak leaves out its graphs' pool), scaled to the step's own
    batch (an alternative step may run another batch than its rung did)."""
    if reference is None:
        return {}
    per_row = {r.name: max(r.memory.bytes + CONTEXT_BYTES, 0.8 * HELPER_BYTES * r.batch_size / 2048)
               / r.batch_size
               for r in reference.rungs if r.memory is not None and r.memory.bytes and r.batch_size}
    return {k: per_row[rung_of(k)] * recipe.batch_size for k, recipe in recipes.items()
            if rung_of(k) in per_row}


def summary(report: dict, unit: str, where: str, then: str) -> str:
    """One line for the result's notes and the page: what ``report`` (a framework's
    ``compile_ahead``) compiled, of how many expected ``unit``, in how many ``where``, and what
    the rungs do ``then``; what was already cached, what failed."""
    if not report["steps"]:
        return "compiled ahead: nothing (no compiled step expected)"
    n = report["workers"]
    if n == 1:                                       # 'helper processes' -> 'helper process'
        where = where[:-2] if where.endswith("sses") else where[:-1]
    line = (f"compiled ahead: {len(report['compiled'])} of {report['steps']} expected {unit} in "
            f"{n} {where}, {report['seconds']:.0f} s before the first rung ({then})")
    if report.get("already_cached"):
        k = report["already_cached"]
        line += f"; {k} of them {'was' if k == 1 else 'were'} in the cache already"
    if report["failed"]:
        first = next(iter(report["failed"].items()))
        line += f"; not compiled ahead: {', '.join(report['failed'])} ({first[0]}: {first[1][:200]})"
    return line
