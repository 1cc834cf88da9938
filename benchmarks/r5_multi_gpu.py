"""R5 on this machine: data parallelism over every visible GPU, both forms, both frameworks.

    python benchmarks/r5_multi_gpu.py --config full --out benchmarks/results/h200x2-r5
    python benchmarks/r5_multi_gpu.py --config smoke --out /tmp/r5 --no-compile     # CPU

For each framework and form (seed: the seed's step at batch 64 per device; fast: the
configuration the rung declarations walk to, per device: ``fast_recipe`` of each framework's
``rungs.recipes``) it measures the single-device baseline (settled: re-measured once if its
windows did not settle, by the ladder's rule and the config's target_spread), prints the cost
model's prediction, and only then launches k = all visible GPUs (and k = 2 when there are more). Stages, each its own
process, in order of importance (a stage that would overrun ``--budget`` records skips):

    torch        baselines, then DDP for both forms         (torchrun per launch)
    jax          baselines, then the one-process mesh for both forms, and its FSDP layout
    jax-dist     the fast form with one process per GPU, joined by jax.distributed
    torch-fsdp2  the fast form under FSDP2 (fully_shard)
    torch-control  the fast form on k GPUs at once with no gradient exchange (independent
                 copies of the single-GPU step): what running k GPUs together costs by itself

On a machine without a GPU the same stages run on CPU (gloo ranks, forced host devices):
that exercises every path; its numbers are not performance results. Everything lands in
``--out``: ``r5.json`` (hardware from nvidia-smi, versions, the command, the creation time,
every measurement), ``r5_<stage>.json`` and ``r5_<stage>.log`` per stage, and the ranks' own
files under ``runs/``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

STAGES = ("torch", "jax", "jax-dist", "torch-fsdp2", "torch-control")
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
# warmup, timed steps, windows per form: about a second per window on an H200, enough past compile
TIMING = {"full": {"seed": (10, 40, 3), "fast": (5, 10, 3)},
          "smoke": {"seed": (1, 2, 2), "fast": (1, 2, 2)}}


# -- the machine ---------------------------------------------------------------------------------
def hardware() -> dict:
    from perfladder.hardware import nvidia_smi
    gpus = nvidia_smi("--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader")
    return {"gpus": gpus.splitlines() if gpus else [], "topology": nvidia_smi("topo", "-m"),
            "cpu_count": os.cpu_count()}


def detect_link(hw: dict) -> str:
    """The costmodel link this box is priced with (``costmodel.machine_link`` on its GPUs and
    their ``nvidia-smi topo -m`` matrix)."""
    from perfladder.multigpu import costmodel
    return costmodel.machine_link(len(hw["gpus"]), hw["topology"] or "")


def stage_file(out: Path, stage: str, ext: str) -> Path:
    """``r5_<stage>.<ext>``: never ``torch.json`` / ``jax.json``, the names of ladder results."""
    return out / f"r5_{stage}.{ext}"


# -- one stage (its own process) --------------------------------------------------------------------
class Stage:
    """Runs measurements in order, writing ``<stage>.json`` after each, skipping past the deadline."""

    def __init__(self, args, name: str):
        self.args, self.name = args, name
        self.out = Path(args.out)
        self.path = stage_file(self.out, name, "json")
        self.doc = {"stage": name, "measurements": [], "baselines": {}, "versions": {}}

    def save(self):
        self.path.write_text(json.dumps(self.doc, indent=1))

    def timing(self, form: str) -> dict:
        w, t, n = TIMING[self.args.config][form]
        return {"warmup": w, "timed": t, "windows": n}

    def time_left(self) -> float:
        return self.args.deadline - time.time()

    def run(self, what: str, fn, skip):
        """``fn()`` -> a DataParallelMeasurement (or Baseline for 'baseline ...'); too late -> ``skip(reason)``."""
        if self.time_left() < 20:
            m = skip(f"not run: the time budget (--budget) ran out before {what}")
        else:
            t0 = time.time()
            print(f"== {self.name}: {what}", flush=True)
            try:
                m = fn()
            except Exception as e:          # recorded, and the stage goes on to the next one
                import traceback
                traceback.print_exc()
                m = skip(f"{type(e).__name__}: {str(e)[-2000:]}")
                m.status = "failed"
            print(f"   {what}: {time.time() - t0:.0f}s", flush=True)
        self.doc["measurements"].append(m.to_dict())
        print("  ", m.line(), flush=True)
        self.save()
        return m

    def baseline(self, key: str, fn):
        from perfladder.multigpu.measurement import Baseline
        if key in self.doc["baselines"]:
            return Baseline.from_dict(self.doc["baselines"][key])
        print(f"== {self.name}: baseline {key}", flush=True)
        b = fn()
        self.doc["baselines"][key] = b.to_dict()
        print(f"   baseline {key}: {b.tokens_per_s:,.0f} tokens/s, spread {100 * b.spread:.1f}%, "
              f"{'settled' if b.settled else 'NOT settled'} after {len(b.attempts)} attempt(s)", flush=True)
        self.save()
        return b


def earlier_baseline(args, stage: str, key: str):
    from perfladder.multigpu.measurement import Baseline
    path = stage_file(Path(args.out), stage, "json")
    if not path.is_file() or key not in json.loads(path.read_text())["baselines"]:
        return None
    return Baseline.from_dict(json.loads(path.read_text())["baselines"][key])


def stage_torch(args, s: Stage, only: str | None = None) -> None:
    from perfladder.config import get_config
    from perfladder.multigpu.measurement import not_measured
    from perfladder.torch.device import versions
    from perfladder.torch.parallel import measure as dp
    from perfladder.torch.rungs.recipes import fast_recipe, recipe_for
    cfg = get_config(args.config)
    s.doc["versions"] = versions()
    forms = ["fast"] if only else args.forms
    for form in forms:
        fast = fast_recipe(cfg)
        recipe = recipe_for(cfg, form, (fast.replace(compiled=False) if args.no_compile else fast)
                            if form == "fast" else None)
        timing = s.timing(form)
        runs = s.out / "runs" / s.name / form
        base = (earlier_baseline(args, "torch", form) if only else None) or s.baseline(
            form, lambda: dp.measure_baseline(cfg, form, recipe, out_dir=runs / "k1",
                                       timeout=max(30.0, s.time_left()), **timing))
        pairs = [(only, max(args.ks))] if only else [("ddp", k) for k in args.ks]
        for parallel, k in pairs:
            def skip(reason, parallel=parallel, k=k):
                return not_measured(status="skipped", reason=reason, framework="torch",
                                    mechanism=dp.MECHANISM[parallel], form=form, k=k,
                                    per_rank_batch=recipe.batch_size, seq_len=cfg.num_steps)
            s.run(f"{parallel} {form} k={k}", lambda parallel=parallel, k=k: dp.measure(
                k, cfg, form, recipe, parallel=parallel, baseline=base, link=args.link,
                out_dir=runs / f"{parallel}-k{k}", timeout=max(30.0, s.time_left()), **timing),
                skip)


def stage_jax(args, s: Stage) -> None:
    from perfladder.config import get_config
    from perfladder.jax.device import versions
    from perfladder.jax.parallel import measure as dp
    from perfladder.jax.rungs.recipes import recipe_for
    cfg = get_config(args.config)
    s.doc["versions"] = versions()
    for form in args.forms:
        recipe = recipe_for(cfg, form)
        s.doc.setdefault("recipes", {})[form] = recipe.to_dict()
        timing = s.timing(form)
        base = s.baseline(form, lambda: dp.measure_baseline(cfg, form, recipe, **timing))
        layouts = [(k, False) for k in args.ks] + ([(max(args.ks), True)] if form == "fast" else [])
        for k, fsdp in layouts:
            s.run(f"mesh{'-fsdp' if fsdp else ''} {form} k={k}",
                  lambda k=k, fsdp=fsdp: dp.measure_mesh(k, cfg, form, recipe, fsdp=fsdp,
                                                         baseline=base, link=args.link, **timing),
                  lambda reason, k=k, fsdp=fsdp: dp.skipped_mesh(k, cfg, form, reason, recipe, fsdp))


def stage_jax_dist(args, s: Stage) -> None:
    # this process must leave the GPUs to its children: no jax backend is started here
    import flax
    import jax
    import jaxlib
    import optax

    from perfladder.config import get_config
    from perfladder.jax.parallel.launch import measure_distributed
    from perfladder.multigpu.measurement import not_measured
    from perfladder.results.record import python_versions
    cfg = get_config(args.config)
    s.doc["versions"] = python_versions(jax=jax, jaxlib=jaxlib, flax=flax, optax=optax)
    jax_path = stage_file(s.out, "jax", "json")
    jax_doc = json.loads(jax_path.read_text()) if jax_path.is_file() else {}
    for form in ["fast"] + (["seed"] if "seed" in args.forms and args.dist_seed else []):
        if form not in args.forms:
            continue
        k = max(args.ks)
        recipe = jax_doc.get("recipes", {}).get(form)      # resolved there (e.g. cuDNN on a GPU)
        base = earlier_baseline(args, "jax", form)

        def skip(reason, form=form, k=k):
            return not_measured(status="skipped", reason=reason, framework="jax",
                                mechanism="jax.distributed", form=form, k=k,
                                per_rank_batch=(recipe or {}).get("batch_size", 0) or 1,
                                seq_len=cfg.num_steps)
        if recipe is None:
            s.run(f"jax.distributed {form}", lambda: skip("the jax stage did not resolve the recipe"), skip)
            continue
        s.run(f"jax.distributed {form} k={k}", lambda form=form, k=k, recipe=recipe, base=base:
              measure_distributed(k, cfg, form, recipe, baseline=base, link=args.link,
                                  gpus=args.gpus, out_dir=s.out / "runs" / s.name / form,
                                  timeout=max(30.0, s.time_left()), **s.timing(form)), skip)


def run_stage(args) -> int:
    s = Stage(args, args.stage)
    {"torch": stage_torch, "jax": stage_jax, "jax-dist": stage_jax_dist,
     "torch-fsdp2": lambda a, st: stage_torch(a, st, only="fsdp2"),
     "torch-control": lambda a, st: stage_torch(a, st, only="none")}[args.stage](args, s)
    s.save()
    return 0


# -- the orchestrator ---------------------------------------------------------------------------------
def stage_env(args, stage: str) -> dict:
    env = {**os.environ, **SAFE_ENV, "PYTHONUNBUFFERED": "1"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if not args.gpus and stage in ("jax", "jax-dist"):
        env["JAX_PLATFORMS"] = "cpu"
        # smoke only: cheap XLA compiles; the mesh stage also needs k host devices
        flags = "--xla_backend_optimization_level=0"
        if stage == "jax":
            flags += f" --xla_force_host_platform_device_count={max(args.ks)}"
        env["XLA_FLAGS"] = flags
    return env


def orchestrate(args, argv) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hw = hardware()
    link = args.link or detect_link(hw)
    print(f"R5: {len(hw['gpus'])} GPU(s), k = {args.ks}, forms {args.forms}, link priced as "
          f"{link!r}, config {args.config}, budget {args.budget:.0f}s", flush=True)
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    t0 = time.time()
    deadline = t0 + args.budget
    stages = {}
    for stage in args.stages:
        left = deadline - time.time()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", stage, "--config",
               args.config, "--out", str(out), "--deadline", f"{deadline:.0f}", "--link", link,
               "--gpus", str(args.gpus), "--ks", ",".join(map(str, args.ks)),
               "--forms", ",".join(args.forms)] + (["--no-compile"] if args.no_compile else []) \
            + (["--dist-seed"] if args.dist_seed else [])
        print(f"$ {shlex.join(cmd)}", flush=True)
        ts = time.time()
        with open(stage_file(out, stage, "log"), "w") as log:
            # its own process group: on timeout the stage goes together with its ranks
            proc = subprocess.Popen(cmd, env=stage_env(args, stage), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=max(left, 30) + 15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = "timeout"
        tail = stage_file(out, stage, "log").read_text()[-3000:]
        print(tail, flush=True)
        stages[stage] = {"exit": rc, "seconds": round(time.time() - ts, 1)}
        print(f"-- stage {stage}: exit {rc} after {stages[stage]['seconds']}s", flush=True)
    doc = {"created": created, "command": shlex.join([sys.executable, *sys.argv[:1], *argv]),
           "config": args.config, "ks": args.ks, "forms": args.forms, "link": link,
           "timing": TIMING[args.config], "hardware": hw, "stages": stages, "versions": {},
           "baselines": {}, "measurements": [], "total_seconds": round(time.time() - t0, 1)}
    for stage in args.stages:
        path = stage_file(out, stage, "json")
        if path.is_file():
            got = json.loads(path.read_text())
            doc["versions"][stage] = got["versions"]
            doc["baselines"].update({f"{stage}:{k}": v for k, v in got["baselines"].items()})
            doc["measurements"] += got["measurements"]
    (out / "r5.json").write_text(json.dumps(doc, indent=1))
    print(summary_table(doc), flush=True)
    ok = all(v["exit"] == 0 for v in stages.values())
    return 0 if ok else 1


def summary_table(doc: dict) -> str:
    rows = [f"{'framework':9} {'mechanism':15} {'form':4} {'k':>2} {'predicted':>12} {'measured':>12} "
            f"{'eff.':>6} {'all-reduce GB/s':>15}"]
    for m in doc["measurements"]:
        def num(v, fmt="{:,.0f}"):
            return "-" if v is None else fmt.format(v)
        rows.append(f"{m['framework']:9} {m['mechanism']:15} {m['form']:4} {m['k']:>2} "
                    f"{num(m['predicted_tokens_per_s']):>12} "
                    f"{num(m['measured_tokens_per_s']) if m['status'] == 'measured' else m['status']:>12} "
                    f"{num(m['efficiency_vs_linear'], '{:.1%}'):>6} "
                    f"{num(m['bus_bw_measured'] and m['bus_bw_measured'] / 1e9, '{:.1f}'):>15}")
    return "\n".join(rows)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=("smoke", "full"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, from {STAGES}")
    p.add_argument("--forms", default="seed,fast")
    p.add_argument("--ks", default=None, help="GPU counts (default: all visible, and 2 if more)")
    p.add_argument("--link", default=None, help="perfladder.multigpu.costmodel.LINKS name (default: detected)")
    p.add_argument("--budget", type=float, default=3600.0, help="seconds for all stages together")
    p.add_argument("--no-compile", action="store_true", help="torch fast form without torch.compile")
    p.add_argument("--dist-seed", action="store_true", help="also run the seed form under jax.distributed")
    p.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    p.add_argument("--gpus", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.forms = [f for f in args.forms.split(",") if f]
    bad = [f for f in args.forms if f not in ("seed", "fast")]
    if bad:
        p.error(f"--forms {bad} not valid; valid choices: seed, fast")
    args.stages = [s for s in args.stages.split(",") if s]
    if any(s not in STAGES for s in args.stages):
        p.error(f"--stages {args.stages} not valid; valid choices: {STAGES}")
    if args.gpus is None:
        args.gpus = len(hardware()["gpus"])
    if args.ks:
        args.ks = [int(k) for k in args.ks.split(",")]
    else:
        n = max(args.gpus, 2)                       # CPU: 2 ranks / host devices
        args.ks = sorted({n, 2}) if n > 2 else [n]
    if args.gpus and max(args.ks) > args.gpus:
        p.error(f"--ks {args.ks} asks for more than the {args.gpus} visible GPUs")
    if args.stage:
        return run_stage(args)
    return orchestrate(args, argv)


if __name__ == "__main__":
    sys.exit(main())
