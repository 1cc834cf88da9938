"""Data-parallel rungs, predicted before anything is launched:

    R5   data_parallel       the seed's form: R0's eager fp32 batch-64 step per rank, DDP
    R5x  data_parallel_fast  the fastest configuration so far per rank, DDP
    R5f  fsdp                the same with FSDP2 (``fully_shard``)

The cost model (``perfladder.multigpu.costmodel``: the single-GPU step plus one ring all-reduce of the
fp32 gradients over a stated link, no overlap) is printed and stored for k = 2, 4, 8 on every
build, one GPU and CPU included, where the rung then measures nothing and says so. With k >= 2
GPUs, ``torchrun`` launches the ranks (``perfladder.torch.parallel.measure``) and the measurement
is stored beside the prediction.
"""
from __future__ import annotations

import torch

from perfladder.ladder.rung import Evidence, Given, NotMeasured, Rung
from perfladder.measure.evidence import Memory, Timing
from perfladder.multigpu import costmodel
from perfladder.multigpu.measurement import baseline_of
from perfladder.torch.lab import TorchLab
from perfladder.torch.parallel import measure as dataparallel
from perfladder.torch.parallel.launch import rank_recipe
from perfladder.torch.rungs.recipes import seed_recipe

PREDICT_KS = costmodel.PREDICT_KS


def single_device_rate(lab: TorchLab, base: str | None):
    """The single-GPU rate the prediction and the efficiency use: the base rung's windows."""
    try:
        r = lab.result.rung(base)
    except KeyError:
        return None, None
    if not r.measured or r.timing is None:
        return None, None
    return baseline_of(r.timing), base


def data_parallel(lab: TorchLab, given: Given, *, form: str, parallel: str) -> Evidence:
    name, recipe, base = given.rung.name, given.recipe, given.base_name
    backend = "nccl" if lab.on_gpu else "gloo"
    link = dataparallel.default_link(backend)
    baseline, source = single_device_rate(lab, base)
    ranked, dropped = rank_recipe(recipe)
    per_rank = ranked if form == "fast" else seed_recipe(lab.config)   # the seed form: R0's, fixed
    if baseline is None:
        baseline = dataparallel.measure_baseline(lab.config, form, per_rank, backend=backend)
        source = "measured for this rung (one rank)"
    B, T = recipe.batch_size, lab.config.num_steps
    preds = costmodel.predictions(B, T, baseline.tokens_per_s, lab.num_params, link)
    costmodel.announce(preds, label=f"{name} torch")                 # before any launch
    pred = costmodel.prediction(preds, link, baseline.tokens_per_s, source, baseline.settled, unit="gpu")
    n_gpu = torch.cuda.device_count() if lab.on_gpu else 0
    ks = [k for k in PREDICT_KS if k <= n_gpu]
    if not ks:
        raise NotMeasured(f"{n_gpu} CUDA GPU(s) here: data parallelism needs at least 2; predicted "
                          "for k = 2, 4, 8, not measured", prediction=pred)
    runs = []
    for k in ks:
        lab.reset_memory()                               # hand the ranks the parent's cache
        runs.append(dataparallel.measure(k, lab.config, form, per_rank, parallel=parallel,
                                         baseline=baseline, link=link, parallelize=lab.code["parallelize"]))
    m = runs[-1]
    details = {"runs": [r.to_dict() | {"ranks": []} for r in runs],
               "not_carried_under_ddp": dropped}
    if m.status != "measured":
        raise NotMeasured(m.reason, details=details, prediction=pred)
    pred.predicted_tokens_per_s = m.predicted_tokens_per_s
    pred.measured_tokens_per_s = m.measured_tokens_per_s
    details.update(k=m.k, per_rank_batch=m.per_rank_batch, bus_bw_measured=m.bus_bw_measured,
                   efficiency_vs_linear=m.efficiency_vs_linear, efficiency_note=m.efficiency_note,
                   peak_mem_bytes_per_gpu=m.peak_mem_bytes_per_gpu,
                   predicted_at_measured_bw=m.predicted_at_measured_bw_tokens_per_s)
    timing = Timing.from_dict(m.timing)
    mems = [x for x in m.peak_mem_bytes_per_gpu if x is not None]
    details["mechanism"] = f"{name_label(parallel)} x{m.k}"
    return Evidence(timing=timing, prediction=pred, details=details, devices=m.k,
                    memory=Memory(max(mems) if mems else None, "measured peak per GPU (largest rank)"))


def name_label(parallel: str) -> str:
    return {"ddp": "DDP", "fsdp2": "FSDP2"}[parallel]


def r5_data_parallel(lab, given: Given) -> Evidence:
    return data_parallel(lab, given, form="seed", parallel="ddp")


def r5x_data_parallel_fast(lab, given: Given) -> Evidence:
    return data_parallel(lab, given, form="fast", parallel="ddp")


def r5f_fsdp(lab, given: Given) -> Evidence:
    return data_parallel(lab, given, form="fast", parallel="fsdp2")


MULTI_GPU = [
    Rung("R5", "data_parallel", "DDP", r5_data_parallel, stage="multi-gpu", kind="multi-gpu",
         builds_on="R0",
         gate="every rank starts from rank 0's weights (DDP broadcasts them)"),
    Rung("R5x", "data_parallel_fast", "DDP, fastest recipe", r5x_data_parallel_fast,
         stage="multi-gpu", kind="multi-gpu",
         gate="every rank starts from rank 0's weights"),
    Rung("R5f", "fsdp", "FSDP2, fastest recipe", r5f_fsdp, stage="multi-gpu", kind="multi-gpu", gate="every rank starts from the same weights"),
]
