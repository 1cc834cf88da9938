"""One rank of R5 under ``torchrun``: build the form's step, wrap it (DDP / FSDP2 / nothing), time it.

``perfladder.torch.parallel.launch`` writes the spec and launches; this module is what every rank runs.
The spec (a dict, JSON on disk) says:

* ``recipe`` -- the per-rank training configuration, ``perfladder.torch.recipe.Recipe.to_dict()``:
  the seed form is R0's (eager fp32, TF32 on CUDA, at the seed batch, PyTorch's default AdamW);
  the fast form whatever recipe the launcher was handed (resolved by the rungs:
  ``perfladder.torch.rungs.recipes.fast_recipe``);
* ``parallel`` -- ``'ddp'`` (``DistributedDataParallel``), ``'fsdp2'`` (``fully_shard`` on
  every block and the root), or ``'none'`` (the single-device baseline, one rank);
* timing (``warmup``, ``timed``, ``windows``), ``settle`` (re-measure an unsettled
  baseline once), ``check_steps`` (take steps and save parameters instead of timing);
* ``parallelize`` (optional) -- ``{'name', 'source'}`` of the function that wraps the model,
  when it is not this module's ``parallelize``: the page's own cell, which every rank compiles
  and runs (``technique``), so an edit on the page is what the ranks measure.

Every rank builds the same GPT from the same seed and streams its *own* batches (weak
scaling). Rank 0 gathers every rank's record and writes ``ranks.json``; with several nodes
that file lands on the node holding rank 0.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

PARALLELS = ("ddp", "fsdp2", "none")
PAGE_MODULE = "page"        # the module a shipped function's source is compiled as


def allreduce_bus_bw(numel: int, device, iters: int = 5, warmup: int = 2) -> float:
    """Measured all-reduce bus bandwidth (bytes/s, busbw convention) for ``numel`` fp32 values."""
    from perfladder.torch.timer import sync
    buf = torch.ones(numel, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(buf)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync()
    dt = (time.perf_counter() - t0) / iters
    k = dist.get_world_size()
    return 2 * (k - 1) / k * 4 * numel / dt


def _digest(t) -> str:
    return hashlib.sha1(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def batch_digest(stream) -> str:
    """The content of the next batch of this rank's own stream (drawn before timing)."""
    X, _ = next(stream)
    return _digest(X)


def distinct_batches(stream, world: int) -> list[str]:
    """Every rank's next batch, by content, gathered: they must differ
    (``perfladder.measure.counts.check_distinct``; ranks fed copies of one batch would count
    k x the tokens of one). Every rank raises the same ``CountError``."""
    from perfladder.measure.counts import check_distinct
    digests = [None] * world
    dist.all_gather_object(digests, batch_digest(stream))
    return check_distinct(digests, "ranks")


def _flat_params(model):
    return torch.cat([p.detach().float().reshape(-1).cpu() for p in _local_params(model)])


def _local_params(model):
    """Parameters as plain tensors (an FSDP2 parameter is a DTensor: its local shard)."""
    for p in model.parameters():
        yield p.to_local() if hasattr(p, "to_local") else p


def parallelize(model, parallel, device):
    """R5: ``model`` made data-parallel the ``parallel`` way: DDP
    all-reduces the gradients after backward; FSDP2 shards parameters,
    gradients and optimizer state over the ranks (in place)."""
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6 exports it here
        for blk in model.blks:                            # one all-gather / reduce-scatter per block
            fully_shard(blk)
        fully_shard(model)                                # the root: embedding (tied) and final norm
        return model
    if parallel == "none":
        return model
    raise ValueError(f"parallel={parallel!r} is not valid; "
                     "valid choices: ('ddp', 'fsdp2', 'none')")


def technique(shipped: dict | None):
    """The ``parallelize`` function ``spec['parallelize']`` ships (its source compiled here), or
    this module's."""
    if shipped is None:
        return parallelize
    env: dict = {"__name__": PAGE_MODULE}
    exec(compile(shipped["source"], f"<the page's {shipped['name']}>", "exec"), env)
    fn = env.get(shipped["name"])
    if not callable(fn):
        raise ValueError(f"the shipped source defines no function {shipped['name']!r}")
    return fn


def technique_name(fn) -> str:
    """Which function wrapped a rank's model, for its record: ``page.<name>`` for a shipped one."""
    return f"{fn.__module__}.{fn.__name__}"


def build(spec: dict, device, rank: int, wrap=None):
    """``(model, step, stream, num_params)`` for this rank, as ``spec`` describes; ``wrap``: the
    ``parallelize`` function to use (default: ``technique(spec['parallelize'])``)."""
    from perfladder.config import LadderConfig, expected_num_params
    from perfladder.data import TimeMachine
    from perfladder.torch.model import GPT
    from perfladder.torch.recipe import Recipe
    from perfladder.torch.step import make_optimizer, make_step
    from perfladder.torch.stream import batches

    cfg, recipe = LadderConfig(**spec["config"]), Recipe.from_dict(spec["recipe"])
    data = TimeMachine(cfg.batch_size, cfg.num_steps, num_train=cfg.num_train, num_val=cfg.num_val)
    torch.manual_seed(cfg.seed)                          # identical initial weights on every rank
    gpt_cfg = cfg.gpt(vocab_size=len(data.vocab))
    model = GPT(gpt_cfg, **recipe.model_kw()).to(device)
    wrap = technique(spec.get("parallelize")) if wrap is None else wrap
    wrapped = wrap(model, spec["parallel"], device)
    opt = make_optimizer(wrapped, cfg.lr, recipe.optimizer)
    step = make_step(wrapped, opt, device_type=device.type, **recipe.step_kw())
    stream = batches(data, recipe.batch_size, device, seed=cfg.seed + 1000 + rank)  # own data
    return model, step, stream, expected_num_params(gpt_cfg)


def allreduce_check(spec: dict, model, step, stream, device) -> dict:
    """R5's all-reduce gate on this rank, on the next batch of its stream
    (``perfladder.torch.parallel.allreduce``): its evidence, ``AllReduceGateError`` if not."""
    from perfladder.torch.model import GPT
    from perfladder.torch.parallel.allreduce import check_allreduce
    from perfladder.torch.recipe import Recipe
    from perfladder.torch.step import make_optimizer, make_step
    recipe = Recipe.from_dict(spec["recipe"])
    torch.manual_seed(spec["config"]["seed"])           # build's initial weights, unwrapped
    plain = GPT(model.config, **recipe.model_kw()).to(device)
    reference = make_step(plain, make_optimizer(plain, 1e-3), device_type=device.type,
                          bf16=recipe.bf16)
    precision = "bf16" if recipe.bf16 else "tf32" if device.type == "cuda" else "fp32"
    X, Y = next(stream)
    return check_allreduce(step, reference, X, Y, precision=precision).to_dict()


def worker(spec: dict, out: Path) -> None:
    """Run one rank (``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` set by torchrun)."""
    from perfladder.multigpu.measurement import settle_baseline
    from perfladder.torch.timer import throughput

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    backend = spec["backend"]
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend)
    try:
        torch.set_float32_matmul_precision("high")       # fp32 matmuls as TF32 on CUDA
        wrap = technique(spec.get("parallelize"))
        model, step, stream, num_params = build(spec, device, rank, wrap)
        world = dist.get_world_size()
        info = {"rank": rank, "local_rank": local, "world_size": world, "host": socket.gethostname(),
                "backend": backend, "parallel": spec["parallel"], "device": str(device),
                "parallelize": technique_name(wrap),
                "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "num_params": num_params, "init_digest": _digest(_flat_params(model))}
        if spec["bench_allreduce"] and world > 1:
            info["bus_bw"] = allreduce_bus_bw(num_params if not spec["check_steps"] else 1 << 16,
                                              device)
        if world > 1:
            info["batch_digests"] = distinct_batches(stream, world)
        if world > 1 and spec["parallel"] != "none":     # the control exchanges no gradients
            info["allreduce_gate"] = allreduce_check(spec, model, step, stream, device)
        if spec["check_steps"]:
            first = None
            for _ in range(spec["check_steps"]):
                X, Y = next(stream)
                first = _digest(X) if first is None else first
                step(X, Y)
            flat = _flat_params(model)
            torch.save(flat, out / f"params_rank{rank}.pt")
            info.update(first_batch_digest=first, params_digest=_digest(flat),
                        params_sum=float(flat.double().sum()))
        else:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            dist.barrier()                               # start the warm-up together

            def timed():
                # every rank times the same number of windows: a rank that stopped early
                # (its windows settled) would leave the others waiting in the all-reduce
                return throughput(step, stream, warmup=spec["warmup"], timed=spec["timed"],
                                  windows=spec["windows"], max_windows=spec["windows"],
                                  target_spread=spec["config"]["target_spread"])
            if spec.get("settle"):
                base = settle_baseline(timed, spec["config"]["target_spread"])
                info.update(tokens_per_s=base.tokens_per_s, windows=base.windows,
                            baseline=base.to_dict())
            else:
                tput = timed()
                info.update(tokens_per_s=tput.tokens_per_s, windows=tput.windows,
                            seconds=tput.seconds, tokens_per_window=tput.tokens_per_window,
                            batch_shape=list(tput.batch_shape), step_time_s=tput.step_time_s,
                            stable=tput.stable)
            info["peak_mem_bytes"] = (int(torch.cuda.max_memory_allocated(device))
                                      if device.type == "cuda" else None)
        (out / f"rank{rank}.json").write_text(json.dumps(info, indent=1))
        gathered = [None] * world
        dist.all_gather_object(gathered, info)
        if rank == 0:
            (out / "ranks.json").write_text(json.dumps(gathered, indent=1))
    finally:
        dist.destroy_process_group()
