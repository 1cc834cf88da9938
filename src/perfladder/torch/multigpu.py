"""Data parallelism rungs (R5: the seed's batch-64 step per rank; R5x: the fastest recipe per
rank), predicted before anything is launched.

The prediction is computed and stored on every build, one GPU and CPU included (there the
rung measures nothing and says so); with k >= 2 GPUs, ``torchrun`` launches DDP and the
measurement is stored beside the prediction.
"""
from __future__ import annotations

import torch

from ..evidence import Memory, Prediction, Timing
from ..hardware import achieved_tflops, mfu
from ..ladder import Rung
from ..results import RungResult
from ..timing import Throughput
from . import ddp
from .lab import TorchLab

PREDICT_KS = (2, 4, 8)


def single_rate(lab: TorchLab, base: str | None, recipe) -> tuple[float, str]:
    """Tokens/s of ``recipe`` on one device: the rung it builds on, if it ran and settled."""
    try:
        r = lab.result.rung(base)
        if r.measured and r.stable is not False:
            return r.tokens_per_s, base
    except KeyError:
        pass
    step = lab.build_step(recipe)
    t, _, _ = lab.measure(step, recipe.batch_size)
    if not t.stable:
        raise RuntimeError(f"the single-device rate of {recipe} did not settle "
                           f"({t}); no prediction is made from an unsettled baseline")
    return t.tokens_per_s, "measured for this rung"


def predict(lab: TorchLab, recipe, base, backend: str) -> Prediction:
    rate, source = single_rate(lab, base, recipe)
    B, T = recipe.batch_size, lab.config.num_steps
    t_comp = B * T / rate
    points = [ddp.cost_model_floor(k, B, T, t_comp, lab.num_params, ddp.ASSUMED_BUS_BW[backend])
              for k in PREDICT_KS]
    for p in points:
        print(f"prediction k={p['k']}: t_compute {1e3 * p['t_compute_s']:.2f} ms ({source}) + "
              f"t_comm {1e3 * p['t_comm_s']:.2f} ms -> no-overlap floor "
              f"{p['floor_tokens_per_s']:,.0f} tokens/s (linear {p['linear_tokens_per_s']:,.0f})",
              flush=True)
    return Prediction(model="ring all-reduce of fp32 gradients after the step (no overlap)",
                      predicted_tokens_per_s=points[0]["floor_tokens_per_s"],
                      assumptions={"bus_bw": ddp.ASSUMED_BUS_BW[backend], "backend": backend,
                                   "single_device_tokens_per_s": rate, "single_device_source": source,
                                   "bytes_per_param": 4, "num_params": lab.num_params},
                      points=points)


def data_parallel(lab: TorchLab, name: str, label: str, recipe, base) -> RungResult:
    n_gpu = torch.cuda.device_count() if lab.on_gpu else 0
    backend = "nccl" if lab.on_gpu else "gloo"
    pred = predict(lab, recipe, base, backend)
    ks = [k for k in PREDICT_KS if k <= n_gpu]
    if not ks:
        return RungResult(name=name, key="", label=label, kind="skipped", recipe=recipe.to_dict(),
                          prediction=pred, error=f"{n_gpu} CUDA GPU(s) here: data parallelism needs "
                          "at least 2; predicted, not measured")
    k = ks[-1]
    lab.reset_memory()
    meas = ddp.ddp_tokens(k, lab.config, backend=backend, batch_size=recipe.batch_size,
                          compiled=recipe.compiled, bf16=recipe.bf16)
    pred.measured_tokens_per_s = meas["tokens_per_s"]
    pred.predicted_tokens_per_s = next(p for p in pred.points if p["k"] == k)["floor_tokens_per_s"]
    t = Throughput(tokens_per_s=meas["tokens_per_s"], windows=meas["windows"],
                   seconds=[1.0] * len(meas["windows"]), steps_per_window=lab.config.timed,
                   tokens_per_window=0, warmup=lab.config.warmup, stable=meas.get("stable", True),
                   target_spread=lab.config.target_spread)
    rate = meas["tokens_per_s"]
    return RungResult(
        name=name, key="", label=f"{label} x{k}", tokens_per_s=rate, kind="multi-gpu",
        precision="bf16" if recipe.bf16 else lab.fp32_label(), batch_size=recipe.batch_size,
        seq_len=lab.config.num_steps, recipe=recipe.to_dict(), timing=Timing.of(t),
        tflops=achieved_tflops(rate, lab.flops_per_token),
        mfu=mfu(rate / k, lab.flops_per_token, lab.device_name, "bf16" if recipe.bf16 else "tf32"),
        memory=Memory(meas.get("peak_mem_bytes"), "measured peak per GPU"), prediction=pred,
        details={"k": k, "per_rank_batch": recipe.batch_size, "backend": backend,
                 "bus_bw_measured": meas.get("bus_bw_measured"),
                 "efficiency_vs_linear": rate / (k * pred.assumptions["single_device_tokens_per_s"])})


def r5_data_parallel(lab, recipe, base):
    return data_parallel(lab, "R5", "DDP", recipe, base)


def r5x_data_parallel_fast(lab, recipe, base):
    return data_parallel(lab, "R5x", "DDP, fastest recipe", recipe, base)


MULTI = [
    Rung("R5", "data_parallel", "DDP", r5_data_parallel, stage="multi-gpu", kind="multi-gpu",
         builds_on="R0", section="13.5 and 13.6 data parallelism",
         gate="every rank starts from the same weights (DDP broadcasts rank 0's)",
         attacks="tokens per step, k-fold"),
    Rung("R5x", "data_parallel_fast", "DDP, fastest recipe", r5x_data_parallel_fast,
         stage="multi-gpu", kind="multi-gpu", section="13.6 data parallelism",
         gate="every rank starts from the same weights", attacks="tokens per step, k-fold"),
]
