"""Data parallelism (rung R5) in PyTorch: the launcher, the rank's spec, and the rank CLI.

    data_parallel_tokens(k, config, form, recipe)   # launch k ranks here, gather
    python -m perfladder.torch.parallel.launch --config full --form fast --out DIR   # one rank, under torchrun

A rank runs the ``perfladder.torch.recipe.Recipe`` it is handed (its ``to_dict()`` in the spec).
Which recipe a form means -- the seed form R0's, the fast form the configuration a ladder ended
on, or without a ladder the one the rung declarations walk to -- is resolved above this layer,
by the rungs (``perfladder.torch.rungs.recipes.recipe_for``), as is a hand-started rank's spec.

The rank itself lives in ``perfladder.torch.parallel.worker``; ``perfladder.torch.parallel.measure``
turns a launch into a ``perfladder.multigpu.measurement.DataParallelMeasurement`` (prediction first).
On several machines, start ``torchrun --nnodes N ... -m perfladder.torch.parallel.launch ...`` on each
(README, "Several machines"): the rank CLI builds the same spec from its arguments everywhere.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

from perfladder.checks import check_int
from perfladder.config import CONFIG_NAMES, LadderConfig
from perfladder.handed_on import handed_on
from perfladder.measure.evidence import Timing
from perfladder.measure.timing import settles
from perfladder.multigpu import measurement
from perfladder.multigpu.measurement import FORMS
from perfladder.outputs import work_folder
from perfladder.torch.model import EMBEDS
from perfladder.torch.parallel.worker import PARALLELS
from perfladder.torch.parallel.worker import parallelize as library_parallelize
from perfladder.torch.recipe import Recipe
from perfladder.torch.step import COMPILE_MODES, OPTIMIZERS

BACKENDS = ("nccl", "gloo")

# Keep NVLink multicast off in every process we start (it can take shared GPUs down).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


# -- recipes: what one rank runs ------------------------------------------------------------------
# A rank runs the step its Recipe describes, minus what is not launched under DDP / FSDP2 here:
# CUDA graphs and max-autotune (modes of their own, whose capture around the gradient hooks is
# not what this rung measures) and activation checkpointing (it buys memory a rank does not need).
NOT_CARRIED = ("checkpoint", "cudagraphs", "autotune")


def rank_recipe(recipe: Recipe) -> tuple[Recipe, list[str]]:
    """``recipe`` as a rank runs it, and the switches of ``NOT_CARRIED`` it had on (said)."""
    dropped = [k for k in NOT_CARRIED if getattr(recipe, k)]
    return recipe.replace(**{k: False for k in NOT_CARRIED}), dropped


# where a form's recipe is resolved, above this layer (named in the refusal of none)
RESOLVER = "perfladder.torch.rungs.recipes.recipe_for"


def given_recipe(form: str, recipe) -> Recipe:
    """The per-rank recipe a launch of ``form`` runs: ``recipe`` (a ``Recipe`` or its
    ``to_dict()``) as given. Which recipe a form means is read from the rung declarations, above
    this layer: resolve it there."""
    return measurement.given_recipe(form, recipe, Recipe.from_dict, RESOLVER)


def make_spec(config: LadderConfig, form: str, recipe, *, parallel: str = "ddp",
              backend: str = "gloo", warmup: int | None = None, timed: int | None = None,
              windows: int | None = None, settle: bool = False, check_steps: int = 0,
              bench_allreduce: bool = True, parallelize=None) -> dict:
    """Everything a rank needs, as plain JSON-able data: ``recipe`` (``given_recipe``) already
    resolved, so a rank reads no rung declarations. ``parallelize``: the function that wraps
    each rank's model (``worker.parallelize``'s signature); its source travels in the spec unless
    it is the library's own."""
    if parallel not in PARALLELS:
        raise ValueError(f"parallel={parallel!r} is not valid; valid choices: {PARALLELS}")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid; valid choices: {BACKENDS}")
    return {"config": config.to_dict(), "form": form,
            "recipe": given_recipe(form, recipe).to_dict(),
            "parallel": parallel, "backend": backend,
            "warmup": config.warmup if warmup is None else warmup,
            "timed": config.timed if timed is None else timed,
            "windows": config.windows if windows is None else windows,
            "settle": bool(settle), "check_steps": int(check_steps),
            "bench_allreduce": bool(bench_allreduce), "parallelize": shipped_source(parallelize)}


def shipped_source(fn) -> dict | None:
    """``{'name', 'source'}`` of a ``parallelize`` function for the ranks (None for the
    library's): they run in other processes, so the function goes as its source, which each
    rank compiles."""
    if fn is None or fn is library_parallelize:
        return None
    name = getattr(fn, "__name__", "")
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        source = None
    if not callable(fn) or not name.isidentifier() or source is None:
        raise ValueError(f"parallelize={fn!r} cannot be sent to the ranks: give a function "
                         "defined with def in a file or a notebook cell (its source is what they run)")
    return {"name": name, "source": source}


# -- the launcher ---------------------------------------------------------------------------------
def check_k(k: int, backend: str) -> None:
    """Refuse a process count the machine cannot back (clear error, no silent fallback)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid; valid choices: {BACKENDS}")
    check_int("k", k)
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


def launch(spec: dict, k: int, out_dir, timeout: float = 900.0) -> tuple[list[dict], Path]:
    """Run ``torchrun --standalone --nproc-per-node=k`` on the rank CLI, its files in ``out_dir``;
    ``(ranks, out_dir)``."""
    check_k(k, spec["backend"])
    out = Path(out_dir)
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


def summarize(ranks: list[dict], spec: dict) -> dict:
    """The ranks' rate together (weak scaling: each times its own tokens over the same steps).

    ``timing``: window by window, every rank's tokens over the slowest rank's seconds (every step
    waits for the all-reduce of all of them; ranks start their clocks apart, so a sum of each
    rank's own rate would credit a rank for time the others were still running), judged by the
    ladder's settle rule."""
    res = {"k": len(ranks), "ranks": ranks,
           "nodes": len({r.get("host") for r in ranks}),
           "num_params": ranks[0].get("num_params")}
    bws = [r["bus_bw"] for r in ranks if r.get("bus_bw")]
    res["bus_bw_measured"] = min(bws) if bws else None
    if all("seconds" in r for r in ranks):
        seconds = [max(s) for s in zip(*(r["seconds"] for r in ranks))]
        tokens = [sum(rate * s for rate, s in zip(rates, secs))     # each rank's rate x its seconds
                  for rates, secs in zip(zip(*(r["windows"] for r in ranks)), zip(*(r["seconds"] for r in ranks)))]
        windows = [n / s for n, s in zip(tokens, seconds)]
        target = spec["config"]["target_spread"]
        res["timing"] = Timing(windows=windows, seconds=seconds,
                               settled=len(windows), stable=settles(windows, target),
                               target_spread=target, steps_per_window=spec["timed"],
                               warmup=spec["warmup"], batch_shape=list(ranks[0]["batch_shape"]))
        res["windows"], res["tokens_per_s"] = windows, statistics.median(windows)
        res["spread"], res["stable"] = res["timing"].spread, res["timing"].stable
        res["step_time_s"] = res["timing"].step_time_s
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


def data_parallel_tokens(k: int, config: LadderConfig, form: str, recipe, *,
                         parallel: str = "ddp", backend: str | None = None,
                         warmup: int | None = None, timed: int | None = None,
                         windows: int | None = None, settle: bool = False, check_steps: int = 0,
                         bench_allreduce: bool = True, out_dir=None, timeout: float = 900.0,
                         parallelize=None) -> dict:
    """Launch ``k`` ranks of ``form`` running ``recipe`` (``given_recipe``) under ``parallel``
    ('ddp' | 'fsdp2' | 'none') and sum them.

    Returns ``{'k', 'nodes', 'ranks', 'num_params', 'bus_bw_measured', 'timing' (a ``Timing``),
    'tokens_per_s', 'windows', 'spread', 'stable', 'step_time_s', 'peak_mem_bytes_per_gpu',
    'peak_mem_bytes', 'spec', 'out_dir'}`` (``out_dir``: None without one, the ranks' files
    then removed once read; timing fields absent with ``check_steps``, and for
    a settled single-rank baseline, whose ``Baseline`` is in its rank's record).
    """
    backend = backend or default_backend()
    check_k(k, backend)
    spec = make_spec(config, form, recipe, parallel=parallel, backend=backend, warmup=warmup,
                     timed=timed, windows=windows, settle=settle, check_steps=check_steps,
                     bench_allreduce=bench_allreduce, parallelize=parallelize)
    with work_folder(out_dir, "perfladder_ddp_") as where:   # the ranks' logs, records, parameters
        ranks, _ = launch(spec, k, where, timeout)
    res = summarize(ranks, spec)
    if k > 1 and "windows" in res and all("seconds" in r for r in ranks):
        res["global_rate_checked"] = check_global_rate(res, spec)
    return {**res, "spec": spec, "out_dir": None if out_dir is None else str(out_dir),
            "backend": backend}


# -- the rank CLI -----------------------------------------------------------------------------------
def main(argv=None, *, spec_from_args) -> int:
    """One rank: its spec from ``--spec`` (a launcher's), or else from the other options by
    ``spec_from_args(args)`` (``perfladder.torch.rungs.recipes.spec_from_args``: the fast form's
    default is the rung declarations')."""
    from perfladder.torch.parallel.worker import worker
    p = argparse.ArgumentParser(prog="python -m perfladder.torch.parallel.launch",
                                description="one data-parallel rank of perfladder's R5 (run under torchrun)")
    p.add_argument("--out", required=True, help="folder for rank{r}.json and (rank 0) ranks.json")
    p.add_argument("--spec", help="spec.json written by the launcher (overrides the options below)")
    p.add_argument("--config", choices=CONFIG_NAMES, default="full")
    p.add_argument("--form", choices=FORMS, default="fast")
    p.add_argument("--parallel", choices=PARALLELS, default="ddp")
    p.add_argument("--backend", choices=BACKENDS, help="default: nccl with CUDA, gloo without")
    p.add_argument("--ladder", help="a PyTorch results JSON: the fast form is the configuration that "
                   "ladder ended on (default: the one the rung declarations walk to on this device)")
    p.add_argument("--batch", type=int, help="fast form's per-rank batch (default: the fast form's)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, help="fast form's AdamW (default: the fast form's)")
    p.add_argument("--embed", choices=EMBEDS, help="fast form's embedding (default: the fast form's)")
    p.add_argument("--mode", choices=[m for m in COMPILE_MODES if m],
                   help="fast form's torch.compile mode (default: the fast form's, as a rank runs it)")
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


# -- names whose home is the rungs' layer ---------------------------------------------------------
# They read the rung declarations, which sit above this layer; this module hands them on by name,
# imported at first use (no import of rungs/ here), so code importing them from here keeps working.
RECIPES = "perfladder.torch.rungs.recipes"
MOVED = ("fast_recipe", "recipe_for", "spec_from_args")

__getattr__ = handed_on(__name__, RECIPES, MOVED)


if __name__ == "__main__":
    # the rank CLI's public path (torchrun ... -m perfladder.torch.parallel.launch) runs the
    # rungs' entry, which hands ``main`` the spec resolution a rank started by hand needs
    sys.exit(importlib.import_module(RECIPES).main())
