"""The multi-GPU rungs: data parallelism and FSDP by sharding annotations.

    R5   data_parallel       the seed's form: R1's fp32 jitted step, per-device batch as R1's
    R5x  data_parallel_fast  the fastest configuration so far, per device
    R5f  fsdp                R5x with parameters and AdamW state sharded too

Before anything is measured, each writes down the cost model's prediction (``predict``:
``perfladder.multigpu.costmodel``, for k = 2, 4, 8, over a stated link). With one device visible nothing can be measured: the
rung is a skipped entry that still carries the prediction, for k = 2, 4, 8.
"""
from __future__ import annotations

import statistics

import jax

from perfladder.config import expected_num_params
from perfladder.jax.lab import JaxLab
from perfladder.jax.parallel.allreduce import check_allreduce, precision_of
from perfladder.jax.parallel.layout import (
    allreduce_bus_bw,
    batch_sharding,
    make_data_mesh,
    peak_mem_bytes,
)
from perfladder.jax.recipe import Recipe
from perfladder.jax.stream import batches
from perfladder.jax.trial import trial
from perfladder.ladder.rung import Evidence, Given, NotMeasured, Rung
from perfladder.measure.evidence import Prediction
from perfladder.multigpu import costmodel
from perfladder.multigpu.measurement import baseline_of, efficiency

STREAM_SEED_OFFSET = 100    # the sharded streams' seed, away from the single-device streams'


def single_device_rate(lab: JaxLab, recipe: Recipe, base: str | None):
    """``(Baseline, source)``: ``recipe`` on one device, from its base's measurement when that ran
    the same recipe, else measured here; settled or not (``perfladder.multigpu.measurement.Baseline.settled``)."""
    try:
        ran = lab.result.rung(base) if base else None
    except KeyError:
        ran = None
    if ran is not None and ran.measured and ran.timing and lab.recipe_from_dict(ran.recipe) == recipe:
        return baseline_of(ran.timing), base
    step = lab.build_step(recipe)
    lab.first_call(step, *next(lab.stream(recipe.batch_size)))
    return baseline_of(lab.measure(step, recipe.batch_size).throughput), "measured here on one device"


def predict(lab: JaxLab, recipe: Recipe, base: str | None, label: str) -> tuple[Prediction, object]:
    """The cost model for k = 2, 4, 8 (``perfladder.multigpu.costmodel``), printed before any launch."""
    single, source = single_device_rate(lab, recipe, base)
    link = costmodel.machine_link(jax.device_count() if lab.on_gpu else 0)
    preds = costmodel.predictions(recipe.batch_size, lab.config.num_steps, single.tokens_per_s,
                                  expected_num_params(lab.gpt_config), link)
    costmodel.announce(preds, label=label)
    pred = costmodel.prediction(preds, link, single.tokens_per_s, source, single.settled, unit="device")
    return pred, single


def sharded(lab: JaxLab, given: Given, fsdp: bool) -> Evidence:
    """Measure the recipe per device over every visible device (or, on one, predict only)."""
    rung, recipe, base = given.rung, given.recipe, given.base_name
    k = jax.device_count()
    pred, single = predict(lab, recipe, base, f"{rung.name} jax")
    if k == 1:
        raise NotMeasured("one device visible: data parallelism needs at least two (predicted for "
                          "k = 2, 4, 8; nothing measured)", prediction=pred)
    n = expected_num_params(lab.gpt_config)
    at_k = costmodel.predict(k, recipe.batch_size, lab.config.num_steps, single.tokens_per_s, n,
                             pred.assumptions["link"]["name"])
    mesh = make_data_mesh(k)
    stream = batches(lab.data, k * recipe.batch_size, seed=lab.config.seed + STREAM_SEED_OFFSET,
                     sharding=batch_sharding(mesh))
    ev = trial(lab, given, stream=stream, devices=k, prediction=pred,
               place=lambda model, opt: lab.code["place_state"](mesh, model, opt, fsdp=fsdp),
               check=lambda step, X, Y: check_allreduce(step.model, X, Y, lambda: lab.model(recipe),
                                                        precision=precision_of(recipe)))
    rate = statistics.median(ev.timing.settled_windows)
    pred.predicted_tokens_per_s = at_k.predicted_tokens_per_s
    pred.measured_tokens_per_s = rate
    eff, why = efficiency(rate, k, single)
    details = {"k": k, "per_rank_batch": recipe.batch_size,
               "layout": "fsdp" if fsdp else "replicated",
               "bus_bw_measured": allreduce_bus_bw(mesh, n),
               "efficiency_vs_linear": eff, "efficiency_note": why,
               "peak_mem_bytes_per_gpu": peak_mem_bytes(mesh.devices.flat)}
    ev.details.update(details)
    if not lab.on_gpu:
        ev.notes.append("CPU host devices: the numbers exercise the code path, not an interconnect")
    return ev


def r5_data_parallel(lab: JaxLab, given: Given) -> Evidence:
    return sharded(lab, given, fsdp=False)


def r5x_data_parallel_fast(lab: JaxLab, given: Given) -> Evidence:
    return sharded(lab, given, fsdp=False)


def r5f_fsdp(lab: JaxLab, given: Given) -> Evidence:
    return sharded(lab, given, fsdp=True)


MULTI = dict(stage="multi-gpu", kind="multi-gpu")
R5 = Rung("R5", "data_parallel", "data parallel", r5_data_parallel, builds_on="R1", **MULTI,
          gate="R1's jitted step, unchanged: only the arrays' layouts change")
R5x = Rung("R5x", "data_parallel_fast", "data parallel (fastest recipe)", r5x_data_parallel_fast,
           **MULTI, gate="the fastest configuration's step, unchanged: only the layouts change")
R5f = Rung("R5f", "fsdp", "FSDP (fastest recipe)", r5f_fsdp, **MULTI,
           gate="the fastest configuration's step, unchanged: parameters and AdamW state sharded")

MULTI_GPU = [R5, R5x, R5f]
