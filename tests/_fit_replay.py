"""Replaying a committed ladder through a lab's fit check (both frameworks' lab tests)."""
from __future__ import annotations

from perfladder.ladder.rung import DoesNotFit, Given


def replay(lab, run, cap_gib, rungs, recipe_type) -> dict:
    """Each rung of ``run`` admitted (or not) by ``lab.admit`` as if the ladder had measured what
    ran before it, on a card of ``cap_gib``: ``{name: DoesNotFit or None}``. ``rungs``: the
    framework's declarations; ``recipe_type``: its ``Recipe``."""
    lab.memory_cap_gib, out = cap_gib, {}
    try:
        for i, r in enumerate(run.rungs):
            if not r.recipe or r.stage == "multi-gpu":
                continue
            lab.result.rungs = run.rungs[:i]
            rung = rungs[r.name]
            try:
                lab.admit(rung, Given(rung=rung, recipe=recipe_type.from_dict(r.recipe), base_name=r.builds_on))
                out[r.name] = None
            except DoesNotFit as e:
                out[r.name] = e
    finally:
        lab.memory_cap_gib = None
    return out
