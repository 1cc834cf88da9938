"""What a ladder's rung declarations imply before anything runs (framework-free).

``recipe_of``: the recipe a rung runs by its declaration alone (its base's recipe with its
``change`` applied, down to the seed recipe). ``declared_fastest``: the configuration a ladder
on a device walks to when every technique it adds is kept, as a smoke ladder keeps them
(``perfladder.ladder.engine.keeps``): the recipe of ``top``, then every beyond rung's change in
declaration order, except a choice between implementations (``alternative``), a rung run only
when named (``optional``), and a GPU-only technique off a GPU. A multi-GPU rank that no ladder
handed a configuration runs this one.
"""
from __future__ import annotations

from typing import Any

from perfladder.ladder.rung import Rung


def recipe_of(rungs: dict[str, Rung], name: str, seed: Any, config) -> Any:
    """The recipe rung ``name`` runs by its declaration (``seed``: the recipe of a rung with no base)."""
    if name not in rungs:
        raise ValueError(f"unknown rung {name!r}; valid choices: {', '.join(rungs)}")
    r = rungs[name]
    base = seed if r.builds_on is None else recipe_of(rungs, r.builds_on, seed, config)
    return base if r.change is None else r.change(base, config)


def declared_fastest(rungs: dict[str, Rung], seed: Any, top: str, config, on_gpu: bool) -> Any:
    """The configuration of a ladder that kept every technique it added (see the module docstring)."""
    recipe = recipe_of(rungs, top, seed, config)
    for r in rungs.values():
        skipped = r.alternative or r.optional or (r.needs_gpu and not on_gpu)
        if r.stage == "beyond" and r.change is not None and not skipped:
            recipe = r.change(recipe, config)
    return recipe
