"""R5 in JAX: one replica, the single-device baseline, and data parallelism on a mesh.

A device runs the ``perfladder.jax.recipe.Recipe`` it is handed (``to_dict()`` across a process
boundary). Which recipe a form means -- the seed form the recipe of the rung R5 builds on, the
fast form the configuration a ladder ended on, or without a ladder the one the rung declarations
walk to -- is resolved above this layer, by the rungs (``perfladder.jax.rungs.recipes.recipe_for``).

    r = recipe_for(config, 'fast')                            # perfladder.jax.rungs.recipes
    b = measure_baseline(config, 'fast', r)                   # one device, settled (or flagged)
    measure_mesh(2, config, 'fast', r, baseline=b)            # predict, print, then measure
    measure_mesh(2, config, 'fast', r, fsdp=True, baseline=b) # the FSDP layout beside it

One process drives every local device (``perfladder.jax.parallel.layout``'s mesh, replicated or
FSDP-sharded state, batch sharded on ``'data'``); ``perfladder.jax.parallel.launch`` runs the
same step with one process per GPU or host. Weak scaling: each device gets the per-device
batch, so the global batch is ``k`` times it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from perfladder.config import LadderConfig, expected_num_params
from perfladder.data import TimeMachine
from perfladder.handed_on import handed_on
from perfladder.jax.device import device_name, has_gpu
from perfladder.jax.model import GPT
from perfladder.jax.parallel.layout import (
    allreduce_bus_bw,
    batch_sharding,
    make_data_mesh,
    peak_mem_bytes,
    place_state,
)
from perfladder.jax.recipe import Recipe
from perfladder.jax.step import TrainStep, make_optimizer
from perfladder.jax.stream import batches
from perfladder.jax.timer import throughput
from perfladder.measure.evidence import Timing
from perfladder.multigpu import costmodel, measurement
from perfladder.multigpu.measurement import (
    Baseline,
    DataParallelMeasurement,
    not_measured,
    record,
    settle_baseline,
)

PEAK_NOTE = ("peak_mem_bytes_per_gpu is each device's peak_bytes_in_use over this process's "
             "life so far (JAX cannot reset it): an upper bound for this measurement")


# -- the recipe: what one device runs --------------------------------------------------------------
# where a form's recipe is resolved, above this layer (named in the refusal of none)
RESOLVER = "perfladder.jax.rungs.recipes.recipe_for"


def given_recipe(form: str, recipe) -> Recipe:
    """The per-device recipe a measurement of ``form`` runs: ``recipe`` (a ``Recipe`` or its
    ``to_dict()``) as given. Which recipe a form means is read from the rung declarations, above
    this layer: resolve it there."""
    return measurement.given_recipe(form, recipe, Recipe.from_dict, RESOLVER)


# -- one replica: model, optimizer, step ------------------------------------------------------------
class Replica:
    """A fresh model of ``recipe`` (``nnx.Rngs(config.seed)``: the same weights everywhere), its
    AdamW, and the recipe's step (``TrainStep.of``).

    Lay the state out (``place``) *before* asking for ``step``: the split/merge step takes
    the state it will donate when it is built.
    """

    def __init__(self, config: LadderConfig, recipe: Recipe, vocab_size: int):
        self.recipe, self._made = recipe, (config, vocab_size)
        self.model = self.fresh_model()
        self.optimizer = make_optimizer(self.model, config.lr)
        self._step = None

    def fresh_model(self) -> GPT:
        """A new model of this replica's recipe at the same initial weights, on the default
        device (laid out nowhere): the all-reduce gate's single-device reference."""
        config, vocab_size = self._made
        return GPT(config.gpt(vocab_size=vocab_size), rngs=nnx.Rngs(config.seed),
                   dtype=jnp.dtype(self.recipe.dtype), param_dtype=jnp.float32,
                   **self.recipe.model_kw())

    @property
    def step(self) -> TrainStep:
        if self._step is None:
            self._step = TrainStep.of(self.model, self.optimizer, self.recipe)
        return self._step


def num_params(config: LadderConfig, vocab_size: int) -> int:
    return expected_num_params(config.gpt(vocab_size=vocab_size))


def corpus(config: LadderConfig) -> TimeMachine:
    return TimeMachine(config.batch_size, config.num_steps, num_train=config.num_train,
                       num_val=config.num_val)


def fixed_global_batches(data: TimeMachine, global_batch: int, steps: int):
    """``steps`` fixed ``(X, Y)`` numpy batches of ``global_batch`` consecutive training windows:
    the same on every process, so a multi-process run can be checked against one device."""
    X, Y = data.train_arrays()
    if steps * global_batch > len(X):
        raise ValueError(f"{steps} steps x global batch {global_batch} exceed the "
                         f"{len(X)} training windows")
    return [(X[s * global_batch:(s + 1) * global_batch], Y[s * global_batch:(s + 1) * global_batch])
            for s in range(steps)]


# -- measurements -------------------------------------------------------------------------------------
def measure_baseline(config: LadderConfig, form: str, recipe, *,
                     warmup: int | None = None, timed: int | None = None,
                     windows: int | None = None) -> Baseline:
    """The single-device rate of ``form`` running ``recipe`` (``given_recipe``) on
    ``jax.devices()[0]``, settled (re-measured once if its windows did not settle;
    ``settled=False`` if they did not twice)."""
    recipe = given_recipe(form, recipe)
    data = corpus(config)
    rep = Replica(config, recipe, len(data.vocab))
    stream = batches(data, recipe.batch_size, seed=config.seed + 100)
    base = settle_baseline(lambda: throughput(rep.step, stream, **_timing(config, warmup, timed, windows)),
                           config.target_spread)
    base.peak_mem_bytes = peak_mem_bytes(jax.devices()[:1])[0]
    return base


def measure_mesh(k: int, config: LadderConfig, form: str, recipe, *,
                 fsdp: bool = False, link=None, baseline: Baseline | None = None,
                 warmup: int | None = None, timed: int | None = None,
                 windows: int | None = None) -> DataParallelMeasurement:
    """``k``-device data parallelism of ``form`` running ``recipe`` (``given_recipe``) in this
    process: predict (printed), then measure.

    ``baseline``: the single-device ``Baseline`` of the same form (measured here if None);
    ``link``: a ``perfladder.multigpu.costmodel.LINKS`` name (default: this machine's,
    ``costmodel.machine_link``). ``fsdp``: shard parameters and optimizer state too.
    """
    recipe = given_recipe(form, recipe)
    mechanism = "mesh-fsdp" if fsdp else "mesh"
    B, T = recipe.batch_size, config.num_steps
    mesh = make_data_mesh(k)                                      # k > devices -> ValueError
    data = corpus(config)
    n = num_params(config, len(data.vocab))
    if baseline is None:
        baseline = measure_baseline(config, form, recipe, warmup=warmup, timed=timed, windows=windows)
    link = link or costmodel.machine_link(jax.device_count() if has_gpu() else 0)
    pred = costmodel.predict(k, B, T, baseline.tokens_per_s, n, link)
    costmodel.announce([pred], label=f"R5 jax {mechanism} {form}")          # before the launch
    rep = Replica(config, recipe, len(data.vocab))
    place_state(mesh, rep.model, rep.optimizer, fsdp=fsdp)
    stream = batches(data, k * B, seed=config.seed + 200, sharding=batch_sharding(mesh))
    reduced = []
    if k > 1:
        from perfladder.jax.checks import distinct_devices
        from perfladder.jax.parallel.allreduce import allreduce_at_start
        distinct_devices(next(stream)[0])        # every device its own rows (CountError if not)
        reduced = allreduce_at_start(rep, *next(stream))     # the mean, or AllReduceGateError
    bw = allreduce_bus_bw(mesh, n) if k > 1 else None
    t = throughput(rep.step, stream, **_timing(config, warmup, timed, windows))
    devices = list(mesh.devices.flat)
    notes = [f"one process drives {k} devices; per-device batch {B} (global {k * B}); state "
             f"{'sharded (FSDP)' if fsdp else 'replicated'}, batch sharded on 'data'", PEAK_NOTE]
    if reduced:
        notes.append(f"all-reduce gate passed on {len(reduced)} devices: each one's gradient the "
                     "global batch's (scale off by at most "
                     f"{max(g['values']['scale'] for g in reduced):.2g})")
    if not has_gpu():
        notes.append("CPU devices: the numbers exercise the code path, not an interconnect")
    return record(framework="jax", mechanism=mechanism, form=form, k=k, per_rank_batch=B,
                  seq_len=T, timing=Timing.of(t), baseline=baseline, prediction=pred,
                  bus_bw_measured=bw, peak_mem_bytes_per_gpu=peak_mem_bytes(devices),
                  recipe=recipe.to_dict(), device=device_name(), notes=notes)


def skipped_mesh(k: int, config: LadderConfig, form: str, reason: str, recipe, fsdp=False):
    """A mesh measurement that did not run (e.g. one device visible), with the reason."""
    recipe = given_recipe(form, recipe)
    return not_measured(status="skipped", reason=reason, framework="jax",
                        mechanism="mesh-fsdp" if fsdp else "mesh", form=form, k=k,
                        per_rank_batch=recipe.batch_size, seq_len=config.num_steps,
                        recipe=recipe.to_dict())


def _timing(config: LadderConfig, warmup, timed, windows) -> dict:
    return {"warmup": config.warmup if warmup is None else warmup,
            "timed": config.timed if timed is None else timed,
            "windows": config.windows if windows is None else windows,
            "target_spread": config.target_spread}


# -- names whose home is the rungs' layer ---------------------------------------------------------
# They read the rung declarations, which sit above this layer; this module hands them on by name,
# imported at first use (no import of rungs/ here), so code importing them from here keeps working.
RECIPES = "perfladder.jax.rungs.recipes"
MOVED = ("seed_recipe", "fast_recipe", "recipe_for")

__getattr__ = handed_on(__name__, RECIPES, MOVED)
