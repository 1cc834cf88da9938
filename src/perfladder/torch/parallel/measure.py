"""R5 in PyTorch as a measurement: the settled single-device baseline, the prediction (printed
before the launch), the k-rank launch, and one ``perfladder.multigpu.measurement.DataParallelMeasurement``.

    recipe = recipe_for(config, 'fast')                      # perfladder.torch.rungs.recipes
    base = measure_baseline(config, 'fast', recipe)          # one rank, same recipe, settled
    m = measure(2, config, 'fast', recipe, baseline=base)    # DDP; parallel='fsdp2' for FSDP2

Every launch is a fresh ``torchrun`` (``perfladder.torch.parallel.launch``), so each process's peak GPU
memory belongs to that measurement alone.
"""
from __future__ import annotations

from perfladder.config import LadderConfig, expected_num_params
from perfladder.data import TimeMachine
from perfladder.multigpu import costmodel
from perfladder.multigpu.measurement import Baseline, not_measured, record
from perfladder.torch.parallel.launch import (
    data_parallel_tokens,
    default_backend,
    given_recipe,
)

MECHANISM = {"ddp": "ddp", "fsdp2": "fsdp2", "none": "independent"}
WHAT = {"ddp": "DistributedDataParallel", "fsdp2": "FSDP2 fully_shard per block + root",
        "none": "no wrapper: k independent copies of the single-device step, no gradient "
                "exchange (a control: what running k GPUs at once costs without communication)"}


def num_params(config: LadderConfig) -> int:
    vocab = len(TimeMachine(config.batch_size, config.num_steps, num_train=config.num_train,
                            num_val=config.num_val).vocab)
    return expected_num_params(config.gpt(vocab_size=vocab))


def default_link(backend: str) -> str:
    """The ``perfladder.multigpu.costmodel.LINKS`` entry a backend is priced with unless told
    otherwise: this machine's (``costmodel.machine_link``), gloo's CPU ranks for 'gloo'."""
    if backend != "nccl":
        return costmodel.machine_link(0)
    import torch
    return costmodel.machine_link(torch.cuda.device_count())


def measure_baseline(config: LadderConfig, form: str, recipe, *,
                     backend: str | None = None, warmup: int | None = None,
                     timed: int | None = None, windows: int | None = None, out_dir=None,
                     timeout: float = 900.0) -> Baseline:
    """The single-device rate of ``form``: one rank, no wrapper, the same recipe; settled
    (re-measured once in the same process if its windows did not settle)."""
    res = data_parallel_tokens(1, config, form, recipe, parallel="none", backend=backend,
                               warmup=warmup, timed=timed, windows=windows, settle=True,
                               bench_allreduce=False, out_dir=out_dir, timeout=timeout)
    rank = res["ranks"][0]
    base = Baseline.from_dict(rank["baseline"])
    base.peak_mem_bytes = rank.get("peak_mem_bytes")
    return base


def measure(k: int, config: LadderConfig, form: str, recipe, *,
            parallel: str = "ddp", baseline: Baseline | None = None, link=None,
            backend: str | None = None, warmup: int | None = None, timed: int | None = None,
            windows: int | None = None, out_dir=None, timeout: float = 900.0,
            parallelize=None):
    """``k`` ranks of ``form`` running ``recipe`` (``launch.given_recipe``) under ``parallel``
    ('ddp' | 'fsdp2' | 'none'), predicted first; ``parallelize``: the function each rank wraps
    its model with (default: the library's).

    ``parallel='none'`` is the control (mechanism 'independent'): the ranks run the bare
    single-device step side by side; no prediction (there is no communication to price).

    ``baseline``: the same form's single-device ``Baseline`` (measured here if None);
    ``link``: a ``perfladder.multigpu.costmodel.LINKS`` name (default: ``default_link(backend)``,
    this machine's link). A launch that fails is recorded (``status='failed'``,
    or ``'skipped'`` for FSDP2, with the ranks' last output as the reason), never raised,
    so one broken configuration does not hide the others.
    """
    if parallel not in MECHANISM:
        raise ValueError(f"parallel={parallel!r} is not valid; valid choices: {tuple(MECHANISM)}")
    backend = backend or default_backend()
    recipe = given_recipe(form, recipe)
    B, T, n = recipe.batch_size, config.num_steps, num_params(config)
    timing = {"warmup": warmup, "timed": timed, "windows": windows}
    if baseline is None:
        baseline = measure_baseline(config, form, recipe, backend=backend, timeout=timeout, **timing)
    pred = None
    if parallel != "none":
        pred = costmodel.predict(k, B, T, baseline.tokens_per_s, n, link or default_link(backend))
        costmodel.announce([pred], label=f"R5 torch {parallel} {form}")    # before the launch
    try:
        res = data_parallel_tokens(k, config, form, recipe, parallel=parallel, backend=backend,
                                   out_dir=out_dir, timeout=timeout,
                                   parallelize=parallelize, **timing)
    except RuntimeError as e:
        what = "FSDP2 (fully_shard) did not run here" if parallel == "fsdp2" else "launch failed"
        return not_measured(status="skipped" if parallel == "fsdp2" else "failed",
                            reason=f"{what}: {str(e)[-3000:]}", framework="torch",
                            mechanism=MECHANISM[parallel], form=form, k=k, per_rank_batch=B,
                            seq_len=T, processes=k, recipe=recipe.to_dict(),
                            prediction=None if pred is None else pred.to_dict(),
                            predicted_tokens_per_s=None if pred is None else pred.predicted_tokens_per_s,
                            baseline=baseline.to_dict())
    notes = [f"{k} ranks x batch {B} (global {k * B}), backend {backend}, "
             f"{WHAT[parallel]}; "
             "tokens/s summed over ranks, each rank timing its own batches",
             "bus_bw_measured: the slowest rank's timed all-reduce of a gradient-sized fp32 buffer"]
    return record(framework="torch", mechanism=MECHANISM[parallel], form=form, k=k,
                  per_rank_batch=B, seq_len=T, timing=res["timing"], baseline=baseline,
                  prediction=pred, bus_bw_measured=res["bus_bw_measured"],
                  peak_mem_bytes_per_gpu=res["peak_mem_bytes_per_gpu"], recipe=recipe.to_dict(),
                  processes=k, nodes=res["nodes"], device=res["ranks"][0]["device_name"],
                  notes=notes, ranks=res["ranks"])
