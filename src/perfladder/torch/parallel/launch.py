"""Data parallelism (rung R5) in PyTorch: the launcher, the per-rank recipes, and the rank CLI.

    data_parallel_tokens(k, config, form='fast', recipe=...)   # launch k ranks here, gather
    python -m perfladder.torch.parallel.launch --config full --form fast --out DIR   # one rank, under torchrun

The rank itself lives in ``perfladder.torch.parallel.worker``; ``perfladder.torch.parallel.measure``
turns a launch into a ``perfladder.multigpu.measurement.DataParallelMeasurement`` (prediction first).
On several machines, start ``torchrun --nnodes N ... -m perfladder.torch.parallel.launch ...`` on each
(README, "Several machines"): the rank CLI builds the same spec from its arguments everywhere.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from perfladder.config import CONFIG_NAMES, LadderConfig, get_config
from perfladder.multigpu.measurement import FORMS, check_form
from perfladder.torch.parallel.worker import PARALLELS, RECIPE_KEYS

BACKENDS = ("nccl", "gloo")
FAST_BATCH_MULT = 4          # the fast form's per-rank batch: 4 x the ladder's big batch (2048 in full)

# Keep NVLink multicast off in every process we start (it can take shared GPUs down).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


# -- recipes: what one rank runs ------------------------------------------------------------------
def seed_recipe(config: LadderConfig) -> dict:
    """The seed's R5 per rank: eager, fp32 (TF32 on CUDA), batch 64, default AdamW, gather embedding."""
    return {"batch_size": config.batch_size, "compiled": False, "bf16": False,
            "optimizer": "default", "embed": "gather", "mode": None, "attn_backend": None,
            "fused": []}


def fast_recipe(config: LadderConfig, *, batch_size: int | None = None, optimizer: str = "fused",
                embed: str = "onehot", mode: str | None = None, attn_backend: str | None = None,
                compiled: bool = True, bf16: bool = True) -> dict:
    """The fastest single-GPU recipe per rank (compiled, bf16 autocast, fused AdamW, one-hot
    embedding, batch ``FAST_BATCH_MULT x big_batch``); every switch is an argument."""
    return normalize_recipe({"batch_size": batch_size or FAST_BATCH_MULT * config.big_batch,
                             "compiled": compiled, "bf16": bf16, "optimizer": optimizer,
                             "embed": embed, "mode": mode, "attn_backend": attn_backend})


def normalize_recipe(recipe) -> dict:
    """A recipe dict with exactly ``RECIPE_KEYS``, validated.

    Accepts a dict or an object with ``to_dict()`` (``perfladder.torch.rungs.beyond.Recipe``, whose
    ``cudagraphs`` / ``autotune`` switches are already folded into its ``mode``). A missing
    ``compiled`` / ``bf16`` means the fast form's True.
    """
    from perfladder.torch.model import check_attn_backend, check_embed
    from perfladder.torch.step import OPTIMIZERS, check_mode
    d = dict(recipe.to_dict() if hasattr(recipe, "to_dict") else recipe)
    folded = {"cudagraphs", "autotune", "checkpoint"} if "mode" in d else set()
    unknown = set(d) - set(RECIPE_KEYS) - folded
    if unknown:
        raise ValueError(f"unknown recipe keys {sorted(unknown)}; valid keys: {RECIPE_KEYS}")
    out = {"compiled": True, "bf16": True, "optimizer": "default", "embed": "gather", "mode": None,
           "attn_backend": None, "fused": []}
    out.update({k: v for k, v in d.items() if k in RECIPE_KEYS})
    b = out.get("batch_size")
    if not isinstance(b, int) or isinstance(b, bool) or b < 1:
        raise ValueError(f"batch_size={b!r} must be a positive integer")
    if out["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"optimizer={out['optimizer']!r} is not valid; valid choices: {OPTIMIZERS}")
    check_embed(out["embed"])
    check_attn_backend(out["attn_backend"])
    check_mode(out["mode"])
    if out["mode"] is not None and not out["compiled"]:
        raise ValueError(f"mode={out['mode']!r} needs compiled=True")
    return out


def recipe_for(config: LadderConfig, form: str, recipe=None) -> dict:
    """The per-rank recipe of ``form``: the seed's fixed one, or ``recipe`` (default ``fast_recipe``)."""
    if check_form(form) == "seed":
        seed = seed_recipe(config)
        if recipe is not None and normalize_recipe(recipe) != seed:
            raise ValueError("form='seed' is the seed chapter's fixed recipe; pass another "
                             "recipe only with form='fast'")
        return seed
    return fast_recipe(config) if recipe is None else normalize_recipe(recipe)


def make_spec(config: LadderConfig, form: str = "fast", recipe=None, *, parallel: str = "ddp",
              backend: str = "gloo", warmup: int | None = None, timed: int | None = None,
              windows: int | None = None, settle: bool = False, check_steps: int = 0,
              bench_allreduce: bool = True) -> dict:
    """Everything a rank needs, as plain JSON-able data."""
    if parallel not in PARALLELS:
        raise ValueError(f"parallel={parallel!r} is not valid; valid choices: {PARALLELS}")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid; valid choices: {BACKENDS}")
    return {"config": config.to_dict(), "form": form, "recipe": recipe_for(config, form, recipe),
            "parallel": parallel, "backend": backend,
            "warmup": config.warmup if warmup is None else warmup,
            "timed": config.timed if timed is None else timed,
            "windows": config.windows if windows is None else windows,
            "settle": bool(settle), "check_steps": int(check_steps),
            "bench_allreduce": bool(bench_allreduce)}


# -- the launcher ---------------------------------------------------------------------------------
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


def default_backend() -> str:
    import torch
    return "nccl" if torch.cuda.is_available() else "gloo"


def rank_env() -> dict:
    """The environment the ranks get: ours, NVLink multicast off, and this package importable."""
    env = dict(os.environ)
    env.update(SAFE_ENV)
    src = str(Path(__file__).resolve().parents[3])             # .../src
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def launch(spec: dict, k: int, out_dir=None, timeout: float = 900.0) -> tuple[list[dict], Path]:
    """Run ``torchrun --standalone --nproc-per-node=k`` on the rank CLI; ``(ranks, out_dir)``."""
    check_k(k, spec["backend"])
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="perfladder_ddp_"))
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("rank*.json"), *out.glob("params_rank*.pt"), out / "ranks.json"]:
        stale.unlink(missing_ok=True)
    (out / "spec.json").write_text(json.dumps(spec, indent=1))
    # `python -m torch.distributed.run` is exactly the `torchrun` console script
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={k}",
           "-m", "perfladder.torch.parallel.launch", "--spec", str(out / "spec.json"), "--out", str(out)]
    env = rank_env()
    # torchrun gives each of several ranks one intra-op CPU thread unless told otherwise; the
    # single-rank baseline gets the same, so the two differ only in the number of ranks
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    (out / "torchrun.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise RuntimeError(f"torchrun with k={k} ({spec['parallel']}, {spec['backend']}) failed "
                           f"with exit code {proc.returncode}; last output:\n{tail}")
    summary = out / "ranks.json"
    if not summary.is_file():
        raise RuntimeError(f"rank 0 wrote no {summary}; torchrun output:\n{proc.stderr[-2000:]}")
    return json.loads(summary.read_text()), out


def summarize(ranks: list[dict]) -> dict:
    """Sum the ranks' rates (weak scaling: each times its own tokens over the same steps)."""
    res = {"k": len(ranks), "ranks": ranks,
           "nodes": len({r.get("host") for r in ranks}),
           "num_params": ranks[0].get("num_params")}
    bws = [r["bus_bw"] for r in ranks if r.get("bus_bw")]
    res["bus_bw_measured"] = min(bws) if bws else None
    if all("tokens_per_s" in r for r in ranks):
        res["windows"] = [sum(w) for w in zip(*(r["windows"] for r in ranks))]
        res["tokens_per_s"] = sum(r["tokens_per_s"] for r in ranks)
        res["spread"] = (max(res["windows"]) - min(res["windows"])) / res["tokens_per_s"]
        res["step_time_s"] = max((r.get("step_time_s") or 0.0) for r in ranks) or None
        res["stable"] = all(r.get("stable", True) for r in ranks)
        res["peak_mem_bytes_per_gpu"] = [r.get("peak_mem_bytes") for r in ranks]
        mems = [m for m in res["peak_mem_bytes_per_gpu"] if m is not None]
        res["peak_mem_bytes"] = max(mems) if mems else None
    return res


def check_global_rate(res: dict, spec: dict) -> list[float]:
    """The summed rate of each window equals the global tokens -- k ranks x the spec's batch
    x T x steps per window, from the launch's shapes, not from the ranks' counts -- over the
    slowest rank's seconds (``perfladder.measure.counts.check_global_rate``)."""
    from perfladder.measure.counts import check_global_rate as check
    ranks = res["ranks"]
    total = len(ranks) * spec["recipe"]["batch_size"] * spec["config"]["num_steps"] * spec["timed"]
    return check(res["windows"], total, [r["seconds"] for r in ranks], what=f"{len(ranks)} ranks")


def data_parallel_tokens(k: int, config: LadderConfig, form: str = "fast", recipe=None, *,
                         parallel: str = "ddp", backend: str | None = None,
                         warmup: int | None = None, timed: int | None = None,
                         windows: int | None = None, settle: bool = False, check_steps: int = 0,
                         bench_allreduce: bool = True, out_dir=None, timeout: float = 900.0) -> dict:
    """Launch ``k`` ranks of ``form`` (``parallel`` 'ddp' | 'fsdp2' | 'none') and sum them.

    Returns ``{'k', 'nodes', 'ranks', 'num_params', 'bus_bw_measured', 'tokens_per_s',
    'windows', 'spread', 'step_time_s', 'peak_mem_bytes_per_gpu', 'peak_mem_bytes', 'spec',
    'out_dir'}`` (timing fields absent with ``check_steps``).
    """
    backend = backend or default_backend()
    check_k(k, backend)
    spec = make_spec(config, form, recipe, parallel=parallel, backend=backend, warmup=warmup,
                     timed=timed, windows=windows, settle=settle, check_steps=check_steps,
                     bench_allreduce=bench_allreduce)
    ranks, out = launch(spec, k, out_dir, timeout)
    res = summarize(ranks)
    if k > 1 and "windows" in res and all("seconds" in r for r in ranks):
        res["global_rate_checked"] = check_global_rate(res, spec)
    return {**res, "spec": spec, "out_dir": str(out), "backend": backend}


# -- the rank CLI -----------------------------------------------------------------------------------
def spec_from_args(args) -> dict:
    """The spec a rank started by hand (``torchrun ... -m perfladder.torch.parallel.launch --config ...``) runs."""
    config = get_config(args.config)
    recipe = None
    if args.form == "fast":
        recipe = fast_recipe(config, batch_size=args.batch, optimizer=args.optimizer,
                             embed=args.embed, mode=args.mode, compiled=not args.no_compile)
    elif args.batch is not None:
        raise SystemExit("--batch applies to --form fast; the seed form runs the config's batch")
    return make_spec(config, args.form, recipe, parallel=args.parallel,
                     backend=args.backend or default_backend(), warmup=args.warmup,
                     timed=args.timed, windows=args.windows)


def main(argv=None) -> int:
    from perfladder.torch.parallel.worker import worker
    p = argparse.ArgumentParser(prog="python -m perfladder.torch.parallel.launch",
                                description="one data-parallel rank of perfladder's R5 (run under torchrun)")
    p.add_argument("--out", required=True, help="folder for rank{r}.json and (rank 0) ranks.json")
    p.add_argument("--spec", help="spec.json written by the launcher (overrides the options below)")
    p.add_argument("--config", choices=CONFIG_NAMES, default="full")
    p.add_argument("--form", choices=FORMS, default="fast")
    p.add_argument("--parallel", choices=PARALLELS, default="ddp")
    p.add_argument("--backend", choices=BACKENDS, help="default: nccl with CUDA, gloo without")
    p.add_argument("--batch", type=int, help="fast form's per-rank batch (default 4 x big batch)")
    p.add_argument("--optimizer", default="fused", help="fast form's AdamW: default|fused|compiled")
    p.add_argument("--embed", default="onehot", help="fast form's embedding: gather|onehot")
    p.add_argument("--mode", default=None, help="fast form's torch.compile mode (default: default)")
    p.add_argument("--no-compile", action="store_true", help="fast form without torch.compile")
    p.add_argument("--warmup", type=int)
    p.add_argument("--timed", type=int)
    p.add_argument("--windows", type=int)
    args = p.parse_args(argv)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        if key not in os.environ:
            p.error(f"${key} is not set: launch under torchrun, e.g. "
                    "torchrun --standalone --nproc-per-node=2 -m perfladder.torch.parallel.launch ...")
    for key, value in SAFE_ENV.items():
        os.environ.setdefault(key, value)
    os.environ["TEARDOWN_CUPTI"] = "1"
    spec = json.loads(Path(args.spec).read_text()) if args.spec else spec_from_args(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    worker(spec, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
