"""The recipe changes that read the same on both sides: each framework's ``rungs/changes.py``
takes these as they are, beside its own (``change(recipe, config) -> recipe``; both recipes
hold ``batch_size``)."""
from __future__ import annotations


def big_batch(recipe, config):
    """R3c and R3: the chapter's big batch, more sequences per step."""
    return recipe.replace(batch_size=config.big_batch)


def batch_x2(recipe, config):
    """B5: twice the big batch."""
    return recipe.replace(batch_size=2 * config.big_batch)


def batch_x4(recipe, config):
    """B6: four times the big batch."""
    return recipe.replace(batch_size=4 * config.big_batch)
