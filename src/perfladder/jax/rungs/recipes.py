"""What a JAX device of R5 runs, read from the rung declarations: the per-device recipe of each
form, and the multi-process CLI that resolves it.

    recipe_for(config, 'fast')                       # the recipe the declarations walk to
    measure_mesh(2, config, 'fast', recipe_for(config, 'fast'))
    launch_local(2, config, 'fast', recipe_for(config, 'fast', on_gpu=False))   # GPUs: the children's

The parallel machinery below (``perfladder.jax.parallel``) runs the recipe it is handed; which
recipe a form means is the rungs' to say, so it is resolved here, above it.
``python -m perfladder.jax.parallel.launch`` (one process of several) runs ``main``.
"""
from __future__ import annotations

from perfladder.config import LadderConfig, get_config
from perfladder.jax.device import has_gpu
from perfladder.jax.lab import JaxLab
from perfladder.jax.parallel import launch
from perfladder.jax.recipe import Recipe
from perfladder.jax.rungs import RUNGS
from perfladder.ladder.declared import declared_fastest, recipe_of
from perfladder.multigpu.measurement import recipe_of_form
from perfladder.results.record import LadderResult


def seed_recipe(config: LadderConfig) -> Recipe:
    """The seed's R5 per device: the recipe of the rung R5 builds on (R1: fp32, nnx.jit, the
    seed batch), read from the declarations."""
    return recipe_of(RUNGS, RUNGS["R5"].builds_on, Recipe.seed(config), config)


def fast_recipe(config: LadderConfig, ladder: LadderResult | None = None, *,
                on_gpu: bool | None = None) -> Recipe:
    """The fast form per device: the configuration ``ladder`` (a JAX ``LadderResult``) ended on
    (``LadderResult.fastest``); without one, the one the rung declarations walk to on a device
    with (``on_gpu``; default: this process's) or without a GPU (``declared_fastest``)."""
    if ladder is not None:
        if ladder.framework != "jax":
            raise ValueError(f"ladder is a {ladder.framework!r} result; the fast form of a JAX "
                             "process comes from a 'jax' one")
        return Recipe.from_dict(ladder.fastest_rung().recipe)
    return declared_fastest(RUNGS, Recipe.seed(config), JaxLab.seed_top, config,
                            has_gpu() if on_gpu is None else on_gpu)


def recipe_for(config: LadderConfig, form: str, recipe=None, *, on_gpu: bool | None = None) -> Recipe:
    """The per-device recipe of ``form``: the seed's (``seed_recipe``, fixed), or ``recipe`` (a
    ``Recipe`` or its ``to_dict()``; default ``fast_recipe``). A process that leaves the GPUs to
    its children passes ``on_gpu`` (asking jax would start its GPU backend here)."""
    return recipe_of_form(form, recipe, Recipe.from_dict, lambda: seed_recipe(config),
                          lambda: fast_recipe(config, on_gpu=on_gpu))


# -- the multi-process CLI --------------------------------------------------------------------------
def spec_from_args(args) -> dict:
    """The spec a process started by hand (``python -m perfladder.jax.parallel.launch --config ...``)
    runs: the fast form is ``fast_recipe`` (of ``--ladder``'s results when given) at ``--batch``."""
    config = get_config(args.config)
    recipe = None
    if args.form == "fast":
        recipe = fast_recipe(config, LadderResult.read(args.ladder) if args.ladder else None)
        recipe = recipe if args.batch is None else recipe.replace(batch_size=args.batch)
    return launch.make_spec(config, args.form, recipe_for(config, args.form, recipe), fsdp=args.fsdp,
                            warmup=args.warmup, timed=args.timed, windows=args.windows)


def main(argv=None) -> int:
    """The multi-process CLI (``launch.main``), a process started by hand resolving its spec here."""
    return launch.main(argv, spec_from_args=spec_from_args)
