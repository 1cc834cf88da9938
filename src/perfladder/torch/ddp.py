"""Data parallelism (rung R5): a DDP worker launched by ``torchrun``, and its launcher.

    python -m perfladder.torch.ddp --spec spec.json --out DIR      # one rank (under torchrun)
    ddp_tokens(k, config, backend='gloo')                          # launch k ranks, gather

Every rank builds the same GPT from the same seed, wraps it in
``DistributedDataParallel``, and streams *its own* batches (weak scaling: the global batch
is k times the per-rank batch). It times itself with ``perfladder.timing.measure`` and
writes ``rank{r}.json`` into the output folder; the launcher sums the per-rank rates.

The cost model (``cost_model_floor``) is evaluated *before* anything is launched.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BACKENDS = ("nccl", "gloo")

# Bus bandwidth the prediction is priced with, in NCCL's "busbw" convention (a ring
# allreduce of S bytes over k ranks moves 2(k-1)/k * S bytes through each rank's link).
# nccl: an H200 NVLink-4 link carries up to 450 GB/s each way; allreduce of a ~76 MB
# buffer without NVLink multicast (NVLS is kept off on our machines) reaches well below
# that. 200 GB/s is our stated, deliberately round assumption -- not a measurement; the
# worker also measures the bandwidth itself (``allreduce_bus_bw``) before its timed run,
# and the rung records both floors.
# gloo: CPU ranks exchanging through loopback TCP; ~1 GB/s, only ever used on CPU.
ASSUMED_BUS_BW = {"nccl": 200e9, "gloo": 1e9}

# Keep NVLink multicast off in every process we start (it can take shared GPUs down).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


# -- the cost model ------------------------------------------------------------------------------
def allreduce_seconds(num_params: int, k: int, bus_bw: float, bytes_per_param: int = 4) -> float:
    """Seconds for one ring allreduce of the fp32 gradients (4 bytes x N) at ``bus_bw``."""
    return 2 * (k - 1) / k * bytes_per_param * num_params / bus_bw


def cost_model_floor(k: int, batch_size: int, seq_len: int, t_compute: float,
                     num_params: int, bus_bw: float) -> dict:
    """No-overlap prediction: every step computes, then allreduces, serially.

    floor tokens/s = k * B * T / (t_compute + t_comm). DDP overlaps bucketed allreduces
    with the backward pass, so a measurement can land above this floor.
    """
    t_comm = allreduce_seconds(num_params, k, bus_bw)
    return {"k": k, "batch_per_rank": batch_size, "t_compute_s": t_compute, "t_comm_s": t_comm,
            "bus_bw": bus_bw, "floor_tokens_per_s": k * batch_size * seq_len / (t_compute + t_comm),
            "linear_tokens_per_s": k * batch_size * seq_len / t_compute}


# -- the launcher --------------------------------------------------------------------------------
def check_k(k: int, backend: str) -> None:
    """Refuse a process count the machine cannot back (clear error, no silent fallback)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid; valid choices: {BACKENDS}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k={k!r} must be a positive integer (number of processes)")
    if backend == "nccl":
        import torch
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if k > n:
            raise ValueError(f"k={k} ranks with backend 'nccl' need {k} CUDA devices, "
                             f"but {n} are present; choose k <= {n} or backend 'gloo' on CPU")


def ddp_tokens(k: int, config, backend: str | None = None, *, batch_size: int | None = None,
               compiled: bool = True, bf16: bool = True, warmup: int | None = None,
               timed: int | None = None, windows: int | None = None, check_steps: int = 0,
               bench_allreduce: bool = True, out_dir=None, timeout: float = 900.0) -> dict:
    """Launch ``torchrun --standalone --nproc-per-node=k`` on this module and gather the ranks.

    ``config`` is a ``LadderConfig``; the per-rank batch defaults to ``config.big_batch``
    and the step to the fast configuration (compiled, bf16). ``backend`` defaults to
    'nccl' with CUDA, 'gloo' without. ``check_steps > 0`` takes that many steps and writes
    every rank's parameters instead of timing (to test that DDP keeps ranks identical).

    Returns ``{'k', 'backend', 'tokens_per_s', 'windows', 'spread', 'peak_mem_bytes',
    'bus_bw_measured', 'ranks': [per-rank dicts], 'out_dir'}`` (timing fields absent in
    check mode).
    """
    import torch
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    check_k(k, backend)
    spec = {"config": config.to_dict(), "backend": backend,
            "batch_size": int(batch_size or config.big_batch), "compiled": bool(compiled),
            "bf16": bool(bf16), "warmup": config.warmup if warmup is None else warmup,
            "timed": config.timed if timed is None else timed,
            "windows": config.windows if windows is None else windows,
            "check_steps": int(check_steps), "bench_allreduce": bool(bench_allreduce)}
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="perfladder_ddp_"))
    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("rank*.json")) + list(out.glob("params_rank*.pt")):
        stale.unlink()
    (out / "spec.json").write_text(json.dumps(spec, indent=1))
    env = dict(os.environ)
    env.update(SAFE_ENV)
    src = str(Path(__file__).resolve().parents[2])             # .../src, so the ranks import us
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # `python -m torch.distributed.run` is exactly the `torchrun` console script
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={k}",
           "-m", "perfladder.torch.ddp", "--spec", str(out / "spec.json"), "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise RuntimeError(f"torchrun with k={k} ({backend}) failed with exit code "
                           f"{proc.returncode}; last output:\n{tail}")
    ranks = []
    for r in range(k):
        path = out / f"rank{r}.json"
        if not path.is_file():
            raise RuntimeError(f"rank {r} wrote no {path.name}; torchrun output:\n{proc.stderr[-2000:]}")
        ranks.append(json.loads(path.read_text()))
    res = {"k": k, "backend": backend, "batch_per_rank": spec["batch_size"],
           "compiled": spec["compiled"], "bf16": spec["bf16"], "ranks": ranks, "out_dir": str(out)}
    bws = [r["bus_bw"] for r in ranks if r.get("bus_bw")]
    res["bus_bw_measured"] = min(bws) if bws else None
    if not check_steps:
        # weak scaling: every rank times its own tokens over the same synchronised steps
        res["tokens_per_s"] = sum(r["tokens_per_s"] for r in ranks)
        res["windows"] = [sum(w) for w in zip(*(r["windows"] for r in ranks))]
        res["spread"] = (max(res["windows"]) - min(res["windows"])) / res["tokens_per_s"]
        res["step_time_s"] = max(r["step_time_s"] for r in ranks)
        res["stable"] = all(r.get("stable", True) for r in ranks)
        mems = [r["peak_mem_bytes"] for r in ranks if r.get("peak_mem_bytes") is not None]
        res["peak_mem_bytes"] = max(mems) if mems else None
    return res


# -- the worker (one rank) ---------------------------------------------------------------------------
def allreduce_bus_bw(numel: int, device, iters: int = 5, warmup: int = 2) -> float:
    """Measured allreduce bus bandwidth (bytes/s, busbw convention) for ``numel`` fp32 values."""
    import time

    import torch
    import torch.distributed as dist
    from .timer import sync
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


def _flat_params(model):
    import torch
    return torch.cat([p.detach().float().reshape(-1).cpu() for p in model.parameters()])


def worker(spec: dict, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..config import LadderConfig
    from ..data import TimeMachine
    from .model import GPT
    from .steps import make_optimizer, make_step
    from .stream import batches
    from .timer import throughput

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    backend = spec["backend"]
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend)
    try:
        torch.set_float32_matmul_precision("high")
        cfg = LadderConfig(**spec["config"])
        B = spec["batch_size"]
        data = TimeMachine(cfg.batch_size, cfg.num_steps, num_train=cfg.num_train, num_val=cfg.num_val)
        torch.manual_seed(cfg.seed)                  # identical initial weights on every rank
        model = GPT(cfg.gpt(vocab_size=len(data.vocab))).to(device)
        init_digest = _digest(_flat_params(model))
        ddp = DDP(model, device_ids=[local] if device.type == "cuda" else None)
        step = make_step(ddp, make_optimizer(ddp, cfg.lr), compiled=spec["compiled"],
                         bf16=spec["bf16"], device_type=device.type)
        stream = batches(data, B, device, seed=cfg.seed + 1000 + rank)   # each rank its own data
        info = {"rank": rank, "world_size": dist.get_world_size(), "backend": backend,
                "device": str(device), "init_digest": init_digest}
        if spec["bench_allreduce"]:
            info["bus_bw"] = allreduce_bus_bw(model.num_params() if not spec["check_steps"]
                                              else 1 << 16, device)
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
            # every rank must time the same number of windows: a rank that settled and stopped
            # would leave the others waiting in the step's all-reduce for ever
            tput = throughput(step, stream, warmup=spec["warmup"], timed=spec["timed"],
                              windows=spec["windows"], max_windows=spec["windows"],
                              target_spread=cfg.target_spread)
            info.update(tokens_per_s=tput.tokens_per_s, windows=tput.windows, stable=tput.stable,
                        step_time_s=tput.step_time_s,
                        peak_mem_bytes=int(torch.cuda.max_memory_allocated(device))
                        if device.type == "cuda" else None)
        (out / f"rank{rank}.json").write_text(json.dumps(info, indent=1))
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perfladder.torch.ddp",
                                description="one DDP rank of perfladder's R5 (run under torchrun)")
    p.add_argument("--spec", required=True, help="spec.json written by ddp_tokens()")
    p.add_argument("--out", required=True, help="folder for rank{r}.json")
    args = p.parse_args(argv)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        if key not in os.environ:
            p.error(f"${key} is not set: launch under torchrun, e.g. "
                    "torchrun --standalone --nproc-per-node=2 -m perfladder.torch.ddp ...")
    for key, value in SAFE_ENV.items():
        os.environ.setdefault(key, value)
    os.environ["TEARDOWN_CUPTI"] = "1"
    worker(json.loads(Path(args.spec).read_text()), Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
