"""The multi-GPU rungs: data parallelism and FSDP by sharding annotations.

    R5   data_parallel       the seed's form: R1's fp32 jitted step, per-device batch as R1's
    R5x  data_parallel_fast  the fastest configuration so far, per device
    R5f  fsdp                R5x with parameters and AdamW state sharded too

Before anything is measured, each writes down the cost model's prediction (``predict``, the
one place the cost model is called). With one device visible nothing can be measured: the
rung is a skipped entry that still carries the prediction, for k = 2, 4, 8.
"""
from __future__ import annotations

import jax

from ..config import expected_num_params
from ..evidence import Prediction
from ..ladder import Rung
from ..results import RungResult
from .lab import JaxLab
from .parallel import DP_BANDWIDTH, batch_sharding, dp_floor, make_data_mesh, place_state
from .recipe import Recipe
from .stream import batches
from .trial import trial

PREDICT_KS = (2, 4, 8)      # predicted on one device, where no k can be measured
STREAM_SEED_OFFSET = 100    # the sharded streams' seed, away from the single-device streams'


def single_device_rate(lab: JaxLab, recipe: Recipe, base: str | None) -> tuple[float, str]:
    """Tokens/s of ``recipe`` on one device: its base's measurement, else measured here."""
    try:
        ran = lab.result.rung(base) if base else None
    except KeyError:
        ran = None
    if ran is not None and ran.measured and ran.recipe == recipe.to_dict():
        return ran.tokens_per_s, base
    step = lab.build_step(recipe)
    lab.first_call(step, *next(lab.stream(recipe.batch_size)))
    t, _ = lab.measure(step, recipe.batch_size)
    return t.tokens_per_s, "measured here on one device"


def predict(lab: JaxLab, recipe: Recipe, base: str | None, ks, fsdp: bool,
            bandwidth: float = DP_BANDWIDTH) -> Prediction:
    """The cost model's floor (no overlap) and linear ceiling for each ``k`` in ``ks``;
    ``predicted_tokens_per_s`` is the floor at the largest ``k``."""
    single, source = single_device_rate(lab, recipe, base)
    tokens = recipe.batch_size * lab.config.num_steps           # per device per step
    points = [dp_floor(k=k, num_params=expected_num_params(lab.gpt_config), tokens_per_step=tokens,
                       t_compute=tokens / single, bandwidth=bandwidth) for k in ks]
    assumptions = {"bandwidth_bytes_per_s": bandwidth, "per_device_batch": recipe.batch_size,
                   "single_device_tokens_per_s": single, "single_device_source": source,
                   "layout": "fsdp" if fsdp else "replicated"}
    if fsdp:   # all-gather of the parameters + reduce-scatter of the gradients: >= allreduce bytes
        assumptions["fsdp"] = "the data-parallel floor: FSDP moves at least the allreduce's bytes"
    return Prediction(
        model="data parallel, ring allreduce of fp32 gradients, no overlap (parallel.dp_floor)",
        predicted_tokens_per_s=points[-1]["floor_tokens_per_s"], points=points,
        assumptions=assumptions)


def sharded(lab: JaxLab, rung: Rung, recipe: Recipe, base: str | None, fsdp: bool) -> RungResult:
    """Measure ``recipe`` per device over every visible device (or, on one, predict only)."""
    k = jax.device_count()
    pred = predict(lab, recipe, base, (k,) if k > 1 else PREDICT_KS, fsdp)
    p = pred.points[-1]
    print(f"{rung.name} prediction for k={p['k']}: floor {p['floor_tokens_per_s']:,.0f} tokens/s, "
          f"linear ceiling {p['ceiling_tokens_per_s']:,.0f}", flush=True)
    if k == 1:
        return RungResult(name=rung.name, key=rung.key, label=rung.label, kind="skipped",
                          stage=rung.stage, builds_on=base, recipe=recipe.to_dict(),
                          error="one device visible: data parallelism needs at least two "
                                "(nothing measured; the prediction is stored)",
                          prediction=pred, section=rung.section)
    mesh = make_data_mesh(k)
    stream = batches(lab.data, k * recipe.batch_size, seed=lab.config.seed + STREAM_SEED_OFFSET,
                     sharding=batch_sharding(mesh))
    tr = trial(lab, recipe, stream=stream, devices=k,
               place=lambda model, opt: place_state(mesh, model, opt, fsdp=fsdp))
    pred.measured_tokens_per_s = tr.t.tokens_per_s
    details = {"devices": k, "per_device_batch": recipe.batch_size,
               "layout": "fsdp" if fsdp else "replicated",
               "efficiency_vs_linear": tr.t.tokens_per_s / p["ceiling_tokens_per_s"]}
    notes = [] if lab.on_gpu else ["CPU host devices: the numbers exercise the code path, not an interconnect"]
    return tr.record(lab, rung, kind="multi-gpu", prediction=pred, details=details, notes=notes)


def r5_data_parallel(lab: JaxLab, recipe: Recipe, base):
    return sharded(lab, R5, recipe, base, fsdp=False)


def r5x_data_parallel_fast(lab: JaxLab, recipe: Recipe, base):
    return sharded(lab, R5x, recipe, base, fsdp=False)


def r5f_fsdp(lab: JaxLab, recipe: Recipe, base):
    return sharded(lab, R5f, recipe, base, fsdp=True)


MULTI = dict(stage="multi-gpu", kind="multi-gpu", section="13.6 data parallelism")
R5 = Rung("R5", "data_parallel", "data parallel", r5_data_parallel, builds_on="R1", **MULTI,
          gate="R1's jitted step, unchanged: only the arrays' layouts change",
          attacks="one device's throughput: k devices, gradients allreduced")
R5x = Rung("R5x", "data_parallel_fast", "data parallel (fastest recipe)", r5x_data_parallel_fast,
           **MULTI, gate="the fastest configuration's step, unchanged: only the layouts change",
           attacks="one device's throughput, from the fastest configuration")
R5f = Rung("R5f", "fsdp", "FSDP (fastest recipe)", r5f_fsdp, **MULTI,
           gate="the fastest configuration's step, unchanged: parameters and AdamW state sharded",
           attacks="per-device memory of the replicated state")

MULTI_GPU = [R5, R5x, R5f]
