"""R5 in JAX: the per-device recipes, the single-device baseline, and data parallelism on a mesh.

    measure_baseline(config, 'seed')                       # one device, settled (or flagged)
    measure_mesh(2, config, 'fast', baseline=b)            # predict, print, then measure
    measure_mesh(2, config, 'fast', fsdp=True, baseline=b) # the FSDP layout beside it

One process drives every local device (``perfladder.jax.parallel.layout``'s mesh, replicated or
FSDP-sharded state, batch sharded on ``'data'``); ``perfladder.jax.parallel.launch`` runs the
same step with one process per GPU or host. Weak scaling: each device gets the per-device
batch, so the global batch is ``k`` times it.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from perfladder.config import LadderConfig, expected_num_params
from perfladder.data import TimeMachine
from perfladder.jax.model import GPT
from perfladder.jax.parallel.layout import (
    AXIS,
    batch_sharding,
    make_data_mesh,
    place_state,
)
from perfladder.jax.step import make_optimizer, make_split_step, make_train_step
from perfladder.jax.stream import batches
from perfladder.jax.timer import device_name, has_gpu, throughput
from perfladder.multigpu import costmodel
from perfladder.multigpu.measurement import (
    Baseline,
    DataParallelMeasurement,
    check_form,
    not_measured,
    record,
    settle_baseline,
)

FAST_BATCH_MULT = 4      # the fast form's per-device batch: 4 x the ladder's big batch (2048 in full)
RECIPE_KEYS = ("batch_size", "dtype", "embed", "embed_fp32", "attn_impl", "split")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
PEAK_NOTE = ("peak_mem_bytes_per_gpu is each device's peak_bytes_in_use over this process's "
             "life so far (JAX cannot reset it): an upper bound for this measurement")


# -- recipes ------------------------------------------------------------------------------------
def seed_recipe(config: LadderConfig) -> dict:
    """The seed's R5 per device: fp32 (TF32 on a GPU), batch 64, gather embedding, nnx.jit step."""
    return {"batch_size": config.batch_size, "dtype": "float32", "embed": "gather",
            "embed_fp32": False, "attn_impl": None, "split": False}


def fast_recipe(config: LadderConfig, *, batch_size: int | None = None, embed: str = "gather",
                embed_fp32: bool = True, attn_impl: str | None = "auto", split: bool = True) -> dict:
    """The fastest single-GPU recipe per device: bf16, fp32 embedding gradient, cuDNN attention
    (``'auto'``: on a GPU only), split/merge jit with donation, batch ``FAST_BATCH_MULT x big_batch``."""
    if attn_impl == "auto":
        attn_impl = "cudnn" if has_gpu() else None
    return normalize_recipe({"batch_size": batch_size or FAST_BATCH_MULT * config.big_batch,
                             "dtype": "bfloat16", "embed": embed, "embed_fp32": embed_fp32,
                             "attn_impl": attn_impl, "split": split})


def normalize_recipe(recipe) -> dict:
    """A dict with exactly ``RECIPE_KEYS``. Accepts a dict or ``perfladder.jax.rungs.beyond.Recipe``
    (a bf16 recipe: ``dtype`` defaults to 'bfloat16')."""
    d = dict(recipe.to_dict() if hasattr(recipe, "to_dict") else recipe)
    unknown = set(d) - set(RECIPE_KEYS)
    if unknown:
        raise ValueError(f"unknown recipe keys {sorted(unknown)}; valid keys: {RECIPE_KEYS}")
    out = {"dtype": "bfloat16", "embed": "gather", "embed_fp32": False, "attn_impl": None,
           "split": False, **d}
    b = out.get("batch_size")
    if not isinstance(b, int) or isinstance(b, bool) or b < 1:
        raise ValueError(f"batch_size={b!r} must be a positive integer")
    if out["dtype"] not in DTYPES:
        raise ValueError(f"dtype={out['dtype']!r} is not valid; valid choices: {tuple(DTYPES)}")
    return out


def recipe_for(config: LadderConfig, form: str, recipe=None) -> dict:
    if check_form(form) == "seed":
        seed = seed_recipe(config)
        if recipe is not None and normalize_recipe(recipe) != seed:
            raise ValueError("form='seed' is the seed chapter's fixed recipe; pass another "
                             "recipe only with form='fast'")
        return seed
    return fast_recipe(config) if recipe is None else normalize_recipe(recipe)


# -- one replica: model, optimizer, step ------------------------------------------------------------
class Replica:
    """A fresh model (``nnx.Rngs(config.seed)``: the same weights everywhere), its AdamW, a step.

    Lay the state out (``place``) *before* asking for ``step``: the split/merge step takes
    the state it will donate when it is built.
    """

    def __init__(self, config: LadderConfig, recipe: dict, vocab_size: int):
        self.recipe = recipe
        self.model = GPT(config.gpt(vocab_size=vocab_size), rngs=nnx.Rngs(config.seed),
                         dtype=DTYPES[recipe["dtype"]], param_dtype=jnp.float32,
                         embed=recipe["embed"], embed_fp32=recipe["embed_fp32"],
                         attn_impl=recipe["attn_impl"])
        self.optimizer = make_optimizer(self.model, config.lr)
        self._step = None

    @property
    def step(self):
        if self._step is None:
            if self.recipe["split"]:
                self._step = make_split_step(self.model, self.optimizer)
            else:
                jitted, model, opt = make_train_step(), self.model, self.optimizer
                self._step = lambda X, Y: jitted(model, opt, X, Y)
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


def peak_mem_bytes(devices) -> list:
    """``peak_bytes_in_use`` of each device (None where the backend does not report it)."""
    out = []
    for d in devices:
        stats = d.memory_stats() if hasattr(d, "memory_stats") else None
        out.append(int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None)
    return out


def allreduce_bus_bw(mesh, numel: int, iters: int = 5, warmup: int = 2) -> float:
    """Measured all-reduce bus bandwidth (bytes/s, busbw convention) of ``numel`` fp32 values
    per device: ``psum`` over the mesh's ``'data'`` axis, timed on the host."""
    k = mesh.devices.size
    sharding = NamedSharding(mesh, P(AXIS))
    ones = np.ones((1, numel), np.float32)
    x = jax.make_array_from_callback((k, numel), sharding, lambda idx: ones)   # (k, numel), a row each
    reduce = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, AXIS), mesh=mesh,
                                   in_specs=P(AXIS), out_specs=P(AXIS)))
    for _ in range(warmup):
        x = reduce(x) * (1.0 / k)            # keep the values bounded
    jax.block_until_ready(x)
    t0 = time.perf_counter()
    for _ in range(iters):
        x = reduce(x)
    jax.block_until_ready(x)
    dt = (time.perf_counter() - t0) / iters
    return 2 * (k - 1) / k * 4 * numel / dt


# -- measurements -------------------------------------------------------------------------------------
def measure_baseline(config: LadderConfig, form: str = "fast", recipe=None, *,
                     warmup: int | None = None, timed: int | None = None,
                     windows: int | None = None) -> Baseline:
    """The single-device rate of ``form`` on ``jax.devices()[0]``, settled (re-measured once if
    its windows spread > 5%; ``settled=False`` if it spreads twice)."""
    recipe = recipe_for(config, form, recipe)
    data = corpus(config)
    rep = Replica(config, recipe, len(data.vocab))
    stream = batches(data, recipe["batch_size"], seed=config.seed + 100)
    base = settle_baseline(lambda: throughput(rep.step, stream, **_timing(config, warmup, timed, windows)))
    base.peak_mem_bytes = peak_mem_bytes(jax.devices()[:1])[0]
    return base


def measure_mesh(k: int, config: LadderConfig, form: str = "fast", recipe=None, *,
                 fsdp: bool = False, link=None, baseline: Baseline | None = None,
                 warmup: int | None = None, timed: int | None = None,
                 windows: int | None = None) -> DataParallelMeasurement:
    """``k``-device data parallelism in this process: predict (printed), then measure.

    ``baseline``: the single-device ``Baseline`` of the same form (measured here if None);
    ``link``: a ``perfladder.multigpu.costmodel.LINKS`` name (default: 'nvlink4-h200' on a GPU,
    'gloo-loopback' on CPU). ``fsdp``: shard parameters and optimizer state too.
    """
    recipe = recipe_for(config, form, recipe)
    mechanism = "mesh-fsdp" if fsdp else "mesh"
    B, T = recipe["batch_size"], config.num_steps
    mesh = make_data_mesh(k)                                      # k > devices -> ValueError
    data = corpus(config)
    n = num_params(config, len(data.vocab))
    if baseline is None:
        baseline = measure_baseline(config, form, recipe, warmup=warmup, timed=timed, windows=windows)
    link = link or ("nvlink4-h200" if has_gpu() else "gloo-loopback")
    pred = costmodel.predict(k, B, T, baseline.tokens_per_s, n, link)
    costmodel.announce([pred], label=f"R5 jax {mechanism} {form}")          # before the launch
    rep = Replica(config, recipe, len(data.vocab))
    place_state(mesh, rep.model, rep.optimizer, fsdp=fsdp)
    stream = batches(data, k * B, seed=config.seed + 200, sharding=batch_sharding(mesh))
    if k > 1:
        from perfladder.jax.checks import distinct_devices
        distinct_devices(next(stream)[0])        # every device its own rows (CountError if not)
    bw = allreduce_bus_bw(mesh, n) if k > 1 else None
    t = throughput(rep.step, stream, **_timing(config, warmup, timed, windows))
    devices = list(mesh.devices.flat)
    notes = [f"one process drives {k} devices; per-device batch {B} (global {k * B}); state "
             f"{'sharded (FSDP)' if fsdp else 'replicated'}, batch sharded on 'data'", PEAK_NOTE]
    if not has_gpu():
        notes.append("CPU devices: the numbers exercise the code path, not an interconnect")
    return record(framework="jax", mechanism=mechanism, form=form, k=k, per_rank_batch=B,
                  seq_len=T, windows=t.windows, baseline=baseline, prediction=pred,
                  bus_bw_measured=bw, peak_mem_bytes_per_gpu=peak_mem_bytes(devices),
                  recipe=recipe, device=device_name(), notes=notes)


def skipped_mesh(k: int, config: LadderConfig, form: str, reason: str, recipe=None, fsdp=False):
    """A mesh measurement that did not run (e.g. one device visible), with the reason."""
    recipe = recipe_for(config, form, recipe)
    return not_measured(status="skipped", reason=reason, framework="jax",
                        mechanism="mesh-fsdp" if fsdp else "mesh", form=form, k=k,
                        per_rank_batch=recipe["batch_size"], seq_len=config.num_steps,
                        recipe=recipe)


def _timing(config: LadderConfig, warmup, timed, windows) -> dict:
    return {"warmup": config.warmup if warmup is None else warmup,
            "timed": config.timed if timed is None else timed,
            "windows": config.windows if windows is None else windows}
