"""What a PyTorch rank of R5 runs, read from the rung declarations: the per-rank recipe of each
form, and the rank CLI that resolves it.

    recipe_for(config, 'fast')           # the recipe the declarations walk to, as a rank runs it
    data_parallel_tokens(2, config, 'fast', recipe_for(config, 'fast'))

The parallel machinery below (``perfladder.torch.parallel``) runs the recipe it is handed; which
recipe a form means is the rungs' to say, so it is resolved here, above it.
``python -m perfladder.torch.parallel.launch`` (a rank under torchrun) runs ``main``.
"""
from __future__ import annotations

from perfladder.config import LadderConfig, get_config
from perfladder.ladder.declared import declared_fastest
from perfladder.ladder.engine import registry
from perfladder.multigpu.measurement import recipe_of_form
from perfladder.results.record import LadderResult
from perfladder.torch.lab import TorchLab
from perfladder.torch.parallel import launch
from perfladder.torch.recipe import Recipe
from perfladder.torch.rungs.beyond import BEYOND
from perfladder.torch.rungs.seed import SEED


def seed_recipe(config: LadderConfig) -> Recipe:
    """The seed form per rank: R0's recipe (R5 builds on R0, which changes nothing), fixed."""
    return Recipe.seed(config)


def fast_recipe(config: LadderConfig, ladder: LadderResult | None = None, *,
                on_gpu: bool | None = None) -> Recipe:
    """The fast form per rank: the configuration ``ladder`` (a PyTorch ``LadderResult``) ended on
    (``LadderResult.fastest``); without one, the one the rung declarations walk to on a device
    with (``on_gpu``; default: this process's) or without a GPU
    (``perfladder.ladder.declared.declared_fastest``). As a rank runs it (``launch.rank_recipe``)."""
    if ladder is not None:
        if ladder.framework != "torch":
            raise ValueError(f"ladder is a {ladder.framework!r} result; the fast form of a PyTorch "
                             "rank comes from a 'torch' one")
        recipe = Recipe.from_dict(ladder.fastest_rung().recipe)
    else:
        if on_gpu is None:
            import torch
            on_gpu = torch.cuda.is_available()
        recipe = declared_fastest(registry([*SEED, *BEYOND]), Recipe.seed(config), TorchLab.seed_top,
                                  config, on_gpu)
    return launch.rank_recipe(recipe)[0]


def recipe_for(config: LadderConfig, form: str, recipe=None, *, on_gpu: bool | None = None) -> Recipe:
    """The per-rank recipe of ``form``: the seed's (``seed_recipe``, fixed), or ``recipe`` (a
    ``Recipe`` or its ``to_dict()``; default ``fast_recipe``)."""
    return recipe_of_form(form, recipe, Recipe.from_dict, lambda: seed_recipe(config),
                          lambda: fast_recipe(config, on_gpu=on_gpu))


# -- the rank CLI -----------------------------------------------------------------------------------
FAST_FLAGS = ("ladder", "batch", "optimizer", "embed", "mode", "no_compile")


def spec_from_args(args) -> dict:
    """The spec a rank started by hand (``torchrun ... -m perfladder.torch.parallel.launch --config ...``)
    runs: the fast form is ``fast_recipe`` (of ``--ladder``'s results when given) with the
    switches the command line sets."""
    config = get_config(args.config)
    if args.form == "fast":
        recipe = fast_recipe(config, LadderResult.read(args.ladder) if args.ladder else None)
        recipe = recipe.replace(**{k: v for k, v in (("batch_size", args.batch), ("optimizer", args.optimizer),
                                                     ("embed", args.embed)) if v is not None})
        if args.mode is not None:
            recipe = recipe.with_mode(args.mode)
        if args.no_compile:
            recipe = recipe.replace(compiled=False, cudagraphs=False, autotune=False)
    else:
        given = [f for f in FAST_FLAGS if getattr(args, f) not in (None, False)]
        if given:
            raise SystemExit(f"--{given[0].replace('_', '-')} applies to --form fast; the seed form "
                             "runs the seed's recipe at the config's batch")
        recipe = None
    return launch.make_spec(config, args.form, recipe_for(config, args.form, recipe),
                            parallel=args.parallel, backend=args.backend or launch.default_backend(),
                            warmup=args.warmup, timed=args.timed, windows=args.windows)


def main(argv=None) -> int:
    """The rank CLI (``launch.main``), a rank started by hand resolving its spec here."""
    return launch.main(argv, spec_from_args=spec_from_args)
