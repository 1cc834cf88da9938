"""R5 in JAX across processes: one process per GPU (or per host), one global mesh, the same step.

    python -m perfladder.jax.parallel.launch --coordinator HOST:PORT --num-processes N \
        --process-id I --config full --form fast --out DIR                 # one process
    launch_local(2, config, 'fast', recipe)   # N processes on this machine (tests, benchmark)

Every process runs the same ``Recipe`` (``to_dict()`` in the spec), resolved before by the rungs
(``perfladder.jax.rungs.recipes``: ``recipe_for``; ``spec_from_args`` for a process started by hand).

Every process calls ``jax.distributed.initialize(coordinator, num_processes, process_id)``,
after which ``jax.devices()`` lists the devices of *all* processes and one mesh spans them.
Each process lays out the state for its own devices (``make_array_from_callback``: every
process holds the same initial weights, from the same seed) and feeds its own devices their
own batches (``make_array_from_single_device_arrays``): no process ever holds the global
batch. The jitted step is the single-device one; XLA inserts the cross-process all-reduce.
On CPU the processes exchange through JAX's CPU collectives (gloo).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from perfladder.checks import check_int
from perfladder.outputs import work_folder

ENV_SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def initialize(coordinator: str, num_processes: int, process_id: int, local_device_ids=None) -> None:
    """``jax.distributed.initialize``; on a machine without a GPU, CPU collectives over gloo."""
    import jax
    check_int("num_processes", num_processes)
    if check_int("process_id", process_id, 0) >= num_processes:
        raise ValueError(f"process_id={process_id} must be in 0..{num_processes - 1} "
                         f"(num_processes={num_processes})")
    if ":" not in coordinator:
        raise ValueError(f"coordinator={coordinator!r} must be HOST:PORT")
    if os.environ.get("JAX_PLATFORMS", "").startswith("cpu") or not _gpu_visible():
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids)


def _gpu_visible() -> bool:
    import shutil
    return shutil.which("nvidia-smi") is not None and os.environ.get("CUDA_VISIBLE_DEVICES") != ""


def global_mesh():
    """A 1-D ``('data',)`` mesh over every process's devices."""
    import jax

    from perfladder.jax.parallel.layout import make_data_mesh
    return make_data_mesh(jax.device_count())


def place_state_global(mesh, *nodes, fsdp: bool = False) -> None:
    """``parallel.place_state`` for a mesh spanning processes: each process fills only the
    shards of its own devices, from its (identical) host copy of every array."""
    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from perfladder.jax.parallel.layout import fsdp_spec
    k = mesh.devices.size

    def put(x):
        if not hasattr(x, "shape"):
            return x
        host = np.asarray(x)
        spec = fsdp_spec(x.shape, k) if fsdp else P()
        return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda idx: host[idx])

    for node in nodes:
        nnx.update(node, jax.tree.map(put, nnx.state(node)))


def local_batches(data, per_device_batch: int, mesh, seed: int):
    """Global ``(X, Y)`` batches of shape ``(devices x per_device_batch, T)``, sharded on
    ``'data'``, each local device gathering its own rows from its own copy of the split."""
    from functools import partial

    import jax

    from perfladder.data import check_batch_size
    from perfladder.jax.parallel.layout import batch_sharding
    from perfladder.jax.stream import Batches, _gather
    sharding = batch_sharding(mesh)
    X_all, Y_all = data.train_arrays()
    per_epoch = check_batch_size(per_device_batch, len(X_all))
    shape = (mesh.devices.size * per_device_batch, X_all.shape[1])      # the global batch
    gather = partial(_gather, batch_size=per_device_batch)
    streams = []
    for d in mesh.devices.flat:
        if d.process_index == jax.process_index():   # committed to d: each gather runs on d
            Xd, Yd = jax.device_put(X_all, d), jax.device_put(Y_all, d)
            streams.append(Batches(Xd, Yd, gather, per_epoch, per_device_batch, seed + 7919 * d.id))
    while True:
        pairs = [next(s) for s in streams]                        # one (B, T) pair per local device
        yield (jax.make_array_from_single_device_arrays(shape, sharding, [x for x, _ in pairs]),
               jax.make_array_from_single_device_arrays(shape, sharding, [y for _, y in pairs]))


def mem_to_kib(mems):
    """Byte counts (None: unknown) as int32 KiB, rounded up, -1 for unknown: ``process_allgather``
    moves 32-bit numbers (no x64), where a 35.8 GB peak in bytes would wrap; KiB fit 2 TiB."""
    import numpy as np
    return np.asarray([-1 if m is None or m < 0 else -(-int(m) // 1024) for m in mems], np.int32)


def kib_to_bytes(kib) -> list:
    """``mem_to_kib``'s inverse (to the KiB), flattened over processes; -1 -> None."""
    import numpy as np
    return [None if k < 0 else 1024 * int(k) for k in np.asarray(kib).reshape(-1)]


def run(spec: dict, out: Path) -> dict:
    """One process's measurement (after ``initialize``); process 0 writes ``processes.json``."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from perfladder.config import LadderConfig
    from perfladder.jax.checks import distinct_devices
    from perfladder.jax.parallel.allreduce import allreduce_at_start
    from perfladder.jax.parallel.layout import allreduce_bus_bw, peak_mem_bytes
    from perfladder.jax.parallel.measure import Replica, corpus, num_params
    from perfladder.jax.recipe import Recipe
    from perfladder.jax.timer import throughput
    from perfladder.measure.counts import check_global_rate
    from perfladder.measure.evidence import Timing

    cfg, recipe = LadderConfig(**spec["config"]), Recipe.from_dict(spec["recipe"])
    mesh = global_mesh()
    data = corpus(cfg)
    n = num_params(cfg, len(data.vocab))
    first = Recipe.from_dict(spec.get("check_recipe") or spec["recipe"])    # checked first, here
    checked = _check(spec, Replica(cfg, first, len(data.vocab)), mesh, data) if spec.get("check_steps") else None
    rep = Replica(cfg, recipe, len(data.vocab))
    place_state_global(mesh, rep.model, rep.optimizer, fsdp=spec.get("fsdp", False))
    k = mesh.devices.size
    stream = local_batches(data, recipe.batch_size, mesh, seed=cfg.seed + 300)
    digests = distinct_devices(next(stream)[0]) if k > 1 else []
    reduced = allreduce_at_start(rep, *next(stream)) if k > 1 else []
    bw = allreduce_bus_bw(mesh, n) if k > 1 else 0.0
    # every process times the same number of windows: one that stopped early (its windows
    # settled) would leave the others waiting in the step's all-reduce
    t = throughput(rep.step, stream, warmup=spec["warmup"], timed=spec["timed"],
                   windows=spec["windows"], max_windows=spec["windows"],
                   target_spread=cfg.target_spread)
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    mems = peak_mem_bytes(local)
    mine = {"process_id": jax.process_index(), "host": socket.gethostname(),
            "local_devices": [str(d) for d in local], "tokens_per_s": t.tokens_per_s,
            "windows": t.windows, "seconds": t.seconds, "bus_bw": bw, "peak_mem_bytes": mems}
    # every process times the same global steps; gather their numbers for process 0
    gathered = multihost_utils.process_allgather(
        {"windows": np.asarray(t.windows), "seconds": np.asarray(t.seconds), "bw": np.asarray(bw),
         "mem_kib": mem_to_kib(mems)})
    if k > 1:      # the global batch is k x B rows of T tokens, every process timing all of it
        check_global_rate(t.windows, k * recipe.batch_size * cfg.num_steps * spec["timed"],
                          gathered["seconds"].tolist(), what=f"{jax.process_count()} processes")
    summary = {"k": k, "num_processes": jax.process_count(), "num_params": n, "spec": spec,
               "timing": Timing.of(t).to_dict(),          # process 0's: the global steps it timed
               "allreduce_gate": reduced,
               "windows_per_process": gathered["windows"].tolist(),
               "seconds_per_process": gathered["seconds"].tolist(), "device_batch_digests": digests,
               "bus_bw_per_process": gathered["bw"].tolist(),
               "peak_mem_bytes_per_gpu": kib_to_bytes(gathered["mem_kib"]),
               "device": jax.devices()[0].device_kind, "check": checked,
               "memory_stats_process0": {k: int(v) for k, v in
                                         (local[0].memory_stats() or {}).items()}}
    (out / f"process{jax.process_index()}.json").write_text(json.dumps(mine, indent=1))
    if jax.process_index() == 0:
        (out / "processes.json").write_text(json.dumps(summary, indent=1))
    return summary


def _check(spec: dict, rep, mesh, data) -> dict:
    """``check_steps`` steps of ``rep`` on fixed global batches (``fixed_global_batches``),
    each process handing its devices their rows; the losses (replicated, so every process
    reads the same) must match one device running the whole global batch."""
    import jax

    from perfladder.jax.parallel.allreduce import allreduce_at_start
    from perfladder.jax.parallel.layout import batch_sharding
    from perfladder.jax.parallel.measure import fixed_global_batches
    sharding = batch_sharding(mesh)
    place_state_global(mesh, rep.model, rep.optimizer, fsdp=spec.get("fsdp", False))
    k, B = mesh.devices.size, rep.recipe.batch_size
    losses, reduced = [], []
    for X, Y in fixed_global_batches(data, k * B, spec["check_steps"]):      # (k*B, T) numpy each
        Xg = jax.make_array_from_callback(X.shape, sharding, lambda idx, X=X: X[idx])
        Yg = jax.make_array_from_callback(Y.shape, sharding, lambda idx, Y=Y: Y[idx])
        if k > 1 and not losses:              # before the first step: the initial weights
            reduced = allreduce_at_start(rep, Xg, Yg)
        losses.append(float(rep.step(Xg, Yg)))
    return {"k": k, "num_processes": jax.process_count(), "losses": losses,
            "recipe": rep.recipe.to_dict(), "allreduce_gate": reduced}


# -- launching N processes on this machine ---------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_spec(config, form: str, recipe, *, fsdp: bool = False, warmup: int | None = None,
              timed: int | None = None, windows: int | None = None, check_steps: int = 0,
              check_recipe=None) -> dict:
    """Everything a process needs, as plain JSON-able data: ``recipe`` (``measure.given_recipe``)
    and ``check_recipe`` (None: none) already resolved, so a process reads no rung declarations."""
    from perfladder.jax.parallel.measure import given_recipe
    if check_recipe is not None:
        check_recipe = given_recipe(form, check_recipe)
    return {"config": config.to_dict(), "form": form,
            "recipe": given_recipe(form, recipe).to_dict(), "fsdp": bool(fsdp),
            "warmup": config.warmup if warmup is None else warmup,
            "timed": config.timed if timed is None else timed,
            "windows": config.windows if windows is None else windows,
            "check_steps": int(check_steps),
            "check_recipe": check_recipe and check_recipe.to_dict()}


def launch_local(num_processes: int, config, form: str, recipe, *,
                 fsdp: bool = False, warmup: int | None = None, timed: int | None = None,
                 windows: int | None = None, gpus: int = 0, check_steps: int = 0,
                 check_recipe=None, out_dir=None, timeout: float = 900.0) -> dict:
    """Start ``num_processes`` OS processes of this module here (coordinator on localhost), each
    running ``recipe`` of ``form``, and return process 0's summary. ``gpus > 0``: process i uses
    local GPU i (so ``num_processes <= gpus``); ``gpus = 0``: CPU processes, one CPU device each.
    ``check_steps``: that many steps of ``check_recipe`` (None: ``recipe``) checked first (the
    summary's ``check``; the peak memory recorded then includes the check's: a test's launch,
    not a GPU measurement)."""
    check_int("num_processes", num_processes)
    if gpus and num_processes > gpus:
        raise ValueError(f"num_processes={num_processes} needs {num_processes} GPUs, {gpus} given; "
                         f"valid choices: 1..{gpus}")
    spec = make_spec(config, form, recipe, fsdp=fsdp, warmup=warmup, timed=timed, windows=windows,
                     check_steps=check_steps, check_recipe=check_recipe)
    with work_folder(out_dir, "perfladder_jaxdist_") as out:    # the processes' logs, records
        summary = _run_processes(out, spec, num_processes, gpus, timeout)
    return {**summary, "out_dir": None if out_dir is None else str(out)}


def _run_processes(out: Path, spec: dict, num_processes: int, gpus: int, timeout: float) -> dict:
    """Start the processes of ``launch_local`` with their files in ``out``; process 0's summary."""
    for stale in [*out.glob("process*.json")]:
        stale.unlink()
    (out / "spec.json").write_text(json.dumps(spec, indent=1))
    env = {**os.environ, **ENV_SAFE}
    src = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if not gpus:
        env["JAX_PLATFORMS"] = "cpu"
    coordinator = f"127.0.0.1:{free_port()}"
    procs = []
    for i in range(num_processes):
        cmd = [sys.executable, "-m", "perfladder.jax.parallel.launch", "--coordinator", coordinator,
               "--num-processes", str(num_processes), "--process-id", str(i),
               "--spec", str(out / "spec.json"), "--out", str(out)]
        if gpus:
            cmd += ["--local-device-ids", str(i)]
        log = open(out / f"process{i}.log", "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failed = []
    for i, (p, log) in enumerate(procs):
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        log.close()
        if rc != 0:
            failed.append((i, rc))
    if failed:
        tails = "\n".join(f"--- process {i} (exit {rc}):\n" + (out / f"process{i}.log").read_text()[-2000:]
                          for i, rc in failed)
        raise RuntimeError(f"jax.distributed with {num_processes} processes failed:\n{tails}")
    return json.loads((out / "processes.json").read_text())


def measure_distributed(num_processes: int, config, form: str, recipe, *,
                        baseline=None, link: str | None = None, fsdp: bool = False, gpus: int = 0,
                        warmup: int | None = None, timed: int | None = None,
                        windows: int | None = None, check_steps: int = 0, check_recipe=None,
                        out_dir=None, timeout: float = 900.0):
    """``launch_local`` as a ``DataParallelMeasurement``: predict (printed), launch, record.
    ``recipe``: resolved for the children's devices (``recipe_for(..., on_gpu=bool(gpus))``).

    ``baseline``: the single-device ``perfladder.multigpu.measurement.Baseline`` of the same form (from
    ``perfladder.jax.parallel.measure.measure_baseline``, measured in *another* process: this one
    must leave the GPUs to its children -- on a GPU, call this from a process whose jax has
    not started its GPU backend, which would hold most of the memory); None gives no
    prediction and no efficiency.
    A failed launch is recorded as ``status='failed'`` with the processes' last output.
    """
    from perfladder.data import TimeMachine
    from perfladder.jax.parallel.measure import given_recipe, num_params
    from perfladder.measure.counts import check_global_rate
    from perfladder.measure.evidence import Timing
    from perfladder.multigpu import costmodel
    from perfladder.multigpu.measurement import not_measured, record
    recipe = given_recipe(form, recipe)
    B, T = recipe.batch_size, config.num_steps
    k = num_processes                      # one device per process here
    vocab = len(TimeMachine(config.batch_size, T, num_train=config.num_train,
                            num_val=config.num_val).vocab)
    pred = None
    if baseline is not None:
        pred = costmodel.predict(k, B, T, baseline.tokens_per_s, num_params(config, vocab),
                                 link or costmodel.machine_link(gpus))
        costmodel.announce([pred], label=f"R5 jax jax.distributed {form}")
    try:
        s = launch_local(num_processes, config, form, recipe, fsdp=fsdp, warmup=warmup,
                         timed=timed, windows=windows, gpus=gpus, check_steps=check_steps,
                         check_recipe=check_recipe, out_dir=out_dir, timeout=timeout)
    except (RuntimeError, subprocess.SubprocessError) as e:
        return not_measured(status="failed", reason=str(e)[-3000:], framework="jax",
                            mechanism="jax.distributed", form=form, k=k, per_rank_batch=B,
                            seq_len=T, processes=num_processes, recipe=recipe.to_dict(),
                            prediction=None if pred is None else pred.to_dict())
    notes = [f"{num_processes} OS processes, one device each, joined by jax.distributed; every "
             "process times the same global steps (windows: process 0's; all in ranks)",
             f"state {'sharded (FSDP)' if fsdp else 'replicated'}; each process feeds its own "
             "devices their own batches"]
    ranks = [{"process_id": i, "windows": w, "seconds": sec, "bus_bw": b}
             for i, (w, sec, b) in enumerate(zip(s["windows_per_process"], s["seconds_per_process"],
                                                 s["bus_bw_per_process"]))]
    ranks[0]["memory_stats"] = s.get("memory_stats_process0")
    bws = [b for b in s["bus_bw_per_process"] if b]
    # the rate recorded, once combined: the launch's global tokens / the slowest process's seconds
    timing = Timing.from_dict(s["timing"])
    check_global_rate(timing.windows, k * B * T * (config.timed if timed is None else timed),
                      s["seconds_per_process"], what=f"{num_processes} processes' combined rate")
    return record(framework="jax", mechanism="jax.distributed", form=form, k=s["k"],
                  per_rank_batch=B, seq_len=T, timing=timing,
                  baseline=baseline, prediction=pred, bus_bw_measured=min(bws) if bws else None,
                  peak_mem_bytes_per_gpu=s["peak_mem_bytes_per_gpu"], recipe=recipe.to_dict(),
                  processes=s["num_processes"], device=s["device"], notes=notes, ranks=ranks)


def main(argv=None, *, spec_from_args) -> int:
    """One process: its spec from ``--spec`` (``launch_local``'s), or else from the options by
    ``spec_from_args(args)`` (``perfladder.jax.rungs.recipes``': the declarations' defaults)."""
    from perfladder.config import CONFIG_NAMES
    from perfladder.multigpu.measurement import FORMS
    p = argparse.ArgumentParser(prog="python -m perfladder.jax.parallel.launch",
                                description="one process of perfladder's multi-process JAX R5")
    p.add_argument("--coordinator", required=True, help="HOST:PORT of process 0")
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--local-device-ids", help="comma-separated GPU ids this process uses (default: all)")
    p.add_argument("--out", required=True, help="folder for process{i}.json and processes.json")
    p.add_argument("--spec", help="spec.json written by launch_local (overrides the options below)")
    p.add_argument("--config", choices=CONFIG_NAMES, default="full")
    p.add_argument("--form", choices=FORMS, default="fast")
    p.add_argument("--ladder", help="a JAX results JSON: the fast form is the configuration that "
                   "ladder ended on (default: the one the rung declarations walk to on this device)")
    p.add_argument("--batch", type=int, help="fast form's per-device batch (default: the fast form's)")
    p.add_argument("--fsdp", action="store_true", help="shard parameters and optimizer state too")
    p.add_argument("--warmup", type=int)
    p.add_argument("--timed", type=int)
    p.add_argument("--windows", type=int)
    args = p.parse_args(argv)
    if args.form == "seed" and (args.ladder or args.batch is not None):
        p.error(f"--{'ladder' if args.ladder else 'batch'} applies to --form fast; the seed form "
                "runs the seed's recipe at the config's batch")
    for key, value in ENV_SAFE.items():
        os.environ.setdefault(key, value)
    ids = None if not args.local_device_ids else [int(i) for i in args.local_device_ids.split(",")]
    initialize(args.coordinator, args.num_processes, args.process_id, ids)
    spec = json.loads(Path(args.spec).read_text()) if args.spec else spec_from_args(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = run(spec, out)
    if args.process_id == 0:
        print(f"jax.distributed: {summary['num_processes']} processes, {summary['k']} devices, "
              f"tokens/s per window {summary['windows_per_process'][0]}", flush=True)
    import jax
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    # this command's path runs the rungs' entry, which hands ``main`` the spec resolution a process
    # started by hand needs (the rung declarations sit above this layer: named here, not imported)
    from perfladder.jax.parallel.measure import RECIPES
    sys.exit(importlib.import_module(RECIPES).main())
